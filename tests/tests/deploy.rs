//! `deploy/daemonset.yaml` against the real API server: every object passes a server-side dry run, the manifest
//! keeps the shape the binaries rely on, and the CNI plugin works with the manifest's ClusterRole and nothing
//! more, while each of its verbs is needed by the operation that uses it.
//!
//! Tests that apply RBAC hold `deploy::rbac_lock()`: the ClusterRoleBinding is cluster-wide and this binary's
//! tests share one control plane.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_tests::deploy::{self, Right, right};
use hereabouts_tests::plugin::{Invocation, Output, netconf};
use hereabouts_tests::{Identity, TestCluster, rbac};
use k8s_openapi::api::core::v1::{ConfigMap, Container, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
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
            // the RBAC tests of this binary may have applied it for real: a dry-run update validates it as well
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
    // a dry run persists nothing (no test creates these for real)
    let ns = deploy::NAMESPACE;
    assert!(Api::<ConfigMap>::namespaced(admin.clone(), ns).get_opt("hereabouts-config").await.unwrap().is_none());
    assert!(Api::<ServiceAccount>::namespaced(admin, ns).get_opt(deploy::NAME).await.unwrap().is_none());
}

#[test]
fn objects_come_in_order_in_kube_system() {
    let kinds: Vec<(String, String)> = deploy::manifest()
        .iter()
        .map(|o| (o["kind"].as_str().unwrap().to_string(), o["metadata"]["name"].as_str().unwrap().to_string()))
        .collect();
    let expected = [
        ("ServiceAccount", "hereabouts"),
        ("ClusterRole", "hereabouts"),
        ("ClusterRoleBinding", "hereabouts"),
        ("ConfigMap", "hereabouts-config"),
        ("DaemonSet", "hereabouts"),
    ]
    .map(|(k, n)| (k.to_string(), n.to_string()));
    assert_eq!(kinds, expected, "{} holds these objects, in this order (no Namespace)", deploy::MANIFEST);

    let binding = deploy::cluster_role_binding();
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, deploy::NAME);
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str(), subjects[0].namespace.as_deref()),
        ("ServiceAccount", deploy::NAME, Some(deploy::NAMESPACE))
    );
    // the identity the tests run the CNI plugin as is that ServiceAccount
    assert_eq!(Identity::Restricted.user(), format!("system:serviceaccount:{}:{}", deploy::NAMESPACE, deploy::NAME));
    assert_ne!(deploy::service_account().automount_service_account_token, Some(false), "install-cni needs the token");
}

#[test]
fn cluster_role_grants_exactly_what_the_binaries_need() {
    let role = deploy::cluster_role();
    let mut expected = BTreeSet::new();
    let mut grant = |group: &str, resource: &str, verbs: &[&str]| {
        expected.extend(verbs.iter().map(|verb| right(group, resource, verb)));
    };
    grant("whereabouts.cni.cncf.io", "ippools", &["get", "list", "watch", "create", "patch"]);
    grant("whereabouts.cni.cncf.io", "overlappingrangeipreservations", &["get", "list", "create", "patch", "delete"]);
    grant("", "pods", &["get", "list", "watch"]);
    grant("coordination.k8s.io", "leases", &["get", "create", "update"]);
    // kube-runtime 5's events::Recorder creates and patches events.k8s.io/v1 Events only
    grant("events.k8s.io", "events", &["create", "patch"]);
    let granted = deploy::rights(&role);
    let missing: Vec<&Right> = expected.difference(&granted).collect();
    let extra: Vec<&Right> = granted.difference(&expected).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing: {missing:?}\nextra: {extra:?}");
    for rule in role.rules.iter().flatten() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none(), "{rule:?}");
        let words = rule.api_groups.iter().chain(rule.resources.iter()).flatten().chain(&rule.verbs);
        assert!(words.clone().all(|w| w != "*"), "no wildcards: {rule:?}");
    }
    assert!(role.aggregation_rule.is_none());

    // what the other integration tests grant the CNI plugin (rbac::cni_rules) is covered by the ClusterRole
    let cni = deploy::rights(&ClusterRole { rules: Some(rbac::cni_rules()), ..Default::default() });
    let uncovered: Vec<&Right> = cni.difference(&granted).collect();
    assert!(uncovered.is_empty(), "rbac::cni_rules grants what the ClusterRole does not: {uncovered:?}");
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
    let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    for (k, v) in spec.selector.match_labels.iter().flatten() {
        assert_eq!(labels.get(k), Some(v), "the selector matches the pod template");
    }
    let strategy = spec.update_strategy.expect("updateStrategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.expect("rollingUpdate");
    assert_eq!(rolling.max_unavailable, Some(IntOrString::String("10%".into())));
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(0)), "two pods of a node would both bind the host port");

    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some(deploy::NAME));
    assert_ne!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    let tolerations = pod.tolerations.unwrap_or_default();
    assert!(
        tolerations.iter().any(|t| t.operator.as_deref() == Some("Exists")
            && t.key.is_none()
            && t.effect.is_none()
            && t.toleration_seconds.is_none()),
        "tolerates every taint: {tolerations:?}"
    );

    // volumes by name
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
    let sc = install.security_context.clone().unwrap_or_default();
    assert_ne!(sc.privileged, Some(true), "install-cni is not privileged");
    assert_eq!(sc.allow_privilege_escalation, Some(false));

    // the reconciler
    let containers = pod.containers;
    assert_eq!(containers.len(), 1);
    let reconciler = container(&containers, "reconciler");
    let args = command_line(reconciler);
    assert_eq!(&args[..2], ["hereabouts-reconciler", "run"]);
    assert_eq!(flag(&args, "--node-name").as_deref(), Some("$(NODE_NAME)"));
    assert_eq!(flag(&args, "--namespace").as_deref(), Some("$(POD_NAMESPACE)"));
    let env = reconciler.env.clone().unwrap_or_default();
    let field = |name: &str| {
        let var = env.iter().find(|e| e.name == name).unwrap_or_else(|| panic!("no env {name}"));
        var.value_from.as_ref().and_then(|f| f.field_ref.as_ref()).map(|f| f.field_path.clone())
    };
    assert_eq!(field("NODE_NAME").as_deref(), Some("spec.nodeName"));
    assert_eq!(field("POD_NAMESPACE").as_deref(), Some("metadata.namespace"));
    assert_eq!(field("POD_NAME").as_deref(), Some("metadata.name"), "the Lease identity");

    let listen = flag(&args, "--listen").expect("--listen");
    let port: i32 = listen.rsplit(':').next().unwrap().parse().expect("--listen ends in a port");
    let ports = reconciler.ports.clone().unwrap_or_default();
    let metrics = ports.iter().find(|p| p.name.as_deref() == Some("metrics")).expect("a port named metrics");
    assert_eq!((metrics.container_port, port), (9300, 9300), "the metrics port is the one --listen binds");
    let probe_target = |probe: Option<&k8s_openapi::api::core::v1::Probe>, what: &str| {
        let get = probe.and_then(|p| p.http_get.clone()).unwrap_or_else(|| panic!("{what} is an httpGet probe"));
        let port = match get.port {
            IntOrString::Int(n) => n,
            IntOrString::String(name) => {
                ports.iter().find(|p| p.name.as_deref() == Some(&name)).map(|p| p.container_port).unwrap_or(-1)
            }
        };
        (get.path.unwrap_or_default(), port)
    };
    assert_eq!(probe_target(reconciler.liveness_probe.as_ref(), "liveness"), ("/healthz".to_string(), 9300));
    assert_eq!(probe_target(reconciler.readiness_probe.as_ref(), "readiness"), ("/readyz".to_string(), 9300));

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

    // one image for both
    assert_eq!(install.image, reconciler.image);
    assert_eq!(reconciler.image.as_deref(), Some("hereabouts:0.1.0"));
}

#[test]
fn config_map_holds_the_defaults() {
    let data = deploy::config_map().data.unwrap_or_default();
    assert_eq!(data.get("cron_expression").map(String::as_str), Some("30 4 * * *"));
    assert_eq!(data.get("grace_period_seconds").map(|s| s.parse::<u64>()), Some(Ok(60)));
}

#[test]
fn cluster_role_without_takes_out_one_verb_of_one_resource() {
    let full = deploy::rights(&deploy::cluster_role());
    let less = deploy::rights(&deploy::cluster_role_without("ippools", "patch"));
    let gone: Vec<&Right> = full.difference(&less).collect();
    assert_eq!(gone, [&right("whereabouts.cni.cncf.io", "ippools", "patch")]);
    assert!(less.is_subset(&full));
}

// ---------------------------------------------------------------------------------------------------------------
// The CNI plugin with the ClusterRole

/// A fresh namespace with no Role in it and a kubeconfig for the restricted identity whose context names it:
/// whatever the plugin may do there comes from the ClusterRole.
struct Node {
    cluster: &'static TestCluster,
    admin: kube::Client,
    ns: String,
    config: Value,
}

impl Node {
    async fn new(prefix: &str, range: &str) -> Self {
        let cluster = TestCluster::get();
        let admin = cluster.admin().await;
        let ns = cluster.namespace(prefix).await;
        let kubeconfig = cluster.kubeconfig(Identity::Restricted, &ns);
        let config = netconf("1.1.0", prefix, &kubeconfig, json!({"range": range}));
        Self { cluster, admin, ns, config }
    }

    fn invocation(&self, command: &'static str, pod: &str, container_id: &str) -> Invocation {
        Invocation::new(command, &self.config, &self.ns, pod, container_id).with_env("NODENAME", "node-a")
    }

    async fn run(&self, command: &'static str, pod: &str, container_id: &str) -> Output {
        self.invocation(command, pod, container_id).run().await
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
async fn cni_add_check_status_gc_del_work_with_the_cluster_role_alone() {
    let _rbac = deploy::rbac_lock().await;
    let node = Node::new("deploy-cni", "198.18.40.0/24").await;
    deploy::apply_rbac(node.admin.clone()).await;
    let roles: Vec<Role> = list(&Api::namespaced(node.admin.clone(), &node.ns)).await;
    let bindings: Vec<RoleBinding> = list(&Api::namespaced(node.admin.clone(), &node.ns)).await;
    assert!(roles.is_empty() && bindings.is_empty(), "no namespaced grant helps");

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

    // GC of this node, with only c2 still valid, releases what another container held
    node.run("ADD", "stale", "c3").await.result();
    assert_eq!(node.allocations().await, 2);
    let mut gc = node.config.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "c2", "ifname": "net1"}]);
    let out = Invocation::new("GC", &gc, &node.ns, "", "").with_env("NODENAME", "node-a").run().await;
    assert!(out.success, "GC: {}\nstderr: {}", out.stdout, out.stderr);
    assert_eq!(node.allocations().await, 1);
    assert_eq!(node.reservations().await.len(), 1);

    let del = node.run("DEL", "web", "c2").await;
    assert!(del.success, "DEL: {}\nstderr: {}", del.stdout, del.stderr);
    assert_eq!(node.allocations().await, 0);
    assert!(node.reservations().await.is_empty(), "DEL deleted the reservation");

    // and nothing beyond the manifest: the restricted identity cannot read secrets, nodes or NADs, nor rewrite or
    // delete pools wholesale
    let client = node.cluster.client(Identity::Restricted).await;
    for denied in [
        right("", "secrets", "get"),
        right("", "nodes", "list"),
        right("", "configmaps", "get"),
        right("", "events", "create"),
        right("k8s.cni.cncf.io", "network-attachment-definitions", "list"),
        right("whereabouts.cni.cncf.io", "ippools", "update"),
        right("whereabouts.cni.cncf.io", "ippools", "delete"),
        right("whereabouts.cni.cncf.io", "nodeslicepools", "get"),
    ] {
        assert!(!deploy::can(&client, Some(&node.ns), &denied).await.unwrap(), "{denied} is not granted");
    }
}

#[tokio::test]
async fn add_without_create_on_reservations_is_forbidden_and_leaves_no_allocation() {
    let _rbac = deploy::rbac_lock().await;
    let node = Node::new("deploy-no-reserve", "198.18.41.0/24").await;
    deploy::apply_rbac_without(node.admin.clone(), "overlappingrangeipreservations", "create").await;
    let out = node.run("ADD", "web", "c1").await;
    deploy::apply_rbac(node.admin.clone()).await;
    assert_forbidden(&out, "ADD without create on overlappingrangeipreservations");
    assert_eq!(node.allocations().await, 0);
    assert!(node.reservations().await.is_empty());
}

#[tokio::test]
async fn add_without_patch_on_pools_is_forbidden_and_rolls_back_its_reservation() {
    let _rbac = deploy::rbac_lock().await;
    let node = Node::new("deploy-no-patch", "198.18.42.0/24").await;
    deploy::apply_rbac_without(node.admin.clone(), "ippools", "patch").await;
    let out = node.run("ADD", "web", "c1").await;
    deploy::apply_rbac(node.admin.clone()).await;
    assert_forbidden(&out, "ADD without patch on ippools");
    assert_eq!(node.allocations().await, 0);
    assert!(node.reservations().await.is_empty(), "the reservation made before the refused patch is deleted");
}

#[tokio::test]
async fn add_without_create_on_pools_is_forbidden_for_a_new_range() {
    let _rbac = deploy::rbac_lock().await;
    let node = Node::new("deploy-no-pool", "198.18.43.0/24").await;
    deploy::apply_rbac_without(node.admin.clone(), "ippools", "create").await;
    let out = node.run("ADD", "web", "c1").await;
    deploy::apply_rbac(node.admin.clone()).await;
    assert_forbidden(&out, "ADD without create on ippools");
    assert!(node.pools().await.is_empty());
    assert!(node.reservations().await.is_empty());
}

#[tokio::test]
async fn status_without_list_on_pools_is_not_available() {
    let _rbac = deploy::rbac_lock().await;
    let node = Node::new("deploy-no-list", "198.18.44.0/24").await;
    deploy::apply_rbac_without(node.admin.clone(), "ippools", "list").await;
    let out = node.run("STATUS", "web", "c1").await;
    deploy::apply_rbac(node.admin.clone()).await;
    assert_forbidden(&out, "STATUS without list on ippools");
    assert_eq!(out.error_code(), 50, "plugin not available: {}", out.stdout);
    let ok = node.run("STATUS", "web", "c1").await;
    assert!(ok.success, "STATUS with list restored: {}", ok.stdout);
}

#[tokio::test]
async fn del_without_delete_on_reservations_is_forbidden() {
    let _rbac = deploy::rbac_lock().await;
    let node = Node::new("deploy-no-delete", "198.18.45.0/24").await;
    deploy::apply_rbac(node.admin.clone()).await;
    node.run("ADD", "web", "c1").await.result();
    deploy::apply_rbac_without(node.admin.clone(), "overlappingrangeipreservations", "delete").await;
    let out = node.run("DEL", "web", "c1").await;
    deploy::apply_rbac(node.admin.clone()).await;
    assert_forbidden(&out, "DEL without delete on overlappingrangeipreservations");
    // with the right back, a repeated DEL (what the runtime does after a failed one) succeeds
    let again = node.run("DEL", "web", "c1").await;
    assert!(again.success, "DEL with delete restored: {}", again.stdout);
    assert_eq!(node.allocations().await, 0);
}

/// The reconciler with the ClusterRole alone is the subject of `tests/reconciler.rs`; here, one verb less:
/// without `watch` on pods its node loop cannot start, so it never reports ready, and says why.
#[tokio::test]
async fn reconciler_without_watch_on_pods_never_gets_ready() {
    use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
    let _rbac = deploy::rbac_lock().await;
    let cluster = TestCluster::get();
    let admin = cluster.admin().await;
    deploy::apply_rbac_without(admin.clone(), "pods", "watch").await;
    let ns = cluster.namespace("deploy-rec-nowatch").await;
    let reconciler = Reconciler::launch(cluster, &ReconcilerOptions::new("node-nowatch", &ns));
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let ready = reconciler.get("/readyz").await;
    let healthy = reconciler.get("/healthz").await;
    let logs = reconciler.logs();
    deploy::apply_rbac(admin).await;
    assert_eq!(healthy.as_deref(), Some("ok"), "the process is up:\n{logs}");
    assert_eq!(ready, None, "it must not report ready without its pod watch:\n{logs}");
    assert!(logs.contains("forbidden"), "the log says the watch was forbidden:\n{logs}");
}
