//! The two identities of `deploy/daemonset.yaml` on the real control plane, beyond the CNI's own steps (those are
//! in the `deploy` module): what each may not do, that the reconciler does its whole job with exactly its rights,
//! and that each verb it is granted is needed (the table `reconciler_verbs!`, whose rows include the node agent's
//! warm-reserve check: the same identity is the agent's own), its Lease handling when it may not create the Lease,
//! and where it serves its unauthenticated endpoints by default.
//!
//! The reconciler runs as [`Identity::Restricted`] (ServiceAccount `hereabouts` of kube-system), its Role applied
//! into each test's namespace; tests that change the cluster-wide ClusterRole hold its exclusive guard, all others
//! the shared one. The CNI's identity is checked with every object of the chart applied as shipped; what its
//! tokens may write, node by node, is the `node_tokens` module's. On a control plane of this module's own: it takes cluster-wide rights away, writes kube-system
//! and creates Nodes, which the other tests of the binary must not see.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hereabouts_ipam::crd::{
    IpAllocation, IpPool, NodeSliceAllocation, NodeSlicePool, NodeSlicePoolSpec, NodeSlicePoolStatus,
    OverlappingRangeIpReservation,
};
use hereabouts_ipam::warm;
use hereabouts_tests::agent::Agent;
use hereabouts_tests::deploy::{self, named, right};
use hereabouts_tests::objects::{self, mk_entry, mk_node, mk_pod, mk_pool, mk_reservation};
use hereabouts_tests::plugin::{Invocation, netconf, workspace_bin};
use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
use hereabouts_tests::{Identity, TestCluster, wait};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::RwLockReadGuard;

const W: &str = "whereabouts.cni.cncf.io";
/// A schedule that never comes within a test: the cluster reconcile stays out of what the node loop must show.
const NEVER: &str = "0 0 1 1 *";
/// Every 2 s (6 fields: seconds first), so the cluster reconcile runs within a test.
const OFTEN: &str = "*/2 * * * * *";

/// This module's control plane.
fn cluster() -> &'static TestCluster {
    TestCluster::own(module_path!())
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.into()), ..Default::default() }
}

fn is_forbidden<T>(r: &Result<T, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403)
}

// ---------------------------------------------------------------------------------------------------------------
// What each identity may not do

/// The controller's identity (ServiceAccount hereabouts) holds its one Lease and mints no token; the DaemonSet
/// pod's (hereabouts-node) mints the CNI's and no other, and holds no Lease.
#[tokio::test]
async fn the_reconciler_identity_holds_one_lease_and_the_node_identity_mints_for_one_account() {
    let cluster = cluster();
    let admin = cluster.admin().await;
    let _rbac = deploy::cluster_rbac(&admin).await;
    // as in a cluster: the manifest's Roles and Lease in kube-system, and a Lease of another component
    deploy::apply_roles(&admin, deploy::NAMESPACE, deploy::NAMESPACE).await;
    deploy::create_lease(&admin, deploy::NAMESPACE).await;
    let ks = deploy::NAMESPACE;
    let scheduler = Lease { metadata: meta("kube-scheduler"), spec: Some(LeaseSpec::default()) };
    let created = Api::<Lease>::namespaced(admin.clone(), ks).create(&PostParams::default(), &scheduler).await;
    assert!(created.is_ok() || matches!(&created, Err(kube::Error::Api(s)) if s.is_already_exists()), "{created:?}");

    let me = cluster.client(Identity::Restricted).await;
    let lease = |verb: &str, name: &str| named("coordination.k8s.io", "leases", verb, name);
    for (ns, allowed, denied) in [
        (
            ks,
            vec![lease("get", deploy::LEASE_NAME), lease("update", deploy::LEASE_NAME)],
            vec![
                lease("update", "kube-scheduler"),
                lease("get", "kube-scheduler"),
                lease("delete", deploy::LEASE_NAME),
                right("coordination.k8s.io", "leases", "create"),
                right("coordination.k8s.io", "leases", "list"),
            ],
        ),
        (
            "kube-node-lease",
            vec![],
            vec![
                lease("update", "node-a"),
                lease("get", deploy::LEASE_NAME),
                right("coordination.k8s.io", "leases", "create"),
            ],
        ),
    ] {
        for r in allowed {
            assert!(deploy::can(&me, Some(ns), &r).await.unwrap(), "{r} in {ns}");
        }
        for r in denied {
            assert!(!deploy::can(&me, Some(ns), &r).await.unwrap(), "{r} in {ns}");
        }
    }
    let token = |name: &str| named("", "serviceaccounts/token", "create", name);
    let node = cluster.client(Identity::Node).await;
    assert!(deploy::can(&node, Some(ks), &token(deploy::CNI_NAME)).await.unwrap());
    for name in [deploy::CNI_NAME, deploy::NAME, deploy::NODE_ACCOUNT, "default", "kube-scheduler"] {
        assert!(!deploy::can(&me, Some(ks), &token(name)).await.unwrap(), "the controller mints a token for {name}");
    }
    for name in [deploy::NAME, deploy::NODE_ACCOUNT, "default", "kube-scheduler", "replicaset-controller"] {
        assert!(!deploy::can(&node, Some(ks), &token(name)).await.unwrap(), "the node mints a token for {name}");
    }
    assert!(!deploy::can(&node, Some("default"), &token(deploy::CNI_NAME)).await.unwrap(), "elsewhere");
    for who in [&me, &node] {
        assert!(!deploy::can(who, Some(ks), &right("", "serviceaccounts", "get")).await.unwrap());
        assert!(!deploy::can(who, Some(ks), &right(W, "ippools", "create")).await.unwrap(), "the CNI creates pools");
    }
    for verb in ["get", "update"] {
        let ours = lease(verb, deploy::LEASE_NAME);
        assert!(!deploy::can(&node, Some(ks), &ours).await.unwrap(), "the node: {ours}");
    }

    // and the requests themselves
    let leases = Api::<Lease>::namespaced(me.clone(), ks);
    assert!(is_forbidden(&leases.get("kube-scheduler").await));
    let mut rewritten = scheduler.clone();
    rewritten.spec = Some(LeaseSpec { holder_identity: Some("hereabouts".into()), ..Default::default() });
    assert!(is_forbidden(&leases.replace("kube-scheduler", &PostParams::default(), &rewritten).await));
    assert!(is_forbidden(
        &leases.create(&PostParams::default(), &Lease { metadata: meta("planted"), spec: None }).await
    ));
    let mut ours = leases.get(deploy::LEASE_NAME).await.expect("get its own Lease");
    ours.spec = Some(LeaseSpec { holder_identity: Some("test".into()), ..Default::default() });
    leases.replace(deploy::LEASE_NAME, &PostParams::default(), &ours).await.expect("update its own Lease");
    let accounts = Api::<ServiceAccount>::namespaced(me, ks);
    for name in [deploy::CNI_NAME, deploy::NAME, "default"] {
        let minted = accounts.create_token_request(name, &PostParams::default(), &TokenRequest::default()).await;
        assert!(is_forbidden(&minted), "the controller, a token for {name}: {minted:?}");
    }
    let accounts = Api::<ServiceAccount>::namespaced(node, ks);
    for name in [deploy::NAME, deploy::NODE_ACCOUNT, "default"] {
        let minted = accounts.create_token_request(name, &PostParams::default(), &TokenRequest::default()).await;
        assert!(is_forbidden(&minted), "the node, a token for {name}: {minted:?}");
    }
}

/// Waits until `client` holds, in each namespace of `expected`, exactly its rights there, as a SelfSubjectRulesReview
/// lists them less what any ServiceAccount of kube-system may (the API server's own bindings to its groups).
async fn holds_exactly(admin: &Client, client: &Client, expected: &[(&str, BTreeSet<deploy::Right>)]) {
    let cluster = cluster();
    let baseline = "rights-baseline";
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), deploy::NAMESPACE);
    if accounts.get_opt(baseline).await.unwrap().is_none() {
        let sa = ServiceAccount { metadata: meta(baseline), ..Default::default() };
        let created = accounts.create(&PostParams::default(), &sa).await;
        assert!(created.is_ok() || matches!(&created, Err(kube::Error::Api(s)) if s.is_already_exists()));
    }
    let everyone = cluster.client_with_token(&deploy::token_for(admin, deploy::NAMESPACE, baseline, None).await).await;
    for (namespace, expected) in expected {
        let last = std::sync::Mutex::new(String::new());
        let exact = wait::until(Duration::from_secs(20), "the rights to be the chart's", || async {
            let base = deploy::rules_review(&everyone, namespace).await.ok()?;
            let held: BTreeSet<_> =
                deploy::rules_review(client, namespace).await.ok()?.difference(&base).cloned().collect();
            let extra: Vec<_> = held.difference(expected).map(ToString::to_string).collect();
            let missing: Vec<_> = expected.difference(&held).map(ToString::to_string).collect();
            *last.lock().unwrap() = format!("extra {extra:?}, missing {missing:?}");
            (extra.is_empty() && missing.is_empty()).then_some(())
        })
        .await;
        exact.unwrap_or_else(|e| panic!("{e} in {namespace}: {}", last.lock().unwrap()));
    }
}

/// The DaemonSet pod's identity on every node (hereabouts-node) with every object of the chart's default render
/// applied as shipped: what the authorizer grants it is exactly its Role in the pool namespace and its ClusterRole
/// (reads), listed by a SelfSubjectRulesReview less what any ServiceAccount may. It writes no pool, reservation,
/// NodeSlicePool, Lease or Event, reads no pod, and the API server refuses the requests themselves: a node's pod
/// token cannot release another node's pod's address.
#[tokio::test]
async fn the_node_identity_writes_no_address_and_reads_no_pod() {
    let cluster = cluster();
    let admin = cluster.admin().await;
    let _rbac = deploy::cluster_rbac(&admin).await;
    deploy::apply_chart(&admin, &deploy::manifest()).await;
    let ns = cluster.namespace("id-node").await;
    let node = cluster.client(Identity::Node).await;
    let reads = deploy::cluster_rights(Identity::Node);
    let home: BTreeSet<_> = deploy::namespaced_rights(Identity::Node).union(&reads).cloned().collect();
    holds_exactly(&admin, &node, &[(deploy::NAMESPACE, home), (ns.as_str(), reads.clone())]).await;
    for namespace in [Some(deploy::NAMESPACE), Some(ns.as_str()), None] {
        for denied in [
            right(W, "ippools", "get"),
            right(W, "ippools", "patch"),
            right(W, "ippools", "delete"),
            right(W, "overlappingrangeipreservations", "create"),
            right(W, "overlappingrangeipreservations", "delete"),
            right(W, "nodeslicepools", "patch"),
            right("", "pods", "get"),
            right("", "pods", "list"),
            right("", "nodes", "list"),
            right("", "nodes", "update"),
            right("events.k8s.io", "events", "create"),
            right("", "secrets", "get"),
        ] {
            assert!(!deploy::can(&node, namespace, &denied).await.unwrap(), "{denied} in {namespace:?}");
        }
    }
    // the requests themselves: another node's pod's entry cannot be removed, nor its reservation deleted
    let ks = deploy::NAMESPACE;
    let pool_name = format!("{ns}-198.18.49.0-24");
    let entry = IpAllocation { node: Some("node-b".into()), ..mk_entry("c-live", "ns/live").ifname("net1").build() };
    let pool = mk_pool(&pool_name, "198.18.49.0/24").entry(5, entry).build();
    Api::<IpPool>::namespaced(admin.clone(), ks).create(&PostParams::default(), &pool).await.unwrap();
    let reservation =
        mk_reservation(&format!("{ns}-198.18.49.5"), "ns/live").container("c-live").ifname("net1").build();
    Api::<OverlappingRangeIpReservation>::namespaced(admin.clone(), ks)
        .create(&PostParams::default(), &reservation)
        .await
        .unwrap();
    let removal = json!([{"op": "remove", "path": "/spec/allocations/5"}]);
    let patched = Api::<IpPool>::namespaced(node.clone(), ks)
        .patch(&pool_name, &PatchParams::default(), &Patch::<Value>::Json(serde_json::from_value(removal).unwrap()))
        .await;
    assert!(is_forbidden(&patched), "the node's pod token removed an entry: {patched:?}");
    let deleted = Api::<OverlappingRangeIpReservation>::namespaced(node.clone(), ks)
        .delete(&format!("{ns}-198.18.49.5"), &DeleteParams::default())
        .await;
    assert!(is_forbidden(&deleted), "the node's pod token deleted a reservation: {deleted:?}");
    assert!(is_forbidden(&Api::<Pod>::all(node.clone()).list(&ListParams::default().limit(1)).await), "list pods");
    let held = Api::<IpPool>::namespaced(admin.clone(), ks).get(&pool_name).await.unwrap();
    assert!(held.spec.allocations.contains_key("5"), "the entry is still there");
    Api::<IpPool>::namespaced(admin.clone(), ks).delete(&pool_name, &DeleteParams::default()).await.unwrap();
    Api::<OverlappingRangeIpReservation>::namespaced(admin, ks)
        .delete(&format!("{ns}-198.18.49.5"), &DeleteParams::default())
        .await
        .unwrap();
}

/// The CNI's identity with every object of the chart's default render applied as shipped (its Role, every
/// ClusterRole and binding, the policies): what the authorizer grants it is exactly its Role, in its namespace, and
/// nothing in any other — listed by a SelfSubjectRulesReview, less what any ServiceAccount may, so a
/// ClusterRole that grows, or one more binding to the account, shows here. No pod, namespace or Node read, no
/// Event, no Lease, no token.
#[tokio::test]
async fn the_cni_identity_holds_exactly_its_role_with_every_binding_of_the_chart() {
    let cluster = cluster();
    let admin = cluster.admin().await;
    let _rbac = deploy::cluster_rbac(&admin).await;
    deploy::apply_chart(&admin, &deploy::manifest()).await;
    let ns = cluster.namespace("id-cni").await;
    let cni = cluster.client(Identity::Cni).await;
    let role = deploy::namespaced_rights(Identity::Cni);
    let expected = [(deploy::NAMESPACE, role.clone()), (ns.as_str(), BTreeSet::new()), ("default", BTreeSet::new())];
    holds_exactly(&admin, &cni, &expected).await;
    let leases = [
        named("coordination.k8s.io", "leases", "get", "kube-scheduler"),
        named("coordination.k8s.io", "leases", "update", "kube-scheduler"),
        named("coordination.k8s.io", "leases", "get", deploy::LEASE_NAME),
        named("coordination.k8s.io", "leases", "update", deploy::LEASE_NAME),
        right("coordination.k8s.io", "leases", "create"),
        right("coordination.k8s.io", "leases", "list"),
    ];
    for namespace in [deploy::NAMESPACE, "kube-node-lease", ns.as_str()] {
        for denied in &leases {
            assert!(!deploy::can(&cni, Some(namespace), denied).await.unwrap(), "{denied} in {namespace}");
        }
    }
    for namespace in [Some(deploy::NAMESPACE), Some(ns.as_str()), None] {
        for denied in [
            right("", "pods", "get"),
            right("", "pods", "list"),
            right("", "pods", "watch"),
            right("", "namespaces", "get"),
            right("", "nodes", "get"),
            right("", "secrets", "get"),
            right("", "nodes", "list"),
            right("", "configmaps", "get"),
            right("", "events", "create"),
            right("events.k8s.io", "events", "create"),
            named("", "serviceaccounts/token", "create", deploy::CNI_NAME),
            right("k8s.cni.cncf.io", "network-attachment-definitions", "list"),
            right(W, "ippools", "update"),
            right(W, "ippools", "delete"),
            right(W, "overlappingrangeipreservations", "watch"),
            right(W, "nodeslicepools", "update"),
            right(W, "nodeslicepools", "delete"),
        ] {
            assert!(!deploy::can(&cni, namespace, &denied).await.unwrap(), "{denied} in {namespace:?}");
        }
    }
    for namespace in [ns.as_str(), "default"] {
        for verb in ["get", "list", "create", "patch"] {
            let denied = right(W, "ippools", verb);
            assert!(!deploy::can(&cni, Some(namespace), &denied).await.unwrap(), "{denied} in {namespace}");
        }
    }
    assert!(deploy::can(&cni, Some(deploy::NAMESPACE), &right(W, "ippools", "create")).await.unwrap(), "but at home");

    // and the API server refuses the requests themselves
    let kube_system = Api::<Lease>::namespaced(cni.clone(), deploy::NAMESPACE);
    assert!(is_forbidden(&kube_system.get("kube-scheduler").await), "GET kube-system/kube-scheduler");
    assert!(is_forbidden(
        &kube_system.create(&PostParams::default(), &Lease { metadata: meta("planted"), spec: None }).await
    ));
    assert!(is_forbidden(&Api::<Pod>::all(cni.clone()).list(&ListParams::default().limit(1)).await), "list pods");
    mk_pod(&ns, "web").create(&admin).await;
    assert!(is_forbidden(&Api::<Pod>::namespaced(cni.clone(), &ns).get("web").await), "GET a pod's spec");
    // a kubeconfig naming another namespace, where it has no Role, gets nowhere
    let elsewhere = cluster.kubeconfig(Identity::Cni, "default");
    let config = netconf("1.1.0", "elsewhere", &elsewhere, json!({"range": "198.18.48.0/24"}));
    let out = Invocation::new("ADD", &config, "default", "web", "c1").run().await;
    assert!(!out.success && out.stdout.to_lowercase().contains("forbidden"), "{}\n{}", out.stdout, out.stderr);
}

// ---------------------------------------------------------------------------------------------------------------
// The reconciler with exactly its rights, and with one verb less

/// Where a verb is granted: the controller's Role in the pool namespace or its ClusterRole, or the DaemonSet pod's
/// (install-cni and the node agent, ServiceAccount hereabouts-node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Role,
    Cluster,
    NodeRole,
    NodeCluster,
}

/// A test's namespace, with the reconciler's rights as the manifest grants them there (or with one verb less),
/// the Lease, a node name, and a network config whose CNI identity is admin (the CNI's rights are not the subject).
struct Fx {
    cluster: &'static TestCluster,
    admin: Client,
    ns: String,
    node: String,
    config: Value,
    _guard: Guard,
}

enum Guard {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive(#[allow(dead_code)] tokio::sync::RwLockWriteGuard<'static, ()>),
}

impl Fx {
    async fn new(prefix: &str, range: &str, without: Option<(Scope, &str, &str)>) -> Self {
        let cluster = cluster();
        let admin = cluster.admin().await;
        let guard = match without {
            Some((Scope::Cluster, resource, verb)) => {
                Guard::Exclusive(deploy::cluster_rbac_without(&admin, deploy::NAME, resource, verb).await)
            }
            Some((Scope::NodeCluster, resource, verb)) => {
                Guard::Exclusive(deploy::cluster_rbac_without(&admin, deploy::NODE_ACCOUNT, resource, verb).await)
            }
            _ => Guard::Shared(deploy::cluster_rbac(&admin).await),
        };
        let ns = cluster.namespace(prefix).await;
        for (name, scope) in [(deploy::NAME, Scope::Role), (deploy::NODE_ACCOUNT, Scope::NodeRole)] {
            let mut rules = deploy::role(name).rules.unwrap();
            if let Some((taken_from, resource, verb)) = without
                && taken_from == scope
            {
                rules = deploy::without(&rules, resource, verb);
            }
            deploy::apply_role(&admin, &ns, name, rules, deploy::NAMESPACE).await;
        }
        deploy::create_lease(&admin, &ns).await;
        let sa = ServiceAccount { metadata: meta(deploy::CNI_NAME), ..Default::default() };
        Api::<ServiceAccount>::namespaced(admin.clone(), &ns).create(&PostParams::default(), &sa).await.unwrap();
        let config = netconf("1.0.0", prefix, &cluster.kubeconfig(Identity::Admin, &ns), json!({"range": range}));
        let node = format!("node-{ns}");
        Self { cluster, admin, ns, node, config, _guard: guard }
    }

    fn launch(&self, cron: &str) -> Reconciler {
        self.launch_with(cron, |_| {})
    }

    /// [`Self::launch`] with its options changed by `change`.
    fn launch_with(&self, cron: &str, change: impl FnOnce(&mut ReconcilerOptions)) -> Reconciler {
        let mut opts = ReconcilerOptions {
            cron: cron.into(),
            lease: deploy::LEASE_NAME.into(),
            ..ReconcilerOptions::new(&self.node, &self.ns)
        };
        change(&mut opts);
        Reconciler::launch(self.cluster, &opts)
    }

    /// A pod on `node` and its ADD there (with its UID).
    async fn pod_with_address(&self, name: &str, node: &str) {
        let pod = mk_pod(&self.ns, name).node(node).create(&self.admin).await;
        let mut inv =
            Invocation::new("ADD", &self.config, &self.ns, name, &format!("c-{name}")).with_env("NODENAME", node);
        inv.args.push_str(&format!(";K8S_POD_UID={}", pod.metadata.uid.unwrap()));
        inv.run().await.result();
    }

    /// A pod `name` (`<statefulset>-<ordinal>`) controlled by StatefulSet `set` (which need not exist) on
    /// `node`, and its ADD in the same range with `sticky_statefulset`.
    async fn sticky_pod_with_address(&self, name: &str, set: &str, node: &str) {
        let pod = mk_pod(&self.ns, name)
            .node(node)
            .owned_by_statefulset(set, "00000000-0000-0000-0000-000000000001")
            .create(&self.admin)
            .await;
        let mut config = self.config.clone();
        config["ipam"]["sticky_statefulset"] = json!(true);
        let mut inv = Invocation::new("ADD", &config, &self.ns, name, &format!("c-{name}")).with_env("NODENAME", node);
        inv.args.push_str(&format!(";K8S_POD_UID={}", pod.metadata.uid.unwrap()));
        inv.run().await.result();
        let sticky =
            self.pool_entries().await.into_iter().any(|a| a.podref == self.podref(name) && a.statefulset.is_some());
        assert!(sticky, "the entry records its StatefulSet");
    }

    /// A pod `name` on `node` and its ADD, its entry then marked as IPAMClaim `claim`'s (which need not exist), as
    /// a network with `allowPersistentIPs` writes it.
    async fn claimed_pod_with_address(&self, name: &str, claim: &str, node: &str) {
        self.pod_with_address(name, node).await;
        let pools = Api::<IpPool>::namespaced(self.admin.clone(), &self.ns);
        for mut pool in pools.list(&Default::default()).await.unwrap().items {
            let podref = self.podref(name);
            let mut marked = false;
            for entry in pool.spec.allocations.values_mut().filter(|a| a.podref == podref) {
                entry.ipamclaim = Some(claim.to_string());
                marked = true;
            }
            if marked {
                let name = pool.metadata.name.clone().unwrap();
                pools.replace(&name, &PostParams::default(), &pool).await.unwrap();
            }
        }
        let claimed =
            self.pool_entries().await.into_iter().any(|a| a.podref == self.podref(name) && a.ipamclaim.is_some());
        assert!(claimed, "the entry records its IPAMClaim");
    }

    async fn pool_entries(&self) -> Vec<hereabouts_ipam::crd::IpAllocation> {
        let pools: Vec<IpPool> =
            Api::namespaced(self.admin.clone(), &self.ns).list(&Default::default()).await.unwrap().items;
        pools.into_iter().flat_map(|p| p.spec.allocations.into_values()).collect()
    }

    async fn delete_pod(&self, name: &str) {
        let params = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        Api::<Pod>::namespaced(self.admin.clone(), &self.ns).delete(name, &params).await.unwrap();
    }

    fn podref(&self, name: &str) -> String {
        format!("{}/{name}", self.ns)
    }

    async fn entries(&self) -> BTreeSet<String> {
        let pools: Vec<IpPool> =
            Api::namespaced(self.admin.clone(), &self.ns).list(&Default::default()).await.unwrap().items;
        pools.iter().flat_map(|p| p.spec.allocations.values().map(|a| a.podref.clone())).collect()
    }

    async fn reservations(&self) -> BTreeSet<String> {
        objects::reservation_holders(&self.admin, &self.ns).await
    }

    /// Takes the pool entries of `name` away, leaving its reservation: a reservation no entry accounts for.
    async fn drop_entries(&self, name: &str) {
        let api = Api::<IpPool>::namespaced(self.admin.clone(), &self.ns);
        for pool in api.list(&Default::default()).await.unwrap() {
            let podref = self.podref(name);
            let ops: Vec<Value> = pool
                .spec
                .allocations
                .iter()
                .filter(|(_, a)| a.podref == podref)
                .map(|(k, _)| json!({"op": "remove", "path": format!("/spec/allocations/{k}")}))
                .collect();
            let patch: Patch<()> = Patch::Json(serde_json::from_value(Value::Array(ops)).unwrap());
            api.patch(pool.metadata.name.as_deref().unwrap(), &PatchParams::default(), &patch).await.unwrap();
        }
    }

    /// Deletes the reservations of `name`, leaving its entries: a live entry missing its reservation.
    async fn drop_reservations(&self, name: &str) {
        let api = Api::<OverlappingRangeIpReservation>::namespaced(self.admin.clone(), &self.ns);
        for r in api.list(&Default::default()).await.unwrap() {
            if r.spec.podref == self.podref(name) {
                api.delete(r.metadata.name.as_deref().unwrap(), &DeleteParams::default()).await.unwrap();
            }
        }
    }

    /// An hour-old warm entry of `node` (its reserve: podref `hereabouts-warm:<node>`, naming no pod) and its
    /// reservation, in a pool of its own.
    async fn warm_entry(&self, node: &str) {
        let net: ipnet::IpNet = "198.18.74.0/24".parse().unwrap();
        let ip: std::net::IpAddr = "198.18.74.5".parse().unwrap();
        let an_hour_ago =
            (k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(3600)).to_string();
        let entry = IpAllocation {
            id: "warm-1".into(),
            podref: warm::podref(node),
            ifname: "warm-1".into(),
            node: Some(node.into()),
            allocated: Some(an_hour_ago),
            reserved: true,
            recorded_for: Some("warm-1".into()),
            ..Default::default()
        };
        let pool = mk_pool(&hereabouts_ipam::names::pool_name("", net), &net.to_string()).entry(5, entry).build();
        Api::<IpPool>::namespaced(self.admin.clone(), &self.ns).create(&PostParams::default(), &pool).await.unwrap();
        let name = hereabouts_ipam::names::reservation_name("", ip);
        let claim = mk_reservation(&name, &warm::podref(node)).container("warm-1").ifname("warm-1").build();
        let reservations = Api::<OverlappingRangeIpReservation>::namespaced(self.admin.clone(), &self.ns);
        reservations.create(&PostParams::default(), &claim).await.unwrap();
    }

    /// The warm entries of `node` the namespace's pools hold.
    async fn warm_entries(&self, node: &str) -> usize {
        let token = warm::podref(node);
        self.pool_entries().await.iter().filter(|a| a.podref == token).count()
    }

    async fn released_events(&self) -> usize {
        let api = Api::<k8s_openapi::api::events::v1::Event>::namespaced(self.admin.clone(), &self.ns);
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("AddressReleased"))
            .count()
    }
}

/// A job of the reconciler that needs a verb: run with every right, it is done; without the verb, it is not.
#[derive(Debug, Clone, Copy)]
enum Job {
    /// `/readyz` answers ok. Without the verb, the log shows a refusal on the line with this text, and `/readyz`
    /// never answers ok after it.
    Ready(&'static str),
    /// A pod of its node, deleted without CNI DEL, is released by the node loop (cron off). Without the verb the
    /// line with this text names the refusal and the entry stays.
    ReleaseDeletedPod(&'static str),
    /// The same, for a pool made after the reconciler started (without the verb, the pool cache never learns it).
    ReleaseInNewPool,
    /// A reservation of its node that no entry accounts for (made after it started) is released by the node
    /// loop (cron off). Without the verb: this text, and the reservation stays.
    ReleaseOrphan(&'static str),
    /// The cluster reconcile puts back the missing reservation of a live entry.
    RestoreReservation,
    /// The cluster reconcile (run by the Lease holder) releases a gone pod's address on another node.
    LeadAndReconcile,
    /// An `AddressReleased` Event on the pod whose address the node loop gave back.
    TellThePod,
    /// install-cni, as this identity, mints the CNI plugin's token.
    MintCniToken,
    /// An address held by two pods is reported on every cluster reconcile: the Recorder makes the repeats of
    /// one Event a series (a patch of it). Without the verb, the Event stays a single one.
    RepeatEvent,
    /// The leader as node-slice controller: a Node without a slice gets one, and the slice of a gone node whose
    /// pool is empty is freed with its pool deleted, while a gone node's slice with an entry stays. Without the
    /// verb: this text, and the gone node's empty slice stays.
    KeepSlices(&'static str),
    /// With `--assign-slices-to`, a Node that joins gets its slice when it appears (the Node watch), not at the next
    /// pass (a minute away). Without the verb: this text, and no slice in the seconds after.
    AssignOnJoin(&'static str),
    /// The same for a NodeSlicePool that appears (a first ADD made it) while the Node is there.
    AssignOnNewListing(&'static str),
    /// The leader reads hereabouts' CRDs and finds them keeping every field it writes. Without the verb: this
    /// text.
    CheckSchema(&'static str),
    /// A sticky StatefulSet entry whose StatefulSet does not exist, its pod deleted without CNI DEL, is released by
    /// the node loop. Without the verb: this text, and the entry stays (a StatefulSet that cannot be read keeps).
    ReleaseStickyOfGoneSet(&'static str),
    /// An IPAMClaim's entry whose claim does not exist, its pod deleted without CNI DEL, is released by the node
    /// loop. Without the verb: this text, and the entry stays (a claim that cannot be read keeps its address).
    ReleaseClaimedOfGoneClaim(&'static str),
    /// The warm entry (and reservation) of a Node that does not exist is released by the cluster reconcile once it
    /// has seen the Node missing for the grace period (1 s; passes every 2 s). Without the verb: this text, and
    /// the entry stays (a Node that cannot be read keeps its reserve).
    ReleaseGoneNodesWarm(&'static str),
    /// The node agent (`hereabouts-reconciler agent`, this identity its own, as the DaemonSet pod's account is in
    /// the cluster) fills a network's warm reserve after its first ADD, having checked that Whereabouts' reconciler
    /// runs nowhere. Without the verb: the reserve is refused, the reason naming this text, and stays empty.
    KeepWarmReserve(&'static str),
    /// The node agent, this identity its own, claims its node's slice of a network of slice mode as the network's
    /// NetworkAttachmentDefinition appears (the claim itself is the plugin's kubeconfig's). Without the verb: its
    /// log says it cannot watch them, the refusal naming this text, and no slice is claimed ahead.
    ClaimAhead(&'static str),
}

/// Waits for a log line holding `text` and "forbidden"; panics with the log after 30 s.
async fn wait_refusal(reconciler: &Reconciler, text: &str) {
    let seen = wait::until(Duration::from_secs(30), &format!("a refusal logged with {text:?}"), || async {
        reconciler.logs().lines().any(|l| l.contains(text) && l.to_lowercase().contains("forbidden")).then_some(())
    })
    .await;
    if let Err(e) = seen {
        panic!("{e}\n--- reconciler log ---\n{}", reconciler.logs());
    }
}

/// Polls `check` until it holds (within `within`), or, when `holds` is false, asserts that it stays false for
/// `within`. Returns the log for messages.
async fn eventually(
    within: Duration,
    what: &str,
    holds: bool,
    reconciler: Option<&Reconciler>,
    check: impl AsyncFn() -> bool,
) {
    let logs = || reconciler.map(Reconciler::logs).unwrap_or_default();
    let t0 = Instant::now();
    loop {
        let now = check().await;
        if holds && now {
            return;
        }
        assert!(holds || !now, "{what} happened without the verb:\n{}", logs());
        if t0.elapsed() > within {
            assert!(!holds, "{what}: not within {within:?}:\n{}", logs());
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `job` in `fx`; `granted` says whether the verb it needs is there.
async fn run_job(fx: &Fx, job: Job, granted: bool) {
    let gone = fx.podref("gone");
    match job {
        Job::Ready(text) => {
            let reconciler = fx.launch(NEVER);
            if granted {
                reconciler.wait_ready().await;
            } else {
                wait_refusal(&reconciler, text).await;
                let ready = || async { reconciler.get("/readyz").await.as_deref() == Some("ok") };
                eventually(Duration::from_secs(4), "/readyz ok", false, Some(&reconciler), ready).await;
            }
        }
        Job::ReleaseDeletedPod(text) | Job::ReleaseOrphan(text) if !granted => {
            let reconciler = fx.launch(NEVER);
            reconciler.wait_ready().await;
            fx.pod_with_address("gone", &fx.node).await;
            if matches!(job, Job::ReleaseDeletedPod(_)) {
                fx.delete_pod("gone").await;
                wait_refusal(&reconciler, text).await;
                let released = || async { !fx.entries().await.contains(&gone) };
                eventually(Duration::from_secs(5), "the release", false, Some(&reconciler), released).await;
            } else {
                fx.drop_entries("gone").await;
                wait_refusal(&reconciler, text).await;
                let released = || async { !fx.reservations().await.contains(&gone) };
                eventually(Duration::from_secs(6), "the orphan's release", false, Some(&reconciler), released).await;
            }
        }
        Job::ReleaseDeletedPod(_) | Job::ReleaseInNewPool => {
            let reconciler = fx.launch(NEVER);
            reconciler.wait_ready().await;
            fx.pod_with_address("gone", &fx.node).await;
            fx.delete_pod("gone").await;
            if !granted {
                wait_refusal(&reconciler, "pool watch failed").await;
            }
            let released = || async { !fx.entries().await.contains(&gone) };
            eventually(Duration::from_secs(10), "the release", granted, Some(&reconciler), released).await;
        }
        Job::ReleaseOrphan(_) => {
            let reconciler = fx.launch(NEVER);
            reconciler.wait_ready().await;
            fx.pod_with_address("gone", &fx.node).await;
            fx.drop_entries("gone").await;
            let released = || async { !fx.reservations().await.contains(&gone) };
            eventually(Duration::from_secs(15), "the orphan's release", true, Some(&reconciler), released).await;
        }
        Job::RestoreReservation => {
            let reconciler = fx.launch(OFTEN);
            reconciler.wait_ready().await;
            fx.pod_with_address("live", &fx.node).await;
            fx.drop_reservations("live").await;
            if !granted {
                wait_refusal(&reconciler, "restoring the reservation failed").await;
            }
            let live = fx.podref("live");
            let back = || async { fx.reservations().await.contains(&live) };
            eventually(Duration::from_secs(15), "the restore", granted, Some(&reconciler), back).await;
        }
        Job::LeadAndReconcile => {
            let reconciler = fx.launch(OFTEN);
            reconciler.wait_ready().await;
            fx.pod_with_address("gone", "another-node").await;
            fx.delete_pod("gone").await;
            if !granted {
                wait_refusal(&reconciler, "cannot hold the lease").await;
            }
            let released = || async { !fx.entries().await.contains(&gone) };
            eventually(
                Duration::from_secs(15),
                "the cluster reconcile's release",
                granted,
                Some(&reconciler),
                released,
            )
            .await;
            // The release is seen before the pass that made it logs its end.
            let ran = || async { reconciler.logs().contains("cluster reconcile done") };
            eventually(Duration::from_secs(5), "the cluster reconcile's end", granted, Some(&reconciler), ran).await;
        }
        Job::ReleaseStickyOfGoneSet(text) => {
            let reconciler = fx.launch(NEVER);
            reconciler.wait_ready().await;
            fx.sticky_pod_with_address("web-0", "web", &fx.node).await;
            fx.delete_pod("web-0").await;
            if !granted {
                wait_refusal(&reconciler, text).await;
            }
            let web = fx.podref("web-0");
            let released = || async { !fx.entries().await.contains(&web) };
            eventually(Duration::from_secs(10), "the sticky entry's release", granted, Some(&reconciler), released)
                .await;
        }
        Job::ReleaseClaimedOfGoneClaim(text) => {
            let reconciler = fx.launch(NEVER);
            reconciler.wait_ready().await;
            fx.claimed_pod_with_address("vm-launcher", "vm.net", &fx.node).await;
            fx.delete_pod("vm-launcher").await;
            if !granted {
                wait_refusal(&reconciler, text).await;
            }
            let vm = fx.podref("vm-launcher");
            let released = || async { !fx.entries().await.contains(&vm) };
            eventually(Duration::from_secs(10), "the claimed entry's release", granted, Some(&reconciler), released)
                .await;
        }
        Job::ReleaseGoneNodesWarm(text) => {
            let gone_node = format!("gone-{}", fx.node);
            fx.warm_entry(&gone_node).await;
            let reconciler = fx.launch(OFTEN);
            reconciler.wait_ready().await;
            if !granted {
                wait_refusal(&reconciler, text).await;
            }
            let released = || async { fx.warm_entries(&gone_node).await == 0 };
            // a gone Node's warm entries are freed a minute after it is first seen missing, at the soonest
            let within = match granted {
                true => hereabouts_ipam::reconcile::rules::WARM_GRACE_FLOOR + Duration::from_secs(15),
                false => Duration::from_secs(12),
            };
            eventually(within, "the gone node's warm entry released", granted, Some(&reconciler), released).await;
        }
        Job::KeepWarmReserve(text) => keep_warm_reserve(fx, text, granted).await,
        Job::ClaimAhead(text) => claim_ahead(fx, text, granted).await,
        Job::TellThePod => {
            let reconciler = fx.launch(NEVER);
            reconciler.wait_ready().await;
            fx.pod_with_address("gone", &fx.node).await;
            fx.delete_pod("gone").await;
            let released = || async { !fx.entries().await.contains(&gone) };
            eventually(Duration::from_secs(10), "the release", true, Some(&reconciler), released).await;
            let told = || async { fx.released_events().await > 0 };
            eventually(Duration::from_secs(4), "an AddressReleased Event", granted, Some(&reconciler), told).await;
        }
        Job::RepeatEvent => {
            fx.pod_with_address("a", &fx.node).await;
            fx.pod_with_address("b", &fx.node).await;
            // b also holds a's address (offset 1) in an overlapping /28, as a writer with overlap off would
            let pools = Api::<IpPool>::namespaced(fx.admin.clone(), &fx.ns);
            let wide = pools.list(&Default::default()).await.unwrap().items.remove(0).spec.range;
            let narrow: ipnet::IpNet = format!("{}/28", wide.split('/').next().unwrap()).parse().unwrap();
            let pool = mk_pool(&hereabouts_ipam::names::pool_name("", narrow), &narrow.to_string())
                .entry(1, mk_entry("c-b", &fx.podref("b")).ifname("net1"))
                .build();
            pools.create(&PostParams::default(), &pool).await.unwrap();
            let reconciler = fx.launch(OFTEN);
            reconciler.wait_ready().await;
            reconciler.wait_for_more("hereabouts_reconcile_runs_total", 3.0).await;
            let api = Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.admin.clone(), &fx.ns);
            let events = api.list(&Default::default()).await.unwrap().items;
            let on_a: Vec<_> = events
                .iter()
                .filter(|e| {
                    e.reason.as_deref() == Some("AddressConflict")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("a")
                })
                .collect();
            assert_eq!(on_a.len(), 1, "one AddressConflict Event on a: {on_a:?}\n{}", reconciler.logs());
            let repeats = on_a[0].series.as_ref().map_or(1, |s| s.count);
            assert_eq!(repeats >= 2, granted, "the Event's series counts the repeats: {:?}", on_a[0].series);
        }
        Job::KeepSlices(text) => {
            let nsp_api = Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns);
            mk_node(&fx.node).create(&fx.admin).await;
            let (gone, busy) = (format!("gone-{}", fx.ns), format!("busy-{}", fx.ns));
            // 64 slices: enough for every Node the parallel tests of this module create
            let mut allocations: Vec<NodeSliceAllocation> = (0..64)
                .map(|i| NodeSliceAllocation {
                    node_name: String::new(),
                    slice_range: format!("198.18.72.{}/30", i * 4),
                })
                .collect();
            allocations[0].node_name = gone.clone();
            allocations[1].node_name = busy.clone();
            let mut nsp = NodeSlicePool::new(
                "keep",
                NodeSlicePoolSpec { range: "198.18.72.0/24".into(), slice_size: "/30".into() },
            );
            nsp.status = Some(NodeSlicePoolStatus { allocations });
            nsp_api.create(&PostParams::default(), &nsp).await.unwrap();
            let pools = Api::<IpPool>::namespaced(fx.admin.clone(), &fx.ns);
            let empty = format!("{gone}-198.18.72.0-30");
            let held = format!("{busy}-198.18.72.4-30");
            for pool in [
                mk_pool(&empty, "198.18.72.0/30"),
                mk_pool(&held, "198.18.72.4/30").entry(1, mk_entry("c", &fx.podref("x")).ifname("net1")),
            ] {
                pools.create(&PostParams::default(), &pool.build()).await.unwrap();
            }
            // every Node is given a slice: here, the node loop's own
            let reconciler = fx.launch_with(NEVER, |o| o.extra_args.push("--assign-slices-to=".into()));
            reconciler.wait_ready().await;
            let owners = || async {
                let nsp = nsp_api.get("keep").await.unwrap();
                nsp.status.unwrap().allocations.into_iter().map(|a| a.node_name).collect::<Vec<_>>()
            };
            // assigned: the Node gets a slice; freed: the gone node's empty slice no longer is its own
            let assigned = || async { owners().await.contains(&fx.node) };
            let freed = || async { owners().await[0] != gone && pools.get_opt(&empty).await.unwrap().is_none() };
            if !granted {
                wait_refusal(&reconciler, text).await;
            }
            eventually(Duration::from_secs(8), "the gone node's empty slice freed", granted, Some(&reconciler), freed)
                .await;
            if granted || text.contains("delet") {
                eventually(Duration::from_secs(8), "a slice for the Node", true, Some(&reconciler), assigned).await;
            }
            assert_eq!(owners().await[1], busy, "a gone node's slice with an entry stays");
            assert!(pools.get_opt(&held).await.unwrap().is_some());
        }
        Job::AssignOnJoin(text) | Job::AssignOnNewListing(text) => {
            let joins = matches!(job, Job::AssignOnJoin(_));
            let nsp_api = Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns);
            let label = format!("assign-{}", fx.ns);
            let listing = || {
                let allocations: Vec<NodeSliceAllocation> = (0..64)
                    .map(|i| NodeSliceAllocation {
                        node_name: String::new(),
                        slice_range: format!("198.18.73.{}/30", i * 4),
                    })
                    .collect();
                let spec = NodeSlicePoolSpec { range: "198.18.73.0/24".into(), slice_size: "/30".into() };
                let mut nsp = NodeSlicePool::new("assign", spec);
                nsp.status = Some(NodeSlicePoolStatus { allocations });
                nsp
            };
            let node = mk_node(&fx.node).label(&label, "yes");
            if joins {
                nsp_api.create(&PostParams::default(), &listing()).await.unwrap();
            } else {
                node.clone().create(&fx.admin).await;
            }
            // the periodic pass is a minute away: only a watch gives the slice in the seconds that follow
            let reconciler = fx.launch_with(NEVER, |o| {
                o.slice_interval = "60s".into();
                o.extra_args.push(format!("--assign-slices-to={label}=yes"));
            });
            reconciler.wait_ready().await;
            if !granted {
                wait_refusal(&reconciler, text).await;
            }
            // the pass the watch that works makes at start (something is there) is over before anything appears
            wait::until(Duration::from_secs(20), "the first node-slice pass", || async {
                (reconciler.metric("hereabouts_node_slice_passes_total").await >= 1.0).then_some(())
            })
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
            if joins {
                node.create(&fx.admin).await;
            } else {
                nsp_api.create(&PostParams::default(), &listing()).await.unwrap();
            }
            let assigned = || async {
                let nsp = nsp_api.get("assign").await.unwrap();
                nsp.status.unwrap().allocations.iter().any(|a| a.node_name == fx.node)
            };
            eventually(Duration::from_secs(8), "a slice for the Node", granted, Some(&reconciler), assigned).await;
        }
        Job::CheckSchema(text) => {
            let reconciler = fx.launch(NEVER);
            reconciler.wait_ready().await;
            if granted {
                let checked = wait::until(Duration::from_secs(20), "the CRDs checked", || async {
                    (reconciler.logs().matches("the CRD keeps every field hereabouts writes").count() == 3)
                        .then_some(())
                })
                .await;
                if let Err(e) = checked {
                    panic!("{e}\n{}", reconciler.logs());
                }
            } else {
                wait_refusal(&reconciler, text).await;
            }
        }
        Job::MintCniToken => {
            // the token is bound to the node's Node
            mk_node(&fx.node).create(&fx.admin).await;
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("token"), fx.cluster.token(Identity::Node)).unwrap();
            std::fs::write(dir.path().join("ca.crt"), fx.cluster.ca_pem()).unwrap();
            let out = Command::new(workspace_bin("hereabouts-reconciler"))
                .env_clear()
                .env("NODE_NAME", &fx.node)
                .args(["install-cni", "--once", "--server", fx.cluster.server(), "--namespace", &fx.ns])
                .arg("--source-binary")
                .arg(workspace_bin("hereabouts"))
                .arg("--cni-bin-dir")
                .arg(dir.path().join("bin"))
                .arg("--cni-conf-dir")
                .arg(dir.path().join("net.d"))
                .arg("--token-file")
                .arg(dir.path().join("token"))
                .arg("--ca-file")
                .arg(dir.path().join("ca.crt"))
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.success(), granted, "install-cni:\n{stderr}");
            let kubeconfig = dir.path().join("net.d/hereabouts.d/hereabouts.kubeconfig");
            assert_eq!(kubeconfig.exists(), granted, "{stderr}");
            if !granted {
                assert!(stderr.contains("forbidden"), "the refusal is named:\n{stderr}");
            }
        }
    }
}

/// [`Job::KeepWarmReserve`]: the agent on the DaemonSet pod's identity, the network's CNI identity admin (not the
/// subject).
async fn keep_warm_reserve(fx: &Fx, text: &str, granted: bool) {
    const WARM: usize = 4;
    // an agent uses a reserve only while its Node exists (it reads it with this identity too)
    mk_node(&fx.node).create(&fx.admin).await;
    let own = fx.cluster.kubeconfig(Identity::Node, &fx.ns);
    let socket = fx.cluster.dir().join(format!("{}.sock", fx.ns));
    let agent = Agent::start_with(&socket, &fx.node, &[("KUBECONFIG", own.as_path())]).await;
    let ipam = json!({"range": "198.18.75.0/24", "node_slice_size": "/26", "warm_addresses": WARM});
    let config = netconf("1.1.0", "warm", &fx.cluster.kubeconfig(Identity::Admin, &fx.ns), ipam);
    // the network's first ADD on the node starts its reserve
    let out = Invocation::new("ADD", &config, &fx.ns, "first", "c-first")
        .with_env("NODENAME", &fx.node)
        .with_env("HEREABOUTS_AGENT_SOCKET", socket.to_str().unwrap())
        .run()
        .await;
    assert!(out.success, "{}\n{}\n--- agent log ---\n{}", out.stdout, out.stderr, agent.logs());
    if granted {
        let filled = wait::until(Duration::from_secs(30), "the warm reserve to fill", || async {
            (fx.warm_entries(&fx.node).await == WARM).then_some(())
        })
        .await;
        filled.unwrap_or_else(|e| panic!("{e}\n--- agent log ---\n{}", agent.logs()));
        return;
    }
    let said = ["warm reserve refused", "cannot tell whether Whereabouts' reconciler runs", text];
    refused(&agent, &format!("the reserve refused with {text:?}"), &said).await;
    let claimed = || async { fx.warm_entries(&fx.node).await > 0 };
    eventually(Duration::from_secs(3), "a warm entry", false, None, claimed).await;
}

/// Waits until a line of the agent's log has every one of `said` and names a refusal (forbidden).
async fn refused(agent: &Agent, what: &str, said: &[&str]) {
    let found = wait::until(Duration::from_secs(30), what, || async {
        let logs = agent.logs();
        let refused = |l: &&str| said.iter().all(|s| l.contains(s)) && l.to_lowercase().contains("forbidden");
        logs.lines().any(|l| refused(&l)).then_some(())
    })
    .await;
    found.unwrap_or_else(|e| panic!("{e}\n--- agent log ---\n{}", agent.logs()));
}

async fn claim_ahead(fx: &Fx, text: &str, granted: bool) {
    use hereabouts_tests::runtime;
    let crd = runtime::nad_crd_path().expect("the NetworkAttachmentDefinition CRD is missing: run hack/testenv.sh");
    runtime::install_nad_crd(&fx.admin, &crd).await.unwrap();
    let own = fx.cluster.kubeconfig(Identity::Node, &fx.ns);
    let socket = fx.cluster.dir().join(format!("{}-ahead.sock", fx.ns));
    let agent = Agent::start_claiming_ahead(&socket, &fx.node, &[("KUBECONFIG", own.as_path())]).await;
    let ipam = json!({"range": "198.18.76.0/24", "node_slice_size": "/26"});
    let config = netconf("1.1.0", "ahead", &fx.cluster.kubeconfig(Identity::Admin, &fx.ns), ipam);
    runtime::create_nad(&fx.admin, &fx.ns, "ahead", &config).await.unwrap();
    let listing = Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns);
    let held = || async {
        let pool = listing.get_opt("ahead").await.ok().flatten();
        pool.and_then(|p| p.status).is_some_and(|s| s.allocations.iter().any(|a| a.node_name == fx.node))
    };
    if granted {
        let claimed = wait::until(Duration::from_secs(30), "the node's slice claimed ahead", || async {
            held().await.then_some(())
        })
        .await;
        claimed.unwrap_or_else(|e| panic!("{e}\n--- agent log ---\n{}", agent.logs()));
        return;
    }
    refused(&agent, &format!("the watch refused with {text:?}"), &["cannot watch NetworkAttachmentDefinitions", text])
        .await;
    if text.contains("list") {
        // without list nothing is ever seen; without watch a relist after the backoff still sees the NAD
        eventually(Duration::from_secs(3), "a slice claimed ahead", false, None, held).await;
    }
}

/// One test per row: `name: scope, resource, verb => job`. Every verb the controller or the DaemonSet pod is
/// granted has a row or is listed in [`PENDING`] (`every_reconciler_verb_has_a_row_or_is_pending` checks).
macro_rules! reconciler_verbs {
    ($($name:ident: $scope:ident, $resource:literal, $verb:literal => $job:expr;)*) => {
        const RECONCILER_ROWS: &[(Scope, &str, &str)] = &[$((Scope::$scope, $resource, $verb)),*];
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let fx = Fx::new(&stringify!($name).replace('_', "-")[..20], "198.18.70.0/24", Some((Scope::$scope, $resource, $verb))).await;
                run_job(&fx, $job, false).await;
            }
        )*
    };
}

reconciler_verbs! {
    rec_needs_get_on_pods: Cluster, "pods", "get" => Job::ReleaseDeletedPod("cannot read the pod");
    rec_needs_list_on_pods: Cluster, "pods", "list" => Job::Ready("pod watch failed");
    rec_needs_watch_on_pods: Cluster, "pods", "watch" => Job::Ready("pod watch failed");
    rec_needs_create_on_events: Cluster, "events", "create" => Job::TellThePod;
    rec_needs_patch_on_events: Cluster, "events", "patch" => Job::RepeatEvent;
    rec_needs_get_on_pools: Role, "ippools", "get" => Job::ReleaseOrphan("cannot re-read");
    rec_needs_list_on_pools: Role, "ippools", "list" => Job::Ready("pool watch failed");
    rec_needs_watch_on_pools: Role, "ippools", "watch" => Job::ReleaseInNewPool;
    rec_needs_patch_on_pools: Role, "ippools", "patch" => Job::ReleaseDeletedPod("release failed");
    rec_needs_get_on_reservations: Role, "overlappingrangeipreservations", "get" => Job::ReleaseOrphan("cannot re-read");
    rec_needs_list_on_reservations: Role, "overlappingrangeipreservations", "list" => Job::Ready("reservation watch failed");
    rec_needs_watch_on_reservations: Role, "overlappingrangeipreservations", "watch" => Job::ReleaseOrphan("reservation watch failed");
    rec_needs_create_on_reservations: Role, "overlappingrangeipreservations", "create" => Job::RestoreReservation;
    rec_needs_delete_on_reservations: Role, "overlappingrangeipreservations", "delete" => Job::ReleaseOrphan("releasing the orphaned reservation failed");
    rec_needs_get_on_leases: Role, "leases", "get" => Job::LeadAndReconcile;
    rec_needs_update_on_leases: Role, "leases", "update" => Job::LeadAndReconcile;
    node_needs_create_on_tokens: NodeRole, "serviceaccounts/token", "create" => Job::MintCniToken;
    rec_needs_list_on_nodes: Cluster, "nodes", "list" => Job::KeepSlices("node list failed");
    rec_needs_list_on_node_slices: Role, "nodeslicepools", "list" => Job::KeepSlices("node slice pool list failed");
    rec_needs_patch_on_node_slices: Role, "nodeslicepools", "patch" => Job::KeepSlices("moving the slice failed");
    rec_needs_delete_on_pools: Role, "ippools", "delete" => Job::KeepSlices("deleting the empty slice pool failed");
    rec_needs_watch_on_nodes: Cluster, "nodes", "watch" => Job::AssignOnJoin("node watch failed");
    rec_needs_watch_on_node_slices: Role, "nodeslicepools", "watch" => Job::AssignOnNewListing("node slice pool watch failed");
    rec_needs_get_on_crds: Cluster, "customresourcedefinitions", "get" => Job::CheckSchema("cannot read the CRD");
    rec_needs_get_on_statefulsets: Cluster, "statefulsets", "get" => Job::ReleaseStickyOfGoneSet("cannot read the StatefulSet");
    rec_needs_get_on_nodes: Cluster, "nodes", "get" => Job::ReleaseGoneNodesWarm("cannot read the Node");
    rec_needs_get_on_ipamclaims: Cluster, "ipamclaims", "get" => Job::ReleaseClaimedOfGoneClaim("cannot read the IPAMClaim");
    agent_needs_list_on_daemonsets: NodeCluster, "daemonsets", "list" => Job::KeepWarmReserve("list DaemonSets");
    agent_needs_list_on_deployments: NodeCluster, "deployments", "list" => Job::KeepWarmReserve("list Deployments");
    agent_needs_list_on_cronjobs: NodeCluster, "cronjobs", "list" => Job::KeepWarmReserve("list CronJobs");
    agent_needs_list_on_nads: NodeCluster, "network-attachment-definitions", "list" => Job::ClaimAhead("cannot list");
    agent_needs_watch_on_nads: NodeCluster, "network-attachment-definitions", "watch" => Job::ClaimAhead("cannot watch");
}

/// Granted verbs no row proves yet, and why (identity, resource, verb, why). Adding a row means removing the entry
/// here.
const PENDING: &[(Identity, &str, &str, &str)] = &[(
    Identity::Node,
    "nodes",
    "get",
    "the agent reads its Node so as to stop taking warm addresses once the Node is deleted; without the right \
     it never learns, and nothing it does today shows that short of deleting the Node under a running agent",
)];

#[test]
fn every_reconciler_verb_has_a_row_or_is_pending() {
    for (id, scopes) in
        [(Identity::Restricted, [Scope::Role, Scope::Cluster]), (Identity::Node, [Scope::NodeRole, Scope::NodeCluster])]
    {
        let rows = RECONCILER_ROWS.iter().filter(|(scope, _, _)| scopes.contains(scope)).map(|(_, r, v)| (*r, *v));
        let pending = PENDING.iter().filter(|(of, ..)| *of == id).map(|(_, r, v, _)| (*r, *v));
        let all: Vec<(String, String)> = rows.chain(pending).map(|(r, v)| (r.to_string(), v.to_string())).collect();
        let distinct: BTreeSet<(String, String)> = all.iter().cloned().collect();
        assert_eq!(distinct.len(), all.len(), "{id:?}: no verb is both a row and pending, nor two rows");
        let granted: BTreeSet<(String, String)> = deploy::namespaced_rights(id)
            .into_iter()
            .chain(deploy::cluster_rights(id))
            .map(|r| (r.resource, r.verb))
            .collect();
        assert_eq!(distinct, granted, "{id:?}");
    }
}

/// The positive control of every row: with exactly the manifest's rights, each job is done.
macro_rules! reconciler_jobs {
    ($($name:ident => $job:expr;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let fx = Fx::new(&stringify!($name).replace('_', "-")[..20], "198.18.71.0/24", None).await;
                run_job(&fx, $job, true).await;
            }
        )*
    };
}

reconciler_jobs! {
    rec_with_its_rights_gets_ready => Job::Ready("");
    rec_with_its_rights_releases_a_deleted_pod => Job::ReleaseDeletedPod("");
    rec_with_its_rights_releases_in_a_new_pool => Job::ReleaseInNewPool;
    rec_with_its_rights_releases_an_orphan => Job::ReleaseOrphan("");
    rec_with_its_rights_restores_a_reservation => Job::RestoreReservation;
    rec_with_its_rights_leads_and_reconciles => Job::LeadAndReconcile;
    rec_with_its_rights_tells_the_pod => Job::TellThePod;
    node_with_its_rights_mints_the_cni_token => Job::MintCniToken;
    rec_with_its_rights_makes_a_repeated_event_a_series => Job::RepeatEvent;
    rec_with_its_rights_keeps_node_slices => Job::KeepSlices("");
    rec_with_its_rights_checks_the_crds => Job::CheckSchema("");
    rec_with_its_rights_gives_a_joining_node_its_slice => Job::AssignOnJoin("");
    rec_with_its_rights_gives_a_new_node_slice_pools_slices => Job::AssignOnNewListing("");
    rec_with_its_rights_releases_a_gone_sets_sticky_address => Job::ReleaseStickyOfGoneSet("");
    rec_with_its_rights_releases_a_gone_nodes_warm_entry => Job::ReleaseGoneNodesWarm("");
    rec_with_its_rights_releases_a_gone_claims_address => Job::ReleaseClaimedOfGoneClaim("");
    agent_with_its_rights_keeps_a_warm_reserve => Job::KeepWarmReserve("");
    agent_with_its_rights_claims_a_slice_ahead => Job::ClaimAhead("");
}

// ---------------------------------------------------------------------------------------------------------------
// The Lease it may not create, and the endpoints it serves

/// Without the manifest's Lease, the reconciler (which may not create Leases) says so once, keeps running and
/// retrying, and leads as soon as the Lease exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_lease_is_reported_once_and_waited_for() {
    let fx = Fx::new("id-nolease", "198.18.72.0/24", None).await;
    Api::<Lease>::namespaced(fx.admin.clone(), &fx.ns)
        .delete(deploy::LEASE_NAME, &DeleteParams::default())
        .await
        .unwrap();
    let reconciler = fx.launch(OFTEN);
    reconciler.wait_ready().await;
    wait_refusal(&reconciler, "may not create it").await;
    reconciler.wait_for_more("hereabouts_lease_failures_total", 3.0).await;
    let logs = reconciler.logs();
    assert_eq!(logs.matches("may not create it").count(), 1, "said once:\n{logs}");
    assert!(logs.contains("apply the Lease of deploy/daemonset.yaml"), "{logs}");
    assert!(!logs.contains("cluster reconcile done"), "not the leader:\n{logs}");
    assert_eq!(reconciler.get("/healthz").await.as_deref(), Some("ok"), "still running:\n{logs}");

    deploy::create_lease(&fx.admin, &fx.ns).await;
    wait::until(Duration::from_secs(20), "the cluster reconcile", || async {
        reconciler.logs().contains("cluster reconcile done").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    assert!(reconciler.logs().contains("the lease can be read and written again"));
    let lease = Api::<Lease>::namespaced(fx.admin.clone(), &fx.ns).get(deploy::LEASE_NAME).await.unwrap();
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    assert_eq!(holder, format!("reconciler-{}", fx.node));
}

/// By default `/healthz`, `/readyz` and `/metrics` are served on 127.0.0.1:9300 only: 127.0.0.2 is the same
/// loopback interface, and a listener on 0.0.0.0 would answer there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_listen_on_loopback_by_default() {
    let help = Command::new(workspace_bin("hereabouts-reconciler")).args(["run", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("[default: 127.0.0.1:9300]"));
    let fx = Fx::new("id-listen", "198.18.73.0/24", None).await;
    let log = fx.cluster.dir().join(format!("reconciler-default-listen-{}.log", fx.ns));
    // no --listen
    let mut child = Command::new(workspace_bin("hereabouts-reconciler"))
        .args(["run", "--node-name", &fx.node, "--namespace", &fx.ns, "--cron-expression", NEVER])
        .arg("--kubeconfig")
        .arg(fx.cluster.kubeconfig(Identity::Restricted, &fx.ns))
        .arg("--config-dir")
        .arg(fx.cluster.dir().join("no-such-config-dir"))
        .arg("--flat-file")
        .arg(fx.cluster.dir().join("no-such-flat-file"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let reach = |ip: [u8; 4]| TcpStream::connect_timeout(&SocketAddr::from((ip, 9300)), Duration::from_secs(2));
    let bound = wait::until(Duration::from_secs(20), "the listener", || async {
        read_log().lines().find(|l| l.contains("serving /healthz")).map(str::to_string)
    })
    .await;
    let (loopback, other) = (reach([127, 0, 0, 1]), reach([127, 0, 0, 2]));
    let _ = child.kill();
    let _ = child.wait();
    let line = bound.unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    assert!(line.contains("127.0.0.1:9300"), "{line}");
    loopback.unwrap_or_else(|e| panic!("127.0.0.1:9300: {e}\n{}", read_log()));
    let refused = other.expect_err("127.0.0.2:9300 must not answer");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
}
