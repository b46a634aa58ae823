//! `deploy/daemonset.yaml` as the tests see it: the objects in order, typed accessors for the ones tests look
//! into, and [`apply_rbac`] / [`apply_rbac_without`], which bind the manifest's ClusterRole (or that role with one
//! verb taken away) to [`Identity::Restricted`] — the identity a ServiceAccount `hereabouts` in `kube-system`
//! authenticates as — and wait until the API server's authorizer agrees.
//!
//! The ClusterRole and its binding are cluster-wide and one control plane serves a whole test binary, so every
//! test that applies RBAC must hold [`rbac_lock`] from before it applies until it has finished relying on it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::core::Resource;
use serde::Deserialize as _;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{Mutex, MutexGuard};

use crate::{Identity, TestCluster, testenv, wait};

/// The manifest's path relative to the repository root.
pub const MANIFEST: &str = "deploy/daemonset.yaml";

/// The namespace every namespaced object of the manifest lives in.
pub const NAMESPACE: &str = "kube-system";

/// The name of the ServiceAccount, ClusterRole, ClusterRoleBinding and DaemonSet.
pub const NAME: &str = "hereabouts";

/// How long the authorizer may take to reflect a changed ClusterRole or binding.
const RBAC_TIMEOUT: Duration = Duration::from_secs(20);

static RBAC_LOCK: Mutex<()> = Mutex::const_new(());

/// Serialises the tests of one test binary that change the cluster-wide RBAC of [`Identity::Restricted`]: hold
/// the guard for as long as the test relies on what it applied.
pub async fn rbac_lock() -> MutexGuard<'static, ()> {
    RBAC_LOCK.lock().await
}

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

/// ServiceAccount `hereabouts`.
pub fn service_account() -> ServiceAccount {
    typed(NAME)
}

/// ClusterRole `hereabouts`, exactly as written.
pub fn cluster_role() -> ClusterRole {
    typed(NAME)
}

/// ClusterRoleBinding `hereabouts`, exactly as written.
pub fn cluster_role_binding() -> ClusterRoleBinding {
    typed(NAME)
}

/// ConfigMap `hereabouts-config`.
pub fn config_map() -> ConfigMap {
    typed("hereabouts-config")
}

/// DaemonSet `hereabouts`.
pub fn daemon_set() -> DaemonSet {
    typed(NAME)
}

/// One right: API group (`""` for core), resource, verb.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Right {
    pub group: String,
    pub resource: String,
    pub verb: String,
}

impl std::fmt::Display for Right {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() { "core" } else { &self.group };
        write!(f, "{} {}/{}", self.verb, group, self.resource)
    }
}

/// Every (group, resource, verb) that `role` grants, spelled out (no wildcard expansion: the manifest has none).
pub fn rights(role: &ClusterRole) -> BTreeSet<Right> {
    let mut out = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.insert(Right { group: group.clone(), resource: resource.clone(), verb: verb.clone() });
                }
            }
        }
    }
    out
}

/// The rule of `role` naming `resource`; panics unless exactly one does.
pub fn rule_for<'a>(role: &'a ClusterRole, resource: &str) -> &'a PolicyRule {
    let rules: Vec<&PolicyRule> =
        role.rules.iter().flatten().filter(|r| r.resources.iter().flatten().any(|x| x == resource)).collect();
    assert_eq!(rules.len(), 1, "exactly one rule of ClusterRole {NAME} must name {resource}");
    rules[0]
}

/// The manifest's ClusterRole with `verb` taken out of the rule naming `resource` (e.g. `ippools`, `pods`,
/// `leases`, `events`); panics when that rule does not grant `verb`, so a test cannot silently remove nothing.
pub fn cluster_role_without(resource: &str, verb: &str) -> ClusterRole {
    let mut role = cluster_role();
    let rule = rule_for(&role, resource).clone();
    assert!(rule.verbs.iter().any(|v| v == verb), "ClusterRole {NAME} does not grant {verb} on {resource}");
    let rules = role.rules.get_or_insert_default();
    // a rule naming several resources is split, so only `resource` loses the verb
    let position = rules.iter().position(|r| *r == rule).unwrap();
    rules.remove(position);
    let others: Vec<String> = rule.resources.iter().flatten().filter(|x| *x != resource).cloned().collect();
    if !others.is_empty() {
        rules.insert(position, PolicyRule { resources: Some(others), ..rule.clone() });
    }
    let verbs: Vec<String> = rule.verbs.iter().filter(|v| *v != verb).cloned().collect();
    if !verbs.is_empty() {
        rules.insert(position, PolicyRule { resources: Some(vec![resource.to_string()]), verbs, ..rule });
    }
    role
}

/// Creates (or replaces) the manifest's ClusterRole and ClusterRoleBinding exactly as written, and waits until
/// the restricted identity holds every right of the role. Hold [`rbac_lock`].
pub async fn apply_rbac(admin: Client) {
    apply_cluster_role(admin, cluster_role()).await;
}

/// Like [`apply_rbac`], with `verb` taken out of the rule naming `resource` (see [`cluster_role_without`]); waits
/// until the restricted identity has every other right of the manifest's role and not that one. Hold
/// [`rbac_lock`], and apply what the next test needs before relying on it (a failed test leaves its variant).
pub async fn apply_rbac_without(admin: Client, resource: &str, verb: &str) {
    apply_cluster_role(admin, cluster_role_without(resource, verb)).await;
}

/// Creates or replaces `role` (named like the manifest's) and the manifest's ClusterRoleBinding, then waits
/// until, of the rights of the manifest's role, the restricted identity holds exactly those `role` grants.
pub async fn apply_cluster_role(admin: Client, role: ClusterRole) {
    let granted = rights(&role);
    create_or_replace(&Api::<ClusterRole>::all(admin.clone()), role).await.expect("apply the ClusterRole");
    create_or_replace(&Api::<ClusterRoleBinding>::all(admin), cluster_role_binding())
        .await
        .expect("apply the ClusterRoleBinding");
    let client = TestCluster::get().client(Identity::Restricted).await;
    let all = rights(&cluster_role());
    let last = std::cell::RefCell::new(String::new());
    let waited = wait::until(RBAC_TIMEOUT, "the restricted identity's rights to match the ClusterRole", || {
        let (client, all, granted, last) = (&client, &all, &granted, &last);
        async move {
            let mut wrong = Vec::new();
            for right in all {
                match can(client, None, right).await {
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

/// Whether the identity of `client` may do `right` in `namespace` (all namespaces when `None`), as the API
/// server's authorizer answers a SelfSubjectAccessReview.
pub async fn can(client: &Client, namespace: Option<&str>, right: &Right) -> anyhow::Result<bool> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(right.group.clone()),
                resource: Some(right.resource.clone()),
                verb: Some(right.verb.clone()),
                namespace: namespace.map(str::to_string),
                ..Default::default()
            }),
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

/// A [`Right`] from its parts.
pub fn right(group: &str, resource: &str, verb: &str) -> Right {
    Right { group: group.into(), resource: resource.into(), verb: verb.into() }
}

async fn create_or_replace<K>(api: &Api<K>, mut object: K) -> anyhow::Result<()>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().context("the object has a name")?;
    match api.get_opt(&name).await.with_context(|| format!("get {name}"))? {
        None => api.create(&PostParams::default(), &object).await.map(drop).with_context(|| format!("create {name}")),
        Some(current) => {
            object.meta_mut().resource_version = current.meta().resource_version.clone();
            api.replace(&name, &PostParams::default(), &object)
                .await
                .map(drop)
                .with_context(|| format!("replace {name}"))
        }
    }
}
