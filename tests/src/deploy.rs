//! `deploy/daemonset.yaml` as the tests see it: the objects in order, typed accessors for the ones tests look
//! into, the rights of its two identities, and ways to apply them to the test control plane — as written, or
//! with one verb taken away. The chart rendered with other values ([`render`]) holds the objects the default
//! leaves out (the CNI's value-gated ClusterRoles); [`apply_chart`] applies a render as it is, every object.
//!
//! The manifest's Roles live in the pool namespace, and tests use a namespace each: [`apply_role`] puts a Role and
//! its binding into a test namespace with the rules exactly as written, binding the manifest's ServiceAccounts
//! either where the manifest has them (kube-system, whose names the static test identities [`Identity::Restricted`]
//! and [`Identity::Cni`] authenticate as) or in the test namespace (for real ServiceAccount tokens). The ClusterRole
//! is cluster-wide and one control plane serves a whole test binary: hold the guard [`cluster_rbac`] or
//! [`cluster_rbac_without`] return for as long as the test relies on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, SelfSubjectReview, TokenRequest, TokenRequestSpec, UserInfo,
};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SelfSubjectRulesReview,
    SelfSubjectRulesReviewSpec, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::{GroupVersionKind, Resource};
use kube::discovery::{self, Scope};
use serde::Deserialize as _;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::{Identity, TestCluster, kubeconfig, testenv, wait};

/// The manifest's path relative to the repository root.
pub const MANIFEST: &str = "deploy/daemonset.yaml";

/// The namespace every namespaced object of the manifest lives in (the pool namespace).
pub const NAMESPACE: &str = "kube-system";

/// The controller's ServiceAccount, and the name of its Role, ClusterRole and bindings, and of the DaemonSet.
pub const NAME: &str = "hereabouts";

/// The DaemonSet pod's ServiceAccount (install-cni, the node agent's reads), Role, ClusterRole and bindings.
pub const NODE_ACCOUNT: &str = "hereabouts-node";

/// The controller Deployment.
pub const CONTROLLER_NAME: &str = "hereabouts-controller";

/// The CNI plugin's ServiceAccount, Role and RoleBinding.
pub const CNI_NAME: &str = "hereabouts-cni";

/// The CNI plugin's cluster-wide grant (ClusterRole and ClusterRoleBinding) with the chart's `cni.providerEvents`:
/// creating Events on pods.
pub const CNI_EVENTS_NAME: &str = "hereabouts-cni-events";
/// The CNI plugin's ClusterRole (and binding) with the chart's `cni.rangeChoice`, for ranges chosen per pod or
/// node: get pods, namespaces, nodes.
pub const CNI_RANGES_NAME: &str = "hereabouts-cni-ranges";
/// The chart's values that add the CNI's ClusterRoles.
pub const CNI_EVENTS_VALUE: &str = "cni.providerEvents=true";
pub const CNI_RANGES_VALUE: &str = "cni.rangeChoice=true";
/// The CNI plugin's ClusterRole (and binding) with the chart's `cni.persistentIPs`, for IPAMClaims: get pods and
/// ipamclaims, patch ipamclaims/status.
pub const CNI_CLAIMS_NAME: &str = "hereabouts-cni-ipamclaims";
pub const CNI_CLAIMS_VALUE: &str = "cni.persistentIPs=true";

/// The ValidatingAdmissionPolicy (and binding) confining each node's CNI token to its node's entries.
pub const NODE_POLICY_NAME: &str = "hereabouts-cni-node";
/// The ValidatingAdmissionPolicy (and binding) letting install-cni on a node mint only that node's token.
pub const TOKEN_POLICY_NAME: &str = "hereabouts-cni-token";

/// The reconcilers' leader-election Lease, created by the manifest.
pub const LEASE_NAME: &str = "hereabouts-reconciler";

/// How long the authorizer may take to reflect a changed role or binding.
const RBAC_TIMEOUT: Duration = Duration::from_secs(20);

static CLUSTER_RBAC: RwLock<()> = RwLock::const_new(());

/// The manifest's absolute path.
pub fn path() -> PathBuf {
    testenv::repo_root().join(MANIFEST)
}

/// Every object of the manifest, in order (empty documents skipped).
pub fn manifest() -> Vec<Value> {
    let path = path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    parse(&text).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
}

/// `helm template` of the chart in `deploy/chart` with `set` (`--set-string key=value` each), as objects in order;
/// with no values that is the manifest. Rendered once per set of values.
pub fn render(set: &[&str]) -> Vec<Value> {
    static RENDERS: OnceLock<Mutex<BTreeMap<Vec<String>, Vec<Value>>>> = OnceLock::new();
    let key: Vec<String> = set.iter().map(|s| s.to_string()).collect();
    let renders = RENDERS.get_or_init(Default::default);
    if let Some(objects) = renders.lock().unwrap().get(&key) {
        return objects.clone();
    }
    let chart = testenv::repo_root().join("deploy/chart");
    let mut cmd = std::process::Command::new(testenv::tool("helm"));
    cmd.args(["template", "hereabouts"]).arg(&chart);
    for value in set {
        cmd.args(["--set-string", value]);
    }
    let scratch = std::env::temp_dir();
    let out = cmd
        .env("HELM_CACHE_HOME", scratch.join("hereabouts-helm-cache"))
        .env("HELM_CONFIG_HOME", scratch.join("hereabouts-helm-config"))
        .env("HELM_DATA_HOME", scratch.join("hereabouts-helm-data"))
        .output()
        .expect("run helm template");
    assert!(out.status.success(), "helm template {set:?}: {}", String::from_utf8_lossy(&out.stderr));
    let objects =
        parse(&String::from_utf8_lossy(&out.stdout)).unwrap_or_else(|e| panic!("helm template {set:?}: {e:#}"));
    renders.lock().unwrap().insert(key, objects.clone());
    objects
}

/// The object of type `K` named `name` among `objects` (a render); panics when it is not there exactly once.
pub fn typed_in<K: Resource<DynamicType = ()> + DeserializeOwned>(objects: &[Value], name: &str) -> K {
    let kind = K::kind(&());
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == *kind && o["metadata"]["name"] == name).collect();
    assert_eq!(found.len(), 1, "the render must hold exactly one {kind} {name}");
    serde_json::from_value(found[0].clone()).unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
}

/// The objects of a multi-document YAML text, in order (empty documents skipped).
pub fn parse(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).with_context(|| format!("document {i}"))?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// The manifest's object of `kind` named `name`; panics when there is none or more than one.
pub fn object(kind: &str, name: &str) -> Value {
    let mut found: Vec<Value> =
        manifest().into_iter().filter(|o| o["kind"] == kind && o["metadata"]["name"] == name).collect();
    assert_eq!(found.len(), 1, "{MANIFEST} must hold exactly one {kind} {name}");
    found.pop().unwrap()
}

/// The manifest's object of type `K` named `name`, typed; panics when it is missing or does not parse as `K`.
pub fn typed<K: Resource<DynamicType = ()> + DeserializeOwned>(name: &str) -> K {
    let kind = K::kind(&());
    serde_json::from_value(object(&kind, name)).unwrap_or_else(|e| panic!("{MANIFEST}: {kind} {name}: {e}"))
}

/// ServiceAccount `name`.
pub fn service_account(name: &str) -> ServiceAccount {
    typed(name)
}

/// ClusterRole `hereabouts`, exactly as written.
pub fn cluster_role() -> ClusterRole {
    typed(NAME)
}

/// ClusterRoleBinding `hereabouts`, exactly as written.
pub fn cluster_role_binding() -> ClusterRoleBinding {
    typed(NAME)
}

/// The ClusterRoles the tests apply and take verbs away from: the controller's and the DaemonSet pod's.
pub const CLUSTER_ROLES: [&str; 2] = [NAME, NODE_ACCOUNT];

/// Role `name` (`hereabouts` or `hereabouts-cni`), exactly as written.
pub fn role(name: &str) -> Role {
    typed(name)
}

/// RoleBinding `name`, exactly as written.
pub fn role_binding(name: &str) -> RoleBinding {
    typed(name)
}

/// Lease `hereabouts-reconciler`.
pub fn lease() -> Lease {
    typed(LEASE_NAME)
}

/// ConfigMap `hereabouts-config`.
pub fn config_map() -> ConfigMap {
    typed("hereabouts-config")
}

/// DaemonSet `hereabouts`.
pub fn daemon_set() -> DaemonSet {
    typed(NAME)
}

/// Deployment `hereabouts-controller`.
pub fn controller() -> k8s_openapi::api::apps::v1::Deployment {
    typed(CONTROLLER_NAME)
}

/// The ServiceAccount (and Role) name of one of the manifest's identities: [`Identity::Restricted`] is the
/// controller's, [`Identity::Node`] the DaemonSet pod's, [`Identity::Cni`] the CNI plugin's; panics for the others.
pub fn account_of(id: Identity) -> &'static str {
    match id {
        Identity::Restricted => NAME,
        Identity::Node => NODE_ACCOUNT,
        Identity::Cni => CNI_NAME,
        other => panic!("{other:?} is not an identity of {MANIFEST}"),
    }
}

/// The user name of ServiceAccount `account` of namespace `ns`.
pub fn sa_user(ns: &str, account: &str) -> String {
    format!("system:serviceaccount:{ns}:{account}")
}

/// One right: API group (`""` for core), resource (`serviceaccounts/token` for a subresource), verb, and the one
/// object it is limited to, if any.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Right {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub name: Option<String>,
}

impl std::fmt::Display for Right {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() { "core" } else { &self.group };
        write!(f, "{} {}/{}", self.verb, group, self.resource)?;
        match &self.name {
            Some(name) => write!(f, " {name}"),
            None => Ok(()),
        }
    }
}

/// A [`Right`] on every object of a resource.
pub fn right(group: &str, resource: &str, verb: &str) -> Right {
    Right { group: group.into(), resource: resource.into(), verb: verb.into(), name: None }
}

/// A [`Right`] on the one object `name`.
pub fn named(group: &str, resource: &str, verb: &str, name: &str) -> Right {
    Right { name: Some(name.into()), ..right(group, resource, verb) }
}

/// Every right `rules` grant, spelled out (no wildcard expansion: the manifest has none).
pub fn rights(rules: &[PolicyRule]) -> BTreeSet<Right> {
    let mut out = BTreeSet::new();
    for rule in rules {
        let names: Vec<Option<String>> = match rule.resource_names.as_deref() {
            None | Some([]) => vec![None],
            Some(names) => names.iter().cloned().map(Some).collect(),
        };
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    for name in &names {
                        let r = right(group, resource, verb);
                        out.insert(Right { name: name.clone(), ..r });
                    }
                }
            }
        }
    }
    out
}

/// The rules of Role `role` or of the ClusterRole, as written.
fn rules_of(role: &Role) -> Vec<PolicyRule> {
    role.rules.clone().unwrap_or_default()
}

/// What the manifest grants `id` in the pool namespace (its Role).
pub fn namespaced_rights(id: Identity) -> BTreeSet<Right> {
    rights(&rules_of(&role(account_of(id))))
}

/// What the manifest grants `id` in every namespace: the rules of each ClusterRole a ClusterRoleBinding of the
/// manifest binds to its ServiceAccount.
pub fn cluster_rights(id: Identity) -> BTreeSet<Right> {
    cluster_rights_in(&manifest(), id)
}

/// What the render `objects` grants `id` in every namespace (see [`cluster_rights`]).
pub fn cluster_rights_in(objects: &[Value], id: Identity) -> BTreeSet<Right> {
    let account = account_of(id);
    let mut out = BTreeSet::new();
    for binding in objects.iter().filter(|o| o["kind"] == "ClusterRoleBinding") {
        let binding: ClusterRoleBinding = serde_json::from_value(binding.clone()).expect("a ClusterRoleBinding");
        if binding.subjects.unwrap_or_default().iter().any(|s| s.kind == "ServiceAccount" && s.name == account) {
            let role: ClusterRole = typed_in(objects, &binding.role_ref.name);
            out.extend(rights(&role.rules.unwrap_or_default()));
        }
    }
    out
}

/// `rules` with `verb` taken out of the one rule naming `resource`; panics when that rule does not grant it,
/// so a test cannot silently remove nothing. A rule naming several resources is split, so only `resource` loses it.
pub fn without(rules: &[PolicyRule], resource: &str, verb: &str) -> Vec<PolicyRule> {
    let naming: Vec<usize> =
        (0..rules.len()).filter(|i| rules[*i].resources.iter().flatten().any(|x| x == resource)).collect();
    assert_eq!(naming.len(), 1, "exactly one rule must name {resource}: {rules:?}");
    let position = naming[0];
    let rule = rules[position].clone();
    assert!(rule.verbs.iter().any(|v| v == verb), "the rule naming {resource} does not grant {verb}");
    let mut out = rules.to_vec();
    out.remove(position);
    let others: Vec<String> = rule.resources.iter().flatten().filter(|x| *x != resource).cloned().collect();
    if !others.is_empty() {
        out.insert(position, PolicyRule { resources: Some(others), ..rule.clone() });
    }
    let verbs: Vec<String> = rule.verbs.iter().filter(|v| *v != verb).cloned().collect();
    if !verbs.is_empty() {
        out.insert(position, PolicyRule { resources: Some(vec![resource.to_string()]), verbs, ..rule });
    }
    out
}

/// The manifest's ClusterRole `name` (of [`CLUSTER_ROLES`]) with `verb` taken out of the rule naming `resource`
/// (see [`without`]).
pub fn cluster_role_without(name: &str, resource: &str, verb: &str) -> ClusterRole {
    let mut role: ClusterRole = typed(name);
    role.rules = Some(without(&role.rules.unwrap_or_default(), resource, verb));
    role
}

/// Takes the shared guard of the cluster-wide RBAC and makes sure the manifest's ClusterRole and binding are
/// applied as written (a test that took a verb away may have left its variant). Hold it while relying on them.
pub async fn cluster_rbac(admin: &Client) -> RwLockReadGuard<'static, ()> {
    let guard = CLUSTER_RBAC.read().await;
    apply_cluster_roles(admin).await;
    guard
}

/// Both ClusterRoles of [`CLUSTER_ROLES`] and their bindings, as written.
async fn apply_cluster_roles(admin: &Client) {
    for name in CLUSTER_ROLES {
        apply_cluster_role(admin, typed(name)).await;
    }
}

/// Takes the exclusive guard of the cluster-wide RBAC and applies the manifest's ClusterRole `name` with `verb`
/// taken out of the rule naming `resource` (the other as written). The next [`cluster_rbac`] puts it back.
pub async fn cluster_rbac_without(
    admin: &Client,
    name: &str,
    resource: &str,
    verb: &str,
) -> RwLockWriteGuard<'static, ()> {
    let guard = CLUSTER_RBAC.write().await;
    apply_cluster_roles(admin).await;
    apply_cluster_role(admin, cluster_role_without(name, resource, verb)).await;
    guard
}

/// Creates or replaces `role` (named like one of the manifest's) and the manifest's ClusterRoleBinding of that
/// name, then waits until the identity it binds holds, of the manifest role's rights, exactly those `role` grants.
async fn apply_cluster_role(admin: &Client, role: ClusterRole) {
    let name = role.metadata.name.clone().expect("a named ClusterRole");
    let granted = rights(&role.rules.clone().unwrap_or_default());
    create_or_replace(&Api::<ClusterRole>::all(admin.clone()), role).await.expect("apply the ClusterRole");
    create_or_replace(&Api::<ClusterRoleBinding>::all(admin.clone()), typed::<ClusterRoleBinding>(&name))
        .await
        .expect("apply the ClusterRoleBinding");
    let all = rights(&typed::<ClusterRole>(&name).rules.unwrap_or_default());
    wait_rights(admin, &sa_user(NAMESPACE, &name), None, &all, &granted).await;
}

/// Creates or replaces Role `name` in `ns` with `rules`, and the manifest's RoleBinding `name` there, its
/// ServiceAccount subjects moved to `subjects_ns`; then waits until the authorizer grants those subjects, of the
/// manifest Role's rights, exactly those `rules` do.
pub async fn apply_role(admin: &Client, ns: &str, name: &str, rules: Vec<PolicyRule>, subjects_ns: &str) {
    let granted = rights(&rules);
    let applied = Role { metadata: meta(name, ns), rules: Some(rules) };
    create_or_replace(&Api::<Role>::namespaced(admin.clone(), ns), applied).await.expect("apply the Role");
    let written = role_binding(name);
    let subjects: Vec<Subject> = written
        .subjects
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|s| Subject { namespace: Some(subjects_ns.to_string()), ..s })
        .collect();
    let binding =
        RoleBinding { metadata: meta(name, ns), role_ref: written.role_ref, subjects: Some(subjects.clone()) };
    create_or_replace(&Api::<RoleBinding>::namespaced(admin.clone(), ns), binding)
        .await
        .expect("apply the RoleBinding");
    let all = rights(&rules_of(&role(name)));
    for subject in subjects {
        wait_rights(admin, &sa_user(subjects_ns, &subject.name), Some(ns), &all, &granted).await;
    }
}

/// The three Roles of the manifest, as written, into `ns`, binding the ServiceAccounts of `subjects_ns`.
pub async fn apply_roles(admin: &Client, ns: &str, subjects_ns: &str) {
    for name in [NAME, NODE_ACCOUNT, CNI_NAME] {
        apply_role(admin, ns, name, rules_of(&role(name)), subjects_ns).await;
    }
}

/// The manifest's Lease, created in `ns` (left alone if it exists).
pub async fn create_lease(admin: &Client, ns: &str) {
    let mut lease = lease();
    lease.metadata.namespace = Some(ns.to_string());
    lease.metadata.resource_version = None;
    match Api::<Lease>::namespaced(admin.clone(), ns).create(&PostParams::default(), &lease).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_already_exists() => {}
        Err(e) => panic!("create lease {ns}/{LEASE_NAME}: {e}"),
    }
}

/// Everything the identities need to work in the test namespace `ns`, exactly as the manifest grants it in
/// kube-system: the ClusterRoles (cluster-wide, hence the guard), the Roles bound to the static identities, and the
/// Lease. The CNI runs as [`Identity::Cni`], the reconciler as [`Identity::Restricted`] with `--lease-name`
/// [`LEASE_NAME`].
pub async fn apply_rbac_in(admin: &Client, ns: &str) -> RwLockReadGuard<'static, ()> {
    let guard = cluster_rbac(admin).await;
    apply_roles(admin, ns, NAMESPACE).await;
    create_lease(admin, ns).await;
    guard
}

/// For test binaries that use a namespace per test and do not take rights away: the ClusterRole as written, and
/// each Role's rules, unchanged, granted in every namespace (a ClusterRole `hereabouts-test-<role>` bound to the
/// Role's subjects). The Lease still has to exist in the pool namespace ([`create_lease`]).
pub async fn apply_rbac(admin: Client) {
    drop(cluster_rbac(&admin).await);
    for name in [NAME, NODE_ACCOUNT, CNI_NAME] {
        let rules = rules_of(&role(name));
        let widened = format!("hereabouts-test-{name}");
        let role = ClusterRole { metadata: meta(&widened, ""), rules: Some(rules.clone()), ..Default::default() };
        create_or_replace(&Api::<ClusterRole>::all(admin.clone()), role).await.expect("apply the widened role");
        let binding = ClusterRoleBinding {
            metadata: meta(&widened, ""),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: widened,
            },
            subjects: role_binding(name).subjects,
        };
        create_or_replace(&Api::<ClusterRoleBinding>::all(admin.clone()), binding)
            .await
            .expect("apply the widened binding");
        let granted = rights(&rules);
        wait_rights(&admin, &sa_user(NAMESPACE, name), Some("default"), &granted, &granted).await;
    }
}

fn meta(name: &str, ns: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: (!ns.is_empty()).then(|| ns.to_string()),
        labels: Some([("app.kubernetes.io/name".to_string(), NAME.to_string())].into()),
        ..Default::default()
    }
}

/// Waits until, of `all`, user `user` (a ServiceAccount) is allowed exactly `granted` in `ns`.
async fn wait_rights(admin: &Client, user: &str, ns: Option<&str>, all: &BTreeSet<Right>, granted: &BTreeSet<Right>) {
    let last = std::cell::RefCell::new(String::new());
    let what = format!("the rights of {user} in {} to match", ns.unwrap_or("every namespace"));
    let waited = wait::until(RBAC_TIMEOUT, &what, || {
        let last = &last;
        async move {
            let mut wrong = Vec::new();
            for right in all {
                match allowed(admin, user, ns, right).await {
                    Ok(allowed) if allowed != granted.contains(right) => {
                        wrong.push(format!("{right} is {}", if allowed { "allowed" } else { "denied" }));
                    }
                    Ok(_) => {}
                    Err(e) => wrong.push(format!("{e:#}")),
                }
            }
            let done = wrong.is_empty();
            *last.borrow_mut() = wrong.join(", ");
            done.then_some(())
        }
    })
    .await;
    if let Err(e) = waited {
        panic!("{e} (still wrong: {})", last.borrow());
    }
}

fn attributes(namespace: Option<&str>, right: &Right) -> ResourceAttributes {
    let (resource, subresource) = match right.resource.split_once('/') {
        Some((resource, sub)) => (resource.to_string(), Some(sub.to_string())),
        None => (right.resource.clone(), None),
    };
    ResourceAttributes {
        group: Some(right.group.clone()),
        resource: Some(resource),
        subresource,
        verb: Some(right.verb.clone()),
        name: right.name.clone(),
        namespace: namespace.map(str::to_string),
        ..Default::default()
    }
}

/// Whether ServiceAccount user `user` may do `right` in `namespace` (all namespaces when `None`), as the
/// authorizer answers a SubjectAccessReview made by `admin`.
pub async fn allowed(admin: &Client, user: &str, namespace: Option<&str>, right: &Right) -> anyhow::Result<bool> {
    let sa_ns = user.strip_prefix("system:serviceaccount:").and_then(|r| r.split(':').next()).unwrap_or_default();
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{sa_ns}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(attributes(namespace, right)),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .with_context(|| format!("SubjectAccessReview of {right} for {user}"))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Whether the identity of `client` may do `right` in `namespace` (all namespaces when `None`), as the API
/// server's authorizer answers a SelfSubjectAccessReview.
pub async fn can(client: &Client, namespace: Option<&str>, right: &Right) -> anyhow::Result<bool> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(attributes(namespace, right)),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .with_context(|| format!("SelfSubjectAccessReview of {right}"))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Every right the identity of `client` holds in `namespace`, as the authorizer lists them (a
/// SelfSubjectRulesReview: its RoleBindings there and every ClusterRoleBinding). Resource rules only.
pub async fn rules_review(client: &Client, namespace: &str) -> anyhow::Result<BTreeSet<Right>> {
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec { namespace: Some(namespace.to_string()) },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectRulesReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .with_context(|| format!("SelfSubjectRulesReview in {namespace}"))?;
    let status = answer.status.context("the review has a status")?;
    anyhow::ensure!(!status.incomplete, "the review of {namespace} is incomplete: {:?}", status.evaluation_error);
    let rules: Vec<PolicyRule> = status
        .resource_rules
        .into_iter()
        .map(|r| PolicyRule {
            api_groups: r.api_groups,
            resources: r.resources,
            resource_names: r.resource_names,
            verbs: r.verbs,
            non_resource_urls: None,
        })
        .collect();
    Ok(rights(&rules))
}

/// Creates the manifest's three ServiceAccounts in `ns`: real ones, whose tokens the TokenRequest API issues.
pub async fn create_service_accounts(admin: &Client, ns: &str) {
    for name in [NAME, NODE_ACCOUNT, CNI_NAME] {
        let sa = ServiceAccount { metadata: meta(name, ns), ..Default::default() };
        Api::<ServiceAccount>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &sa)
            .await
            .unwrap_or_else(|e| panic!("create serviceaccount {ns}/{name}: {e}"));
    }
}

/// A token of ServiceAccount `account` of `ns`, valid for an hour, bound to `pod` when given (as the kubelet
/// projects a pod's token).
pub async fn token_for(admin: &Client, ns: &str, account: &str, pod: Option<&Pod>) -> String {
    let bound = pod.map(|p| BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: p.metadata.name.clone(),
        uid: p.metadata.uid.clone(),
    });
    let spec = TokenRequestSpec { expiration_seconds: Some(3600), bound_object_ref: bound, ..Default::default() };
    let request = TokenRequest { spec: Some(spec), ..Default::default() };
    let answer = Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {ns}/{account}: {e}"));
    answer.status.and_then(|s| s.token).expect("a token in the answer")
}

/// Who the test API server takes `token` for (a SelfSubjectReview made with it).
pub async fn whoami(token: &str) -> Result<UserInfo, kube::Error> {
    let cluster = TestCluster::get();
    let text = kubeconfig::render(cluster.server(), cluster.ca_pem(), "whoever", token, "default");
    let kc = kube::config::Kubeconfig::from_yaml(&text).expect("a kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("a client config");
    config.default_retry = false;
    let client = Client::try_from(config)?;
    let review =
        Api::<SelfSubjectReview>::all(client).create(&PostParams::default(), &SelfSubjectReview::default()).await?;
    Ok(review.status.and_then(|s| s.user_info).unwrap_or_default())
}

/// The claims of a JWT (its middle part; the signature is the API server's business).
pub fn claims(token: &str) -> Value {
    let part = token.split('.').nth(1).expect("a JWT has three parts");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part.trim_end_matches('=')).expect("base64url");
    serde_json::from_slice(&bytes).expect("JSON claims")
}

/// Takes the exclusive guard of the cluster-wide RBAC (for a test that grants the CNI cluster-wide rights the
/// default leaves out) and applies the manifest's ClusterRole as written.
pub async fn cluster_rbac_exclusive(admin: &Client) -> RwLockWriteGuard<'static, ()> {
    let guard = CLUSTER_RBAC.write().await;
    apply_cluster_roles(admin).await;
    guard
}

/// Applies every object of `objects` (a render of the chart) to the control plane as it is, with server-side
/// apply, in the render's order, and deletes the chart's ClusterRoles and ClusterRoleBindings that the render does
/// not hold (those of values another render turned on). Hold a guard of the cluster-wide RBAC meanwhile: the
/// shared one ([`cluster_rbac`]) for the default render, the exclusive one for another.
pub async fn apply_chart(admin: &Client, objects: &[Value]) {
    let params = PatchParams::apply("hereabouts-tests").force();
    for object in objects {
        let (api, name) = dynamic_api(admin, object).await;
        api.patch(&name, &params, &Patch::Apply(object))
            .await
            .unwrap_or_else(|e| panic!("apply {} {name}: {e}", object["kind"]));
    }
    let kept: BTreeSet<(String, String)> = objects
        .iter()
        .map(|o| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (text(&o["kind"]), text(&o["metadata"]["name"]))
        })
        .collect();
    let ours = ListParams::default().labels(&format!("app.kubernetes.io/name={NAME}"));
    let roles = Api::<ClusterRole>::all(admin.clone());
    for role in roles.list(&ours).await.expect("list ClusterRoles").items {
        let name = role.metadata.name.unwrap_or_default();
        if !kept.contains(&("ClusterRole".to_string(), name.clone())) {
            let _ = roles.delete(&name, &DeleteParams::default()).await;
        }
    }
    let bindings = Api::<ClusterRoleBinding>::all(admin.clone());
    for binding in bindings.list(&ours).await.expect("list ClusterRoleBindings").items {
        let name = binding.metadata.name.unwrap_or_default();
        if !kept.contains(&("ClusterRoleBinding".to_string(), name.clone())) {
            let _ = bindings.delete(&name, &DeleteParams::default()).await;
        }
    }
}

/// The API of `object`'s kind (namespaced in its namespace, or cluster-wide) and its name.
async fn dynamic_api(admin: &Client, object: &Value) -> (Api<DynamicObject>, String) {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().expect("kind");
    let name = object["metadata"]["name"].as_str().expect("metadata.name").to_string();
    let (resource, caps) = discovery::pinned_kind(admin, &GroupVersionKind::gvk(group, version, kind))
        .await
        .unwrap_or_else(|e| panic!("the API server does not serve {api_version} {kind}: {e}"));
    let api = match caps.scope {
        Scope::Namespaced => {
            let ns = object["metadata"]["namespace"].as_str().expect("a namespaced object names its namespace");
            Api::namespaced_with(admin.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(admin.clone(), &resource),
    };
    (api, name)
}

/// Creates `object`, or replaces it at the version read when it exists and differs.
pub(crate) async fn create_or_replace<K>(api: &Api<K>, mut object: K) -> anyhow::Result<()>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().context("the object has a name")?;
    for _ in 0..5 {
        let result = match api.get_opt(&name).await.with_context(|| format!("get {name}"))? {
            None => api.create(&PostParams::default(), &object).await.map(drop),
            Some(current) => {
                object.meta_mut().resource_version = current.meta().resource_version.clone();
                let (mut a, mut b) = (serde_json::to_value(&current)?, serde_json::to_value(&object)?);
                for v in [&mut a, &mut b] {
                    v.as_object_mut().map(|o| o.remove("metadata"));
                }
                if a == b {
                    return Ok(());
                }
                api.replace(&name, &PostParams::default(), &object).await.map(drop)
            }
        };
        match result {
            Ok(()) => return Ok(()),
            // two tests applying at once: read again
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => continue,
            Err(e) => return Err(e).with_context(|| format!("apply {name}")),
        }
    }
    anyhow::bail!("apply {name}: conflicts on every try")
}
