//! `deploy/daemonset.yaml` against the real API server: every object passes a server-side dry run, the manifest
//! keeps the shape the binaries rely on, each identity is granted exactly its list of rights, and the CNI plugin
//! works with the manifest's Role `hereabouts-cni` and nothing more, while each of that Role's verbs is needed by
//! the step that uses it (the table `cni_verbs!` below). The reconciler's identity is the subject of
//! the `identities` module.
//!
//! The CNI's Role is applied into each test's own namespace, so these tests need no lock.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use hereabouts_ipam::crd::{IpPool, NodeSlicePool, OverlappingRangeIpReservation};
use hereabouts_tests::deploy::{self, Right, named, right};
use hereabouts_tests::plugin::{Invocation, Output, netconf, workspace_bin};
use hereabouts_tests::{Identity, TestCluster, rbac, wait};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Container, ServiceAccount};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------------------------
// The manifest as objects

#[tokio::test]
async fn every_object_passes_a_server_side_dry_run() {
    let cluster = TestCluster::get();
    let admin = cluster.admin().await;
    for object in deploy::manifest() {
        let (group, version) = match object["apiVersion"].as_str().expect("apiVersion").split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", object["apiVersion"].as_str().unwrap()),
        };
        let kind = object["kind"].as_str().expect("kind");
        let name = object["metadata"]["name"].as_str().expect("metadata.name").to_string();
        let what = format!("{kind} {name}");
        let (resource, caps) = discovery::pinned_kind(&admin, &GroupVersionKind::gvk(group, version, kind))
            .await
            .unwrap_or_else(|e| panic!("{what}: the API server does not serve {group}/{version} {kind}: {e}"));
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = object["metadata"]["namespace"].as_str();
                assert_eq!(ns, Some(deploy::NAMESPACE), "{what} names its namespace, kube-system");
                Api::namespaced_with(admin.clone(), deploy::NAMESPACE, &resource)
            }
            Scope::Cluster => {
                assert!(object["metadata"].get("namespace").is_none(), "{what} is cluster-scoped: no namespace");
                Api::all_with(admin.clone(), &resource)
            }
        };
        let mut dynamic: DynamicObject = serde_json::from_value(object.clone()).unwrap();
        let dry_run = PostParams { dry_run: true, ..Default::default() };
        match api.create(&dry_run, &dynamic).await {
            Ok(_) => {}
            // a test that applied the ClusterRole for real was here first: a dry-run update validates it as well
            Err(kube::Error::Api(status)) if status.is_already_exists() => {
                let current = api.get(&name).await.unwrap_or_else(|e| panic!("{what}: get: {e}"));
                dynamic.metadata.resource_version = current.metadata.resource_version;
                api.replace(&name, &dry_run, &dynamic)
                    .await
                    .unwrap_or_else(|e| panic!("{what} is refused by a dry-run replace: {e}"));
            }
            Err(e) => panic!("{what} is refused by a dry-run create: {e}"),
        }
    }
    // a dry run persists nothing (no test on this control plane creates these in kube-system: `identities`,
    // which does, has a control plane of its own)
    let ns = deploy::NAMESPACE;
    assert!(Api::<ConfigMap>::namespaced(admin.clone(), ns).get_opt("hereabouts-config").await.unwrap().is_none());
    assert!(Api::<ServiceAccount>::namespaced(admin.clone(), ns).get_opt(deploy::NAME).await.unwrap().is_none());
    assert!(Api::<Lease>::namespaced(admin, ns).get_opt(deploy::LEASE_NAME).await.unwrap().is_none());
}

#[test]
fn objects_come_in_order_in_kube_system() {
    let kinds: Vec<(String, String)> = deploy::manifest()
        .iter()
        .map(|o| (o["kind"].as_str().unwrap().to_string(), o["metadata"]["name"].as_str().unwrap().to_string()))
        .collect();
    // helm's install order (the manifest is the chart's render): accounts and settings, rights, then workloads
    let expected = [
        ("ServiceAccount", "hereabouts"),
        ("ServiceAccount", "hereabouts-node"),
        ("ServiceAccount", "hereabouts-cni"),
        ("ConfigMap", "hereabouts-config"),
        ("ClusterRole", "hereabouts"),
        ("ClusterRole", "hereabouts-node"),
        ("ClusterRoleBinding", "hereabouts"),
        ("ClusterRoleBinding", "hereabouts-node"),
        ("Role", "hereabouts-cni"),
        ("Role", "hereabouts"),
        ("Role", "hereabouts-node"),
        ("RoleBinding", "hereabouts-cni"),
        ("RoleBinding", "hereabouts"),
        ("RoleBinding", "hereabouts-node"),
        ("DaemonSet", "hereabouts"),
        ("Deployment", "hereabouts-controller"),
        ("Lease", "hereabouts-reconciler"),
        ("ValidatingAdmissionPolicy", deploy::NODE_POLICY_NAME),
        ("ValidatingAdmissionPolicy", deploy::TOKEN_POLICY_NAME),
        ("ValidatingAdmissionPolicyBinding", deploy::NODE_POLICY_NAME),
        ("ValidatingAdmissionPolicyBinding", deploy::TOKEN_POLICY_NAME),
    ]
    .map(|(k, n)| (k.to_string(), n.to_string()));
    assert_eq!(kinds, expected, "{} holds these objects, in this order (no Namespace)", deploy::MANIFEST);

    // each binding names its own role and its own ServiceAccount, and nothing else
    let subject = |s: &k8s_openapi::api::rbac::v1::Subject| (s.kind.clone(), s.name.clone(), s.namespace.clone());
    let sa = |name: &str| ("ServiceAccount".to_string(), name.to_string(), Some(deploy::NAMESPACE.to_string()));
    for name in deploy::CLUSTER_ROLES {
        let crb: k8s_openapi::api::rbac::v1::ClusterRoleBinding = deploy::typed(name);
        assert_eq!((crb.role_ref.kind.as_str(), crb.role_ref.name.as_str()), ("ClusterRole", name));
        assert_eq!(crb.subjects.iter().flatten().map(subject).collect::<Vec<_>>(), [sa(name)]);
    }
    // the CNI's ClusterRoles come only with their values, each bound to the CNI's ServiceAccount alone
    for (name, value) in [
        (deploy::CNI_EVENTS_NAME, deploy::CNI_EVENTS_VALUE),
        (deploy::CNI_RANGES_NAME, deploy::CNI_RANGES_VALUE),
        (deploy::CNI_CLAIMS_NAME, deploy::CNI_CLAIMS_VALUE),
    ] {
        let render = deploy::render(&[value]);
        let binding = deploy::typed_in::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(&render, name);
        assert_eq!((binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()), ("ClusterRole", name));
        assert_eq!(binding.subjects.iter().flatten().map(subject).collect::<Vec<_>>(), [sa(deploy::CNI_NAME)]);
        assert_eq!(render.len(), deploy::manifest().len() + 2, "{value} adds a ClusterRole and its binding");
    }
    assert_eq!(deploy::CNI_RANGES_NAME, hereabouts_ipam::claim::RANGES_CLUSTER_ROLE, "the name errors give");
    assert_eq!(deploy::CNI_RANGES_VALUE, hereabouts_ipam::claim::RANGES_VALUE, "the value errors give");
    assert_eq!(deploy::CNI_CLAIMS_NAME, hereabouts_ipam::claim::IPAMCLAIMS_CLUSTER_ROLE, "the name errors give");
    assert_eq!(deploy::CNI_CLAIMS_VALUE, hereabouts_ipam::claim::IPAMCLAIMS_VALUE, "the value errors give");
    let rules = hereabouts_tests::rbac::cni_ranges_rules();
    assert_eq!(rules.len(), 1, "one rule");
    assert_eq!(
        (rules[0].api_groups.clone(), rules[0].resources.clone(), rules[0].verbs.clone(), &rules[0].resource_names),
        (
            Some(vec![String::new()]),
            Some(["pods", "namespaces", "nodes"].map(String::from).to_vec()),
            vec!["get".to_string()],
            &None
        ),
        "ranges chosen per pod or node: get the one pod, namespace and node, nothing more"
    );
    let rules = hereabouts_tests::rbac::cni_event_rules();
    assert_eq!(rules.len(), 1, "one rule");
    assert_eq!(
        (rules[0].api_groups.clone(), rules[0].resources.clone(), rules[0].verbs.clone()),
        (Some(vec![String::new()]), Some(vec!["events".to_string()]), vec!["create".to_string()]),
        "provider mode's Warning Event: create core Events"
    );
    for name in [deploy::NAME, deploy::NODE_ACCOUNT, deploy::CNI_NAME] {
        let rb = deploy::role_binding(name);
        assert_eq!((rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()), ("Role", name));
        assert_eq!(rb.subjects.iter().flatten().map(subject).collect::<Vec<_>>(), [sa(name)]);
    }
    // the identities the tests run the binaries as are these ServiceAccounts
    for id in [Identity::Restricted, Identity::Node, Identity::Cni] {
        assert_eq!(id.user(), deploy::sa_user(deploy::NAMESPACE, deploy::account_of(id)));
    }
    assert_ne!(deploy::service_account(deploy::NAME).automount_service_account_token, Some(false));
    assert_ne!(deploy::service_account(deploy::NODE_ACCOUNT).automount_service_account_token, Some(false));
    // each workload runs as its own account: the controller's token is never on every node
    let ds = deploy::daemon_set().spec.template.spec.unwrap();
    assert_eq!(ds.service_account_name.as_deref(), Some(deploy::NODE_ACCOUNT));
    let controller = deploy::controller().spec.template.spec.unwrap();
    assert_eq!(controller.service_account_name.as_deref(), Some(deploy::NAME));
    assert_eq!(
        deploy::service_account(deploy::CNI_NAME).automount_service_account_token,
        Some(false),
        "no pod runs as the CNI's ServiceAccount"
    );
    let lease = deploy::lease();
    assert_eq!(lease.metadata.namespace.as_deref(), Some(deploy::NAMESPACE));
    assert!(lease.spec.is_none_or(|s| s.holder_identity.is_none()), "the holder is the reconcilers' to write");
}

/// The policies that confine each host's token fail closed, match the CNI's token and account by name, cover every
/// write of the three resources, and are bound to deny; the node policy for every namespace.
#[test]
fn the_node_policies_match_the_cni_and_deny() {
    let node = deploy::object("ValidatingAdmissionPolicy", deploy::NODE_POLICY_NAME);
    assert_eq!(node["spec"]["failurePolicy"], "Fail");
    let user = deploy::sa_user(deploy::NAMESPACE, deploy::CNI_NAME);
    let conditions = node["spec"]["matchConditions"].to_string();
    assert!(conditions.contains(&format!("request.userInfo.username == '{user}'")), "{conditions}");
    let rules = &node["spec"]["matchConstraints"]["resourceRules"];
    assert_eq!(rules.as_array().unwrap().len(), 1, "{rules}");
    assert_eq!(rules[0]["operations"], json!(["CREATE", "UPDATE", "DELETE"]));
    assert_eq!(rules[0]["resources"], json!(["ippools", "overlappingrangeipreservations", "nodeslicepools"]));
    let token = deploy::object("ValidatingAdmissionPolicy", deploy::TOKEN_POLICY_NAME);
    assert_eq!(token["spec"]["failurePolicy"], "Fail");
    let conditions = token["spec"]["matchConditions"].to_string();
    assert!(conditions.contains(&format!("request.name == '{}'", deploy::CNI_NAME)), "{conditions}");
    assert_eq!(token["spec"]["matchConstraints"]["resourceRules"][0]["resources"], json!(["serviceaccounts/token"]));
    for name in [deploy::NODE_POLICY_NAME, deploy::TOKEN_POLICY_NAME] {
        let binding = deploy::object("ValidatingAdmissionPolicyBinding", name);
        assert_eq!(binding["spec"]["policyName"], name);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert!(binding["spec"].get("matchResources").is_none(), "{name}: every namespace");
    }
}

/// The verbs `(group, resource, verbs)` as [`Right`]s, limited to `name` when given.
fn grants(list: &[(&str, &str, &[&str], Option<&str>)]) -> BTreeSet<Right> {
    let mut out = BTreeSet::new();
    for (group, resource, verbs, name) in list {
        for verb in *verbs {
            out.insert(match name {
                Some(name) => named(group, resource, verb, name),
                None => right(group, resource, verb),
            });
        }
    }
    out
}

fn assert_same(what: &str, granted: &BTreeSet<Right>, expected: &BTreeSet<Right>) {
    let missing: Vec<&Right> = expected.difference(granted).collect();
    let extra: Vec<&Right> = granted.difference(expected).collect();
    assert!(missing.is_empty() && extra.is_empty(), "{what}: missing {missing:?}, extra {extra:?}");
}

#[test]
fn each_identity_is_granted_exactly_its_list() {
    const W: &str = "whereabouts.cni.cncf.io";
    let cni = grants(&[
        (W, "ippools", &["get", "list", "watch", "create", "patch"], None),
        (W, "overlappingrangeipreservations", &["get", "list", "create", "patch", "delete"], None),
        (W, "nodeslicepools", &["get", "list", "watch", "create", "patch"], None),
    ]);
    assert_same("CNI, pool namespace", &deploy::namespaced_rights(Identity::Cni), &cni);
    assert_same("CNI, cluster-wide", &deploy::cluster_rights(Identity::Cni), &BTreeSet::new());
    // what a host may do beyond its namespace comes only with a value of the chart
    let everything = deploy::render(&[deploy::CNI_EVENTS_VALUE, deploy::CNI_RANGES_VALUE]);
    let values = grants(&[
        ("", "events", &["create"], None),
        ("", "pods", &["get"], None),
        ("", "namespaces", &["get"], None),
        ("", "nodes", &["get"], None),
    ]);
    assert_same("CNI, cluster-wide, with both values", &deploy::cluster_rights_in(&everything, Identity::Cni), &values);

    let reconciler = grants(&[
        (W, "ippools", &["get", "list", "watch", "patch", "delete"], None),
        (W, "overlappingrangeipreservations", &["get", "list", "watch", "create", "delete"], None),
        (W, "nodeslicepools", &["list", "watch", "patch"], None),
        ("coordination.k8s.io", "leases", &["get", "update"], Some(deploy::LEASE_NAME)),
    ]);
    assert_same("reconciler, pool namespace", &deploy::namespaced_rights(Identity::Restricted), &reconciler);
    let cluster = grants(&[
        ("", "pods", &["get", "list", "watch"], None),
        ("", "nodes", &["get", "list", "watch"], None),
        ("apiextensions.k8s.io", "customresourcedefinitions", &["get"], Some("ippools.whereabouts.cni.cncf.io")),
        (
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            &["get"],
            Some("overlappingrangeipreservations.whereabouts.cni.cncf.io"),
        ),
        ("apiextensions.k8s.io", "customresourcedefinitions", &["get"], Some("nodeslicepools.whereabouts.cni.cncf.io")),
        ("apps", "statefulsets", &["get"], None),
        ("k8s.cni.cncf.io", "ipamclaims", &["get"], None),
        // kube-runtime 5's events::Recorder creates and patches events.k8s.io/v1 Events only
        ("events.k8s.io", "events", &["create", "patch"], None),
    ]);
    assert_same("reconciler, cluster-wide", &deploy::cluster_rights(Identity::Restricted), &cluster);

    // the DaemonSet pod on every node: mint its node's CNI token; read, never write
    let node = grants(&[("", "serviceaccounts/token", &["create"], Some(deploy::CNI_NAME))]);
    assert_same("node, pool namespace", &deploy::namespaced_rights(Identity::Node), &node);
    let node_cluster = grants(&[
        // the node agent, before a warm reserve and every minute after: does Whereabouts' reconciler run (a
        // DaemonSet, a Deployment or a CronJob)? And does its Node still exist?
        ("apps", "daemonsets", &["list"], None),
        ("apps", "deployments", &["list"], None),
        ("batch", "cronjobs", &["list"], None),
        ("", "nodes", &["get"], None),
        // the node agent: claim its node's slice as a network's NAD appears
        ("k8s.cni.cncf.io", "network-attachment-definitions", &["list", "watch"], None),
    ]);
    assert_same("node, cluster-wide", &deploy::cluster_rights(Identity::Node), &node_cluster);

    let roles = [
        deploy::role(deploy::NAME).rules,
        deploy::role(deploy::NODE_ACCOUNT).rules,
        deploy::role(deploy::CNI_NAME).rules,
    ];
    let cluster_roles: Vec<k8s_openapi::api::rbac::v1::ClusterRole> =
        deploy::CLUSTER_ROLES.iter().map(|n| deploy::typed(n)).collect();
    let cluster_rules = cluster_roles.iter().flat_map(|r| r.rules.iter().flatten());
    for rule in roles.iter().flatten().flatten().chain(cluster_rules) {
        assert!(rule.non_resource_urls.is_none(), "{rule:?}");
        let words = rule.api_groups.iter().chain(rule.resources.iter()).flatten().chain(&rule.verbs);
        assert!(words.clone().all(|w| w != "*"), "no wildcards: {rule:?}");
        // RBAC ignores resourceNames for create (but for subresources) and for list/watch: no rule may rely on it
        if rule.resource_names.is_some() {
            let subresource = rule.resources.iter().flatten().all(|r| r.contains('/'));
            assert!(rule.verbs.iter().all(|v| v != "list" && v != "watch" && (v != "create" || subresource)));
        }
    }
    assert!(cluster_roles.iter().all(|r| r.aggregation_rule.is_none()));
    // what the other integration tests grant the CNI plugin is the manifest's Role, as written
    assert_eq!(rbac::cni_rules(), deploy::role(deploy::CNI_NAME).rules.unwrap());
}

#[test]
fn the_names_the_rules_are_limited_to_are_the_ones_the_binaries_use() {
    let help = |sub: &str| {
        let out = std::process::Command::new(workspace_bin("hereabouts-reconciler")).args([sub, "--help"]).output();
        String::from_utf8(out.unwrap().stdout).unwrap()
    };
    let run = help("run");
    assert!(run.contains(&format!("[default: {}]", deploy::LEASE_NAME)), "--lease-name default:\n{run}");
    let install = help("install-cni");
    assert!(install.contains(&format!("[default: {}]", deploy::CNI_NAME)), "--cni-service-account:\n{install}");
    let ds = deploy::daemon_set().spec.template.spec.unwrap();
    let init = ds.init_containers.unwrap_or_default();
    let args = command_line(container(&init, "install-cni"));
    assert_eq!(flag(&args, "--cni-service-account").as_deref(), Some(deploy::CNI_NAME));
    let controller = deploy::controller().spec.template.spec.unwrap();
    let reconciler = command_line(container(&controller.containers, "reconciler"));
    assert!(flag(&reconciler, "--lease-name").is_none_or(|l| l == deploy::LEASE_NAME));
}

fn container<'a>(containers: &'a [Container], name: &str) -> &'a Container {
    containers.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no container {name}"))
}

/// The value of `--flag=value` or `--flag value` in `args`.
fn flag(args: &[String], name: &str) -> Option<String> {
    let eq = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(&eq).map(str::to_string).or_else(|| (a == name).then(|| args.get(i + 1).cloned()).flatten())
    })
}

fn command_line(c: &Container) -> Vec<String> {
    c.command.iter().flatten().chain(c.args.iter().flatten()).cloned().collect()
}

#[test]
fn daemon_set_keeps_the_shape_the_binaries_rely_on() {
    let ds = deploy::daemon_set();
    let spec = ds.spec;
    let template_meta = spec.template.metadata.clone().unwrap_or_default();
    let labels = template_meta.labels.unwrap_or_default();
    for (k, v) in spec.selector.match_labels.iter().flatten() {
        assert_eq!(labels.get(k), Some(v), "the selector matches the pod template");
    }
    let annotations = template_meta.annotations.unwrap_or_default();
    assert!(!annotations.keys().any(|k| k.starts_with("prometheus.io/")), "no scrape of a loopback port");
    let strategy = spec.update_strategy.expect("updateStrategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.expect("rollingUpdate");
    assert_eq!(rolling.max_unavailable, Some(IntOrString::String("10%".into())));
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(0)), "two pods of a node would both write its CNI files");

    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some(deploy::NODE_ACCOUNT));
    assert_ne!(pod.automount_service_account_token, Some(false), "install-cni authenticates with the pod's token");
    assert_eq!(pod.host_network, Some(false), "neither container needs the host's network");
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    let tolerations = pod.tolerations.unwrap_or_default();
    assert!(
        tolerations.iter().any(|t| t.operator.as_deref() == Some("Exists")
            && t.key.is_none()
            && t.effect.is_none()
            && t.toleration_seconds.is_none()),
        "tolerates every taint: {tolerations:?}"
    );

    let volumes = pod.volumes.unwrap_or_default();
    let host_path = |name: &str| {
        let v = volumes.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no volume {name}"));
        let hp = v.host_path.clone().unwrap_or_else(|| panic!("volume {name} is a hostPath"));
        (hp.path, hp.type_)
    };
    let mount_of = |c: &Container, path: &str| {
        let mounts = c.volume_mounts.clone().unwrap_or_default();
        mounts
            .into_iter()
            .find(|m| m.mount_path == path)
            .unwrap_or_else(|| panic!("{} mounts nothing at {path}", c.name))
    };

    // install-cni: a native sidecar writing the host's CNI directories
    let init = pod.init_containers.unwrap_or_default();
    let install = container(&init, "install-cni");
    assert_eq!(install.restart_policy.as_deref(), Some("Always"), "install-cni is a native sidecar");
    let args = command_line(install);
    assert_eq!(&args[..2], ["hereabouts-reconciler", "install-cni"]);
    for (flag_name, mount_path, host) in [
        ("--cni-bin-dir", "/host/opt/cni/bin", "/opt/cni/bin"),
        ("--cni-conf-dir", "/host/etc/cni/net.d", "/etc/cni/net.d"),
    ] {
        assert_eq!(flag(&args, flag_name).as_deref(), Some(mount_path), "{flag_name}");
        let mount = mount_of(install, mount_path);
        assert_ne!(mount.read_only, Some(true), "install-cni writes {mount_path}");
        assert_eq!(host_path(&mount.name), (host.to_string(), Some("DirectoryOrCreate".to_string())));
    }
    assert_eq!(flag(&args, "--host-cni-conf-dir").as_deref(), Some("/etc/cni/net.d"));
    assert_eq!(flag(&args, "--cni-token-lifetime").as_deref(), Some("24h"));
    let env = install.env.clone().unwrap_or_default();
    let node = env.iter().find(|e| e.name == "NODE_NAME").expect("NODE_NAME: the Node the host's token is bound to");
    let field = node.value_from.as_ref().and_then(|f| f.field_ref.as_ref()).map(|f| f.field_path.as_str());
    assert_eq!(field, Some("spec.nodeName"));
    assert!(flag(&args, "--token-file").is_none(), "the pod's own projected token authenticates the TokenRequest");
    let sc = install.security_context.clone().unwrap_or_default();
    assert_ne!(sc.privileged, Some(true), "install-cni is not privileged");
    assert_eq!(sc.allow_privilege_escalation, Some(false));

    // the node agent: on the host's socket, with the host's CNI files where the host has them, as root without
    // capabilities (the kubeconfig is root's, 0600), and nothing of the API server but what that kubeconfig names
    assert_eq!(pod.containers.len(), 1, "the agent alone: the cluster-wide work is the controller's");
    let agent = container(&pod.containers, "agent");
    let args = command_line(agent);
    assert_eq!(&args[..2], ["hereabouts-reconciler", "agent"]);
    assert_eq!(flag(&args, "--socket").as_deref(), Some(hereabouts_cni::agent::DEFAULT_SOCKET));
    assert_eq!(flag(&args, "--node-name").as_deref(), Some("$(NODE_NAME)"));
    let run = mount_of(agent, "/run/hereabouts");
    assert_eq!(host_path(&run.name), ("/run/hereabouts".to_string(), Some("DirectoryOrCreate".to_string())));
    // the warm reserve's journal on the host's disk, where the binary reads it when the agent is away
    assert!(flag(&args, "--warm-dir").is_none_or(|d| d == hereabouts_ipam::warm::DEFAULT_DIR));
    let warm = mount_of(agent, hereabouts_ipam::warm::DEFAULT_DIR);
    assert_ne!(warm.read_only, Some(true), "the agent writes its journal");
    let warm_host = (hereabouts_ipam::warm::DEFAULT_DIR.to_string(), Some("DirectoryOrCreate".to_string()));
    assert_eq!(host_path(&warm.name), warm_host, "the host's directory, at the host's path");
    let conf = mount_of(agent, "/etc/cni/net.d");
    assert_eq!(conf.read_only, Some(true), "the agent reads the host's CNI files, never writes them");
    assert_eq!(host_path(&conf.name).0, "/etc/cni/net.d", "mounted where the host has it");
    let sc = agent.security_context.clone().unwrap_or_default();
    assert_eq!(sc.run_as_user, Some(0));
    assert_ne!(sc.privileged, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.capabilities.and_then(|c| c.drop), Some(vec!["ALL".to_string()]));
    assert!(agent.resources.clone().unwrap_or_default().limits.is_some_and(|r| r.contains_key("memory")));
    // its endpoints on a port of its own, probed there
    assert_eq!(flag(&args, "--listen").as_deref(), Some("0.0.0.0:9301"));
    let agent_ports = agent.ports.clone().unwrap_or_default();
    let port = agent_ports.iter().find(|p| p.name.as_deref() == Some("agent-metrics")).expect("a port agent-metrics");
    assert_eq!(port.container_port, 9301);
    for (probe, path) in [(&agent.liveness_probe, "/healthz"), (&agent.readiness_probe, "/readyz")] {
        let get = probe.as_ref().and_then(|p| p.http_get.clone()).expect("an httpGet probe");
        assert_eq!((get.path.as_deref(), get.port), (Some(path), IntOrString::String("agent-metrics".into())));
    }

    assert_eq!(install.image, agent.image, "one image for both");

    // the controller: the cluster-wide work, leader-elected among two replicas, as the controller's account
    let deployment = deploy::controller();
    let spec = deployment.spec;
    assert_eq!(spec.replicas, Some(2), "two replicas, one leads");
    let template_labels = spec.template.metadata.clone().unwrap_or_default().labels.unwrap_or_default();
    for (k, v) in spec.selector.match_labels.iter().flatten() {
        assert_eq!(template_labels.get(k), Some(v), "the selector matches the pod template");
        assert_ne!(labels.get(k), Some(v), "and not the DaemonSet's pods");
    }
    let rolling = spec.strategy.and_then(|s| s.rolling_update).expect("a rolling update");
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(0)), "with hostNetwork a surge could not bind its port");
    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some(deploy::NAME));
    assert_eq!(pod.host_network, Some(false));
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-cluster-critical"));
    let apart = pod.affinity.clone().and_then(|a| a.pod_anti_affinity).expect("replicas kept apart");
    assert!(!apart.preferred_during_scheduling_ignored_during_execution.unwrap_or_default().is_empty());
    let volumes = pod.volumes.unwrap_or_default();
    assert_eq!(pod.containers.len(), 1, "the reconciler");
    let reconciler = container(&pod.containers, "reconciler");
    let args = command_line(reconciler);
    assert_eq!(&args[..2], ["hereabouts-reconciler", "run"]);
    assert_eq!(flag(&args, "--scope").as_deref(), Some("cluster"));
    assert!(flag(&args, "--node-name").is_none(), "no node of its own");
    assert_eq!(flag(&args, "--namespace").as_deref(), Some("$(POD_NAMESPACE)"));
    let env = reconciler.env.clone().unwrap_or_default();
    let field = |name: &str| {
        let var = env.iter().find(|e| e.name == name).unwrap_or_else(|| panic!("no env {name}"));
        var.value_from.as_ref().and_then(|f| f.field_ref.as_ref()).map(|f| f.field_path.clone())
    };
    assert!(env.iter().all(|e| e.name != "NODE_NAME"), "no node of its own");
    assert_eq!(field("POD_NAMESPACE").as_deref(), Some("metadata.namespace"));
    assert_eq!(field("POD_NAME").as_deref(), Some("metadata.name"), "the Lease identity");

    // unauthenticated endpoints in the pod's own network namespace: its addresses, probed on the pod's IP
    assert_eq!(flag(&args, "--listen").as_deref(), Some("0.0.0.0:9300"));
    let ports = reconciler.ports.clone().unwrap_or_default();
    let metrics = ports.iter().find(|p| p.name.as_deref() == Some("metrics")).expect("a port named metrics");
    assert_eq!(metrics.container_port, 9300, "the metrics port is the one --listen binds");
    let probe_target = |probe: Option<&k8s_openapi::api::core::v1::Probe>, what: &str| {
        let get = probe.and_then(|p| p.http_get.clone()).unwrap_or_else(|| panic!("{what} is an httpGet probe"));
        let port = match get.port {
            IntOrString::Int(n) => n,
            IntOrString::String(name) => {
                ports.iter().find(|p| p.name.as_deref() == Some(&name)).map(|p| p.container_port).unwrap_or(-1)
            }
        };
        (get.host, get.path.unwrap_or_default(), port)
    };
    let pod_ip = |path: &str| (None, path.to_string(), 9300);
    assert_eq!(probe_target(reconciler.liveness_probe.as_ref(), "liveness"), pod_ip("/healthz"));
    assert_eq!(probe_target(reconciler.readiness_probe.as_ref(), "readiness"), pod_ip("/readyz"));

    let config_dir = flag(&args, "--config-dir").expect("--config-dir");
    let mount = mount_of(reconciler, &config_dir);
    let volume = volumes.iter().find(|v| v.name == mount.name).unwrap();
    assert_eq!(volume.config_map.as_ref().map(|c| c.name.as_str()), Some("hereabouts-config"));

    let sc = reconciler.security_context.clone().unwrap_or_default();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.capabilities.and_then(|c| c.drop), Some(vec!["ALL".to_string()]));
    let resources = reconciler.resources.clone().unwrap_or_default();
    assert!(resources.requests.is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory")));
    assert!(resources.limits.is_some_and(|r| r.contains_key("memory")));

    assert_eq!(install.image, reconciler.image, "one image for all");
    assert_eq!(reconciler.image.as_deref(), Some("hereabouts:0.1.0"));
}

#[test]
fn config_map_holds_the_defaults() {
    let data = deploy::config_map().data.unwrap_or_default();
    assert_eq!(data.get("cron_expression").map(String::as_str), Some("30 4 * * *"));
    assert_eq!(data.get("grace_period_seconds").map(|s| s.parse::<u64>()), Some(Ok(60)));
}

#[test]
fn without_takes_out_one_verb_of_one_resource() {
    let rules = deploy::role(deploy::CNI_NAME).rules.unwrap();
    let full = deploy::rights(&rules);
    let less = deploy::rights(&deploy::without(&rules, "ippools", "patch"));
    let gone: Vec<&Right> = full.difference(&less).collect();
    assert_eq!(gone, [&right("whereabouts.cni.cncf.io", "ippools", "patch")]);
    assert!(less.is_subset(&full));
    let full = deploy::rights(&deploy::cluster_role().rules.unwrap());
    let less = deploy::rights(&deploy::cluster_role_without(deploy::NAME, "pods", "watch").rules.unwrap());
    assert_eq!(full.difference(&less).collect::<Vec<_>>(), [&right("", "pods", "watch")]);
}

// ---------------------------------------------------------------------------------------------------------------
// The CNI plugin with its Role

/// A fresh namespace in which the CNI's identity has the manifest's Role `hereabouts-cni` (as written, or with
/// one verb less), and a network config whose kubeconfig is that identity's, naming the namespace.
struct Node {
    admin: kube::Client,
    ns: String,
    config: Value,
    /// The same range in slice mode, in /29 slices.
    sliced: Value,
    /// The CNI identity's kubeconfig.
    kubeconfig: std::path::PathBuf,
}

impl Node {
    async fn new(prefix: &str, range: &str) -> Self {
        let cluster = TestCluster::get();
        let admin = cluster.admin().await;
        let ns = cluster.namespace(prefix).await;
        let kubeconfig = cluster.kubeconfig(Identity::Cni, &ns);
        let config = netconf("1.1.0", prefix, &kubeconfig, json!({"range": range}));
        let sliced = netconf("1.1.0", prefix, &kubeconfig, json!({"range": range, "node_slice_size": "/29"}));
        let node = Self { admin, ns, config, sliced, kubeconfig };
        node.grant_all().await;
        node
    }

    async fn grant(&self, rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule>) {
        deploy::apply_role(&self.admin, &self.ns, deploy::CNI_NAME, rules, deploy::NAMESPACE).await;
    }

    async fn grant_all(&self) {
        self.grant(rbac::cni_rules()).await;
    }

    fn invocation(&self, command: &'static str, pod: &str, container_id: &str) -> Invocation {
        Invocation::new(command, &self.config, &self.ns, pod, container_id).with_env("NODENAME", "node-a")
    }

    async fn run(&self, command: &'static str, pod: &str, container_id: &str) -> Output {
        self.invocation(command, pod, container_id).run().await
    }

    /// `command` in slice mode on node `node`.
    async fn run_sliced(&self, command: &'static str, node: &str, pod: &str, container_id: &str) -> Output {
        Invocation::new(command, &self.sliced, &self.ns, pod, container_id).with_env("NODENAME", node).run().await
    }

    /// A node agent of node-a following the pools through the CNI's kubeconfig.
    async fn agent(&self, name: &str) -> hereabouts_tests::agent::Agent {
        let socket = TestCluster::get().dir().join(format!("{}-{name}.sock", self.ns));
        hereabouts_tests::agent::Agent::start_following(&socket, "node-a", &self.kubeconfig).await
    }

    async fn node_slices(&self) -> usize {
        list::<NodeSlicePool>(&Api::namespaced(self.admin.clone(), &self.ns)).await.len()
    }

    async fn pools(&self) -> Vec<IpPool> {
        list(&Api::namespaced(self.admin.clone(), &self.ns)).await
    }

    async fn allocations(&self) -> usize {
        self.pools().await.iter().map(|p| p.spec.allocations.len()).sum()
    }

    async fn reservations(&self) -> Vec<OverlappingRangeIpReservation> {
        list(&Api::namespaced(self.admin.clone(), &self.ns)).await
    }
}

/// Moves the `allocated` time of every entry of `pool` `secs` into the past, as if the ADDs had run then.
async fn age_entries(node: &Node, pool: &str, secs: i64) {
    let at = (k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(secs)).to_string();
    let current: IpPool = Api::namespaced(node.admin.clone(), &node.ns).get(pool).await.unwrap();
    let allocations: serde_json::Map<String, Value> =
        current.spec.allocations.keys().map(|k| (k.clone(), json!({"allocated": at}))).collect();
    let patch = kube::api::Patch::Merge(json!({"spec": {"allocations": allocations}}));
    Api::<IpPool>::namespaced(node.admin.clone(), &node.ns)
        .patch(pool, &kube::api::PatchParams::default(), &patch)
        .await
        .unwrap();
}

/// Every object `api` lists. A resource nothing has touched since the control plane started answers 429 ("storage
/// is (re)initializing") until its watch cache is ready: that is waited out.
async fn list<K>(api: &Api<K>) -> Vec<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api.list(&ListParams::default()).await {
            Ok(list) => return list.items,
            Err(kube::Error::Api(status)) if status.code == 429 && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("list: {e}"),
        }
    }
}

/// Asserts that `out` is a failed invocation whose CNI error says the API server refused it as forbidden.
fn assert_forbidden(out: &Output, what: &str) {
    assert!(!out.success, "{what} succeeded: {}", out.stdout);
    let details = out.json()["details"].as_str().unwrap_or_default().to_lowercase();
    assert!(
        details.contains("forbidden"),
        "{what}: the error names the refusal: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
}

#[tokio::test]
async fn cni_add_check_status_gc_del_work_with_its_role_alone() {
    let node = Node::new("deploy-cni", "198.18.40.0/24").await;

    let status = node.run("STATUS", "web", "c0").await;
    assert!(status.success, "STATUS: {}\nstderr: {}", status.stdout, status.stderr);

    let first = node.run("ADD", "web", "c1").await.ips();
    assert_eq!(first, vec!["198.18.40.1".parse::<std::net::IpAddr>().unwrap()]);
    // the same pod and interface from a new sandbox: the reservation moves to the new container (a patch)
    assert_eq!(node.run("ADD", "web", "c2").await.ips(), first);
    let reservations = node.reservations().await;
    assert_eq!(reservations.len(), 1);
    assert_eq!(reservations[0].spec.containerid, "c2");

    let check = node.run("CHECK", "web", "c2").await;
    assert!(check.success, "CHECK: {}\nstderr: {}", check.stdout, check.stderr);

    // GC of this node, with only c2 still valid, releases what another container held, once the entries are
    // older than any ADD that may still be running
    node.run("ADD", "stale", "c3").await.result();
    assert_eq!(node.allocations().await, 2);
    age_entries(&node, "198.18.40.0-24", 600).await;
    let mut gc = node.config.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "c2", "ifname": "net1"}]);
    let out = Invocation::new("GC", &gc, &node.ns, "", "").with_env("NODENAME", "node-a").run().await;
    assert!(out.success, "GC: {}\nstderr: {}", out.stdout, out.stderr);
    assert_eq!(node.allocations().await, 1, "GC released c3's entry: {}", out.stderr);
    assert_eq!(node.reservations().await.len(), 1);

    let del = node.run("DEL", "web", "c2").await;
    assert!(del.success, "DEL: {}\nstderr: {}", del.stdout, del.stderr);
    assert_eq!(node.allocations().await, 0);
    assert!(node.reservations().await.is_empty(), "DEL deleted the reservation");
}

// ---------------------------------------------------------------------------------------------------------------
// Each verb of the CNI's Role, taken away, breaks the step that needs it

/// A CNI step that needs one verb: what the test runs with every right first, and what it sees without the verb.
#[derive(Debug, Clone, Copy)]
enum CniBreak {
    /// ADD into a fresh namespace is refused and leaves no pool entry, and this many reservations: a rollback
    /// that cannot remove the entry (no patch) keeps the reservation guarding it, for the reconciler to judge.
    Add(usize),
    /// STATUS answers 50: the plugin is not available.
    Status,
    /// After an ADD, the same pod and interface ADDed from a new sandbox is refused (the reservation take-over).
    RepeatedAdd,
    /// After an ADD, DEL succeeds (a failed DEL would leave the pod stuck terminating) and removes the pool
    /// entry, but logs the refusal and leaves the reservation behind for the reconciler.
    DelLeavesReservation,
    /// An ADD in slice mode is refused and leaves no entry, and this many NodeSlicePools.
    SlicedAdd(usize),
    /// In slice mode, with both /29 slices of a /28 owned by other nodes, node-a's address is borrowed from one
    /// of them; its DEL succeeds but cannot tell where to look, and leaves the entry for the reconciler.
    BorrowedDel,
    /// The node agent, following the pools through the CNI's kubeconfig (`--follow`), says its watch was
    /// refused; its ADDs still work, reading as the binary does.
    AgentFollows,
}

async fn cni_verb_is_needed(resource: &str, verb: &str, breaks: CniBreak, range: &str) {
    let prefix = format!("cni-no-{verb}-{}", &resource[..6]);
    let node = Node::new(&prefix, range).await;
    if matches!(breaks, CniBreak::RepeatedAdd | CniBreak::DelLeavesReservation) {
        node.run("ADD", "web", "c1").await.result();
    }
    if matches!(breaks, CniBreak::BorrowedDel) {
        node.run_sliced("ADD", "node-b", "b", "cb").await.result();
        node.run_sliced("ADD", "node-c", "c", "cc").await.result();
        node.run_sliced("ADD", "node-a", "web", "c1").await.result();
    }
    node.grant(deploy::without(&rbac::cni_rules(), resource, verb)).await;
    let what = format!("{breaks:?} without {verb} on {resource}");
    match breaks {
        CniBreak::Add(reservations) => {
            assert_forbidden(&node.run("ADD", "web", "c1").await, &what);
            assert_eq!(node.allocations().await, 0, "{what}: no entry is left");
            assert_eq!(node.reservations().await.len(), reservations, "{what}: reservations left");
        }
        CniBreak::Status => {
            let out = node.run("STATUS", "web", "c1").await;
            assert_forbidden(&out, &what);
            assert_eq!(out.error_code(), 50, "plugin not available: {}", out.stdout);
        }
        CniBreak::RepeatedAdd => {
            assert_forbidden(&node.run("ADD", "web", "c2").await, &what);
            let reservations = node.reservations().await;
            assert_eq!(reservations.len(), 1, "{what}");
            assert_eq!(reservations[0].spec.containerid, "c1", "{what}: not taken over");
        }
        CniBreak::DelLeavesReservation => {
            let out = node.run("DEL", "web", "c1").await;
            assert!(out.success, "{what}: DEL must not fail for a refusal: {}\n{}", out.stdout, out.stderr);
            assert!(
                out.stderr.to_lowercase().contains("forbidden"),
                "{what}: the log names the refusal:\n{}",
                out.stderr
            );
            let left = (node.allocations().await, node.reservations().await.len());
            assert_eq!(left, (0, 1), "{what}: (entries, reservations) left");
        }
        CniBreak::SlicedAdd(node_slices) => {
            assert_forbidden(&node.run_sliced("ADD", "node-a", "web", "c1").await, &what);
            assert_eq!(node.allocations().await, 0, "{what}: no entry is left");
            assert_eq!(node.node_slices().await, node_slices, "{what}: NodeSlicePools");
        }
        CniBreak::AgentFollows => {
            let agent = node.agent("refused").await;
            let refused = wait::until(Duration::from_secs(20), "the watch's refusal", || async {
                let logs = agent.logs();
                logs.lines()
                    .any(|l| l.contains("watch of the node's pools failed") && l.contains("forbidden"))
                    .then_some(())
            })
            .await;
            assert!(refused.is_ok(), "{what}: the agent says its watch was refused:\n{}", agent.logs());
            let out = node.run_sliced("ADD", "node-a", "web", "c1").await;
            assert!(out.success, "{what}: the ADD reads instead: {}\n{}", out.stdout, out.stderr);
        }
        CniBreak::BorrowedDel => {
            let out = node.run_sliced("DEL", "node-a", "web", "c1").await;
            assert!(out.success, "{what}: DEL must not fail for a refusal: {}\n{}", out.stdout, out.stderr);
            assert!(out.stderr.to_lowercase().contains("forbidden"), "{what}: the log names it:\n{}", out.stderr);
            assert_eq!(node.allocations().await, 3, "{what}: the borrowed entry is left");
        }
    }
    // with the verb back, the step works: the failure above was that verb's
    node.grant_all().await;
    match breaks {
        CniBreak::Add(_) => assert_eq!(node.run("ADD", "web", "c1").await.ips().len(), 1),
        CniBreak::Status => assert!(node.run("STATUS", "web", "c1").await.success),
        CniBreak::RepeatedAdd => assert_eq!(node.run("ADD", "web", "c2").await.ips().len(), 1),
        CniBreak::SlicedAdd(_) => assert_eq!(node.run_sliced("ADD", "node-a", "web", "c1").await.ips().len(), 1),
        CniBreak::AgentFollows => {
            let agent = node.agent("granted").await;
            assert!(agent.logs().contains("listed=true"), "the agent's watches listed:\n{}", agent.logs());
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert!(!agent.logs().contains("watch of the node's pools failed"), "{}", agent.logs());
        }
        CniBreak::BorrowedDel => {
            let out = node.run_sliced("DEL", "node-a", "web", "c1").await;
            assert!(out.success, "{}", out.stderr);
            assert_eq!((node.allocations().await, node.reservations().await.len()), (2, 2), "the borrowed one went");
        }
        CniBreak::DelLeavesReservation => {
            // the leftover is the reconciler's; a new attachment is released whole
            node.run("ADD", "web2", "c9").await.result();
            let out = node.run("DEL", "web2", "c9").await;
            assert!(out.success, "{}", out.stderr);
            let left: Vec<String> = node.reservations().await.into_iter().map(|r| r.spec.podref).collect();
            assert_eq!((node.allocations().await, left), (0, vec![format!("{}/web", node.ns)]));
        }
    }
}

/// One test per row: `name: resource, verb => what breaks, range`. Every verb of the Role has a row
/// (`every_cni_verb_has_a_row` checks), so adding a verb to the Role means adding its row here.
macro_rules! cni_verbs {
    ($($name:ident: $resource:literal, $verb:literal => $breaks:expr, $range:literal;)*) => {
        const CNI_ROWS: &[(&str, &str)] = &[$(($resource, $verb)),*];
        $(
            #[tokio::test]
            async fn $name() {
                cni_verb_is_needed($resource, $verb, $breaks, $range).await;
            }
        )*
    };
}

cni_verbs! {
    cni_needs_get_on_pools: "ippools", "get" => CniBreak::Add(0), "198.18.41.0/24";
    cni_needs_list_on_pools: "ippools", "list" => CniBreak::Status, "198.18.42.0/24";
    cni_needs_create_on_pools: "ippools", "create" => CniBreak::Add(0), "198.18.43.0/24";
    cni_needs_patch_on_pools: "ippools", "patch" => CniBreak::Add(0), "198.18.44.0/24";
    cni_needs_get_on_reservations_for_del: "overlappingrangeipreservations", "get" => CniBreak::DelLeavesReservation, "198.18.45.0/24";
    cni_needs_create_on_reservations: "overlappingrangeipreservations", "create" => CniBreak::Add(0), "198.18.49.0/24";
    cni_needs_patch_on_reservations: "overlappingrangeipreservations", "patch" => CniBreak::RepeatedAdd, "198.18.50.0/24";
    cni_needs_delete_on_reservations: "overlappingrangeipreservations", "delete" => CniBreak::DelLeavesReservation, "198.18.51.0/24";
    cni_needs_list_on_reservations_for_a_borrowed_del: "overlappingrangeipreservations", "list" => CniBreak::BorrowedDel, "198.18.52.0/28";
    cni_needs_get_on_node_slices: "nodeslicepools", "get" => CniBreak::SlicedAdd(0), "198.18.53.0/24";
    cni_needs_create_on_node_slices: "nodeslicepools", "create" => CniBreak::SlicedAdd(0), "198.18.54.0/24";
    cni_needs_patch_on_node_slices: "nodeslicepools", "patch" => CniBreak::SlicedAdd(1), "198.18.55.0/24";
    cni_needs_watch_on_pools_for_the_agent: "ippools", "watch" => CniBreak::AgentFollows, "198.18.56.0/24";
    cni_needs_list_on_node_slices_for_the_agent: "nodeslicepools", "list" => CniBreak::AgentFollows, "198.18.57.0/24";
    cni_needs_watch_on_node_slices_for_the_agent: "nodeslicepools", "watch" => CniBreak::AgentFollows, "198.18.58.0/24";
}

#[test]
fn every_cni_verb_has_a_row() {
    let rows: BTreeSet<(String, String)> = CNI_ROWS.iter().map(|(r, v)| (r.to_string(), v.to_string())).collect();
    let granted: BTreeSet<(String, String)> =
        deploy::namespaced_rights(Identity::Cni).into_iter().map(|r| (r.resource, r.verb)).collect();
    assert_eq!(rows, granted, "each verb of Role hereabouts-cni is proven needed by one row of cni_verbs!");
}
