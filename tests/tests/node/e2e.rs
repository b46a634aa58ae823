//! End to end: the real control plane, the real CNI reference plugins and cnitool, real network namespaces.
//! Simulated nodes ([`hereabouts_tests::netns::Fabric`]) share one L2 fabric; each pod's `net1` is a macvlan
//! on its node's fabric link, its address given by hereabouts, run through `cnitool` inside the node's namespace
//! ([`hereabouts_tests::runtime`]). Needs root.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use hereabouts_ipam::crd::IpPool;
use hereabouts_tests::netns::{self, Fabric, Netns};
use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
use hereabouts_tests::runtime::{self, CniRuntime, PodRef, result_ips};
use hereabouts_tests::{Identity, TestCluster, deploy, wait};
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

static RBAC: OnceCell<()> = OnceCell::const_new();

/// One pod: its namespace, node and what ADD gave it.
struct Pod {
    name: String,
    node: usize,
    netns: Netns,
    who: PodRef,
    ips: Vec<IpAddr>,
}

/// A namespace of the API server, a fabric of nodes with relays to it, and a runtime directory.
struct E2e {
    cluster: &'static TestCluster,
    ns: String,
    admin: Client,
    kubeconfig: std::path::PathBuf,
    runtime: CniRuntime,
    fabric: Fabric,
}

fn api_port(cluster: &TestCluster) -> u16 {
    cluster.server().rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse().ok()).expect("the API port")
}

impl E2e {
    /// `nodes` nodes; the CNI's identity is the restricted one bound by the ClusterRole of deploy/.
    async fn new(prefix: &str, nodes: usize) -> Self {
        assert!(netns::is_root(), "the end-to-end tests make network namespaces: run them as root");
        let cluster = TestCluster::get();
        let admin = cluster.admin().await;
        RBAC.get_or_init(|| async { deploy::apply_rbac(admin.clone()).await }).await;
        let ns = cluster.namespace(prefix).await;
        let kubeconfig = cluster.kubeconfig(Identity::Cni, &ns);
        let names: Vec<String> = (0..nodes).map(|i| format!("{ns}-node{i}")).collect();
        let fabric = Fabric::new(&names, Some(api_port(cluster))).unwrap();
        let runtime = CniRuntime::new().unwrap();
        Self { cluster, ns, admin, kubeconfig, runtime, fabric }
    }

    /// The macvlan network `name` with hereabouts' `ipam` (written once per node master; all are `fab0`).
    fn network(&self, name: &str, ipam: Value) {
        self.runtime.write_macvlan(name, &self.kubeconfig, &self.fabric.nodes[0].master, ipam).unwrap();
    }

    /// Creates the Pod object on `node`, its namespace, and runs ADD of `network` through cnitool.
    async fn pod(&self, network: &str, name: &str, node: usize) -> Pod {
        let obj = runtime::create_pod(&self.admin, &self.ns, name, &self.fabric.nodes[node].name, &[]).await.unwrap();
        let who = PodRef { namespace: self.ns.clone(), name: name.into(), uid: obj.metadata.uid.unwrap() };
        let netns = self.fabric.pod_netns(name).unwrap();
        let result = self
            .runtime
            .add(&self.fabric.nodes[node], network, &netns, &who)
            .unwrap_or_else(|e| panic!("{e:#}\n--- hereabouts log ---\n{}", self.log(network)));
        Pod { name: name.into(), node, netns, who, ips: result_ips(&result) }
    }

    fn log(&self, network: &str) -> String {
        std::fs::read_to_string(self.runtime.log_file(network)).unwrap_or_default()
    }

    async fn pool(&self, name: &str) -> IpPool {
        Api::<IpPool>::namespaced(self.admin.clone(), &self.ns).get(name).await.unwrap()
    }

    async fn holders(&self, pool: &str) -> BTreeSet<String> {
        hereabouts_tests::objects::pool_holders(&self.admin, &self.ns, pool).await
    }

    async fn reservations(&self) -> BTreeSet<String> {
        hereabouts_tests::objects::reservation_holders(&self.admin, &self.ns).await
    }

    fn podref(&self, name: &str) -> String {
        format!("{}/{name}", self.ns)
    }

    /// `per_node` pods on each node of network `network`, in turn over the nodes.
    async fn pods(&self, network: &str, per_node: usize) -> Vec<Pod> {
        let mut pods = Vec::new();
        for i in 0..per_node {
            for node in 0..self.fabric.nodes.len() {
                pods.push(self.pod(network, &format!("p{node}-{i}"), node).await);
            }
        }
        pods
    }
}

/// Every pod's `net1` holds exactly what ADD returned, all distinct; each pod reaches one pod on every other
/// node (IPv4 echo).
fn check_addresses_and_reach(pods: &[Pod], families: usize) {
    let mut seen = BTreeSet::new();
    for pod in pods {
        assert_eq!(pod.ips.len(), families, "{}: {:?}", pod.name, pod.ips);
        let on_link: BTreeSet<IpAddr> = pod.netns.addresses("net1").unwrap().into_iter().collect();
        assert_eq!(on_link, pod.ips.iter().copied().collect(), "{}'s net1 holds its allocated addresses", pod.name);
        for ip in &pod.ips {
            assert!(seen.insert(*ip), "{ip} given twice");
        }
    }
    for pod in pods {
        let mut others = BTreeMap::new();
        for other in pods.iter().filter(|o| o.node != pod.node) {
            others.entry(other.node).or_insert(other);
        }
        for other in others.values() {
            let to = *other.ips.iter().find(|ip| ip.is_ipv4()).unwrap();
            assert!(
                netns::ping(&pod.netns.name, to, Duration::from_secs(5)).unwrap(),
                "{} (node {}) does not reach {} ({to}, node {})",
                pod.name,
                pod.node,
                other.name,
                other.node
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_of_eight_pods_get_distinct_addresses_on_their_interfaces_and_reach_each_other() {
    let e = E2e::new("e2e-v4", 3).await;
    e.network("e2e-v4", json!({"range": "198.18.60.0/24"}));
    let pods = e.pods("e2e-v4", 8).await;
    check_addresses_and_reach(&pods, 1);
    let pool = e.pool("198.18.60.0-24").await;
    assert_eq!(pool.spec.allocations.len(), 24);
    let holders: BTreeSet<String> = pods.iter().map(|p| e.podref(&p.name)).collect();
    assert_eq!(e.holders("198.18.60.0-24").await, holders);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_pods_hold_an_address_of_each_family_on_their_interfaces() {
    let e = E2e::new("e2e-dual", 3).await;
    e.network("e2e-dual", json!({"range": "198.18.61.0/24", "ipRanges": [{"range": "2001:db8:61::/64"}]}));
    let pods = e.pods("e2e-dual", 8).await;
    for pod in &pods {
        assert!(pod.ips[0].is_ipv4() && pod.ips[1].is_ipv6(), "{}: {:?}", pod.name, pod.ips);
    }
    check_addresses_and_reach(&pods, 2);
    // IPv6 too, once duplicate address detection has let the addresses go (the echo retries until then)
    let (from, to) = (&pods[0], &pods[1]);
    assert_ne!(from.node, to.node);
    assert!(
        netns::ping(&from.netns.name, to.ips[1], Duration::from_secs(10)).unwrap(),
        "{} does not reach {} over IPv6",
        from.name,
        to.name
    );
    assert_eq!(e.pool("198.18.61.0-24").await.spec.allocations.len(), 24);
    assert_eq!(e.pool("2001-db8-61---64").await.spec.allocations.len(), 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_through_the_runtime_removes_the_interface_and_frees_the_address_twice_over() {
    let e = E2e::new("e2e-del", 2).await;
    e.network("e2e-del", json!({"range": "198.18.63.0/24"}));
    let keep = e.pod("e2e-del", "keep", 1).await;
    let gone = e.pod("e2e-del", "gone", 0).await;
    assert!(gone.netns.has_link("net1"));
    assert!(e.holders("198.18.63.0-24").await.contains(&e.podref("gone")));
    assert!(e.reservations().await.contains(&e.podref("gone")));

    let node = &e.fabric.nodes[gone.node];
    e.runtime.del(node, "e2e-del", &gone.netns, &gone.who).unwrap();
    assert!(!gone.netns.has_link("net1"), "DEL removes net1");
    assert_eq!(e.holders("198.18.63.0-24").await, BTreeSet::from([e.podref("keep")]));
    assert_eq!(e.reservations().await, BTreeSet::from([e.podref("keep")]));
    // the runtime may repeat DEL: it succeeds and changes nothing
    e.runtime.del(node, "e2e-del", &gone.netns, &gone.who).unwrap();
    assert_eq!(e.holders("198.18.63.0-24").await, BTreeSet::from([e.podref("keep")]));

    // the freed address is the next one given, and the kept pod is untouched
    let again = e.pod("e2e-del", "again", 0).await;
    assert_eq!(again.ips, gone.ips);
    assert_eq!(keep.netns.addresses("net1").unwrap(), keep.ips);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_by_force_without_del_is_released_by_the_reconciler() {
    let e = E2e::new("e2e-force", 2).await;
    e.network("e2e-force", json!({"range": "198.18.64.0/24"}));
    let pool = "198.18.64.0-24";
    let node = e.fabric.nodes[0].name.clone();
    let _reconciler = Reconciler::start(e.cluster, &ReconcilerOptions::new(&node, &e.ns)).await;
    let live = e.pod("e2e-force", "live", 0).await;
    let other = e.pod("e2e-force", "other-node", 1).await;
    let doomed = e.pod("e2e-force", "doomed", 0).await;

    // the sandbox disappears and the pod is force-deleted: no CNI DEL ever runs
    doomed.netns.delete().unwrap();
    runtime::force_delete_pod(&e.admin, &e.ns, "doomed").await.unwrap();
    let podref = e.podref("doomed");
    wait::until(Duration::from_secs(20), "the reconciler to release the force-deleted pod", || async {
        (!e.holders(pool).await.contains(&podref) && !e.reservations().await.contains(&podref)).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(e.holders(pool).await, BTreeSet::from([e.podref("live"), e.podref("other-node")]));
    assert!(netns::ping(&live.netns.name, other.ips[0], Duration::from_secs(5)).unwrap());
    // the address goes to the next pod
    let next = e.pod("e2e-force", "next", 0).await;
    assert_eq!(next.ips, doomed.ips);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multus_attaches_hereabouts_networks_named_by_the_pod_annotation_with_an_exact_address() {
    // the runtime sends `IgnoreUnknown=1` as containerd does; Multus prepends its own `IgnoreUnknown=true`
    let e = E2e::new("e2e-multus", 2).await;
    runtime::install_nad_crd(&e.admin, &hereabouts_tests::testenv::tool("networks-crd.yaml")).await.unwrap();
    let ipam = |name: &str| {
        json!({
            "type": "hereabouts", "range": "198.18.62.0/24",
            "kubernetes": {"kubeconfig": e.kubeconfig}, "log_file": e.runtime.log_file(name),
        })
    };
    let pool_nad = json!({"cniVersion": "1.0.0", "name": "pool-net", "type": "macvlan", "master": "fab0",
        "mode": "bridge", "ipam": ipam("pool-net")});
    let exact_nad = json!({"cniVersion": "1.0.0", "name": "exact-net", "type": "macvlan", "master": "fab0",
        "mode": "bridge", "capabilities": {"ips": true}, "ipam": ipam("exact-net")});
    runtime::create_nad(&e.admin, &e.ns, "pool-net", &pool_nad).await.unwrap();
    runtime::create_nad(&e.admin, &e.ns, "exact-net", &exact_nad).await.unwrap();
    let admin_kubeconfig = e.cluster.kubeconfig(Identity::Admin, &e.ns);
    let multus = json!({
        "type": "multus", "kubeconfig": admin_kubeconfig,
        "cniDir": e.runtime.dir().join("multus-cache"), "confDir": e.runtime.dir().join("multus.d"),
        "binDir": e.runtime.bin_dir(), "logFile": e.runtime.log_file("multus"), "logLevel": "verbose",
        "readinessindicatorfile": "",
        "delegates": [{"cniVersion": "1.0.0", "name": "cluster", "plugins": [{"type": "loopback"}]}],
    });
    e.runtime.write_conflist("multus-net", vec![multus]).unwrap();
    let networks = "k8s.v1.cni.cncf.io/networks";

    let mut pods = Vec::new();
    for (name, node, annotation) in [
        ("via-pool", 0, json!([{"name": "pool-net"}])),
        ("via-exact", 1, json!([{"name": "exact-net", "ips": ["198.18.62.77/24"]}])),
    ] {
        let obj = runtime::create_pod(
            &e.admin,
            &e.ns,
            name,
            &e.fabric.nodes[node].name,
            &[(networks, annotation.to_string())],
        )
        .await
        .unwrap();
        let who = PodRef { namespace: e.ns.clone(), name: name.into(), uid: obj.metadata.uid.unwrap() };
        let netns = e.fabric.pod_netns(name).unwrap();
        e.runtime.add_as(&e.fabric.nodes[node], "multus-net", &netns, &who, "eth0").unwrap_or_else(|err| {
            panic!("{err:#}\n--- multus log ---\n{}", std::fs::read_to_string(e.runtime.log_file("multus")).unwrap())
        });
        let on_link = netns.addresses("net1").unwrap();
        pods.push(Pod { name: name.into(), node, netns, who, ips: on_link });
    }
    let (via_pool, via_exact) = (&pods[0], &pods[1]);
    assert_eq!(via_pool.ips, vec!["198.18.62.1".parse::<IpAddr>().unwrap()], "the lowest free address");
    assert_eq!(via_exact.ips, vec!["198.18.62.77".parse::<IpAddr>().unwrap()], "the address the pod asked for");
    let pool = e.pool("198.18.62.0-24").await;
    assert_eq!(pool.spec.allocations["1"].podref, e.podref("via-pool"));
    assert_eq!(pool.spec.allocations["77"].podref, e.podref("via-exact"));
    assert!(netns::ping(&via_pool.netns.name, via_exact.ips[0], Duration::from_secs(5)).unwrap());

    // Multus wrote the network-status annotation naming the address
    let status = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(e.admin.clone(), &e.ns)
        .get("via-exact")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
        .get("k8s.v1.cni.cncf.io/network-status")
        .cloned()
        .unwrap_or_default();
    assert!(status.contains("198.18.62.77"), "network-status: {status}");

    // DEL through Multus gives both addresses back
    for pod in &pods {
        e.runtime.del_as(&e.fabric.nodes[pod.node], "multus-net", &pod.netns, &pod.who, "eth0").unwrap();
        assert!(!pod.netns.has_link("net1"));
    }
    assert!(e.pool("198.18.62.0-24").await.spec.allocations.is_empty());
    assert!(e.reservations().await.is_empty());
}

#[test]
fn namespaces_are_removed_on_panic_and_those_of_a_killed_run_are_swept() {
    assert!(netns::is_root(), "the end-to-end tests make network namespaces: run them as root");
    let names = vec!["a".to_string(), "b".to_string()];
    let made = std::panic::catch_unwind(|| {
        let fabric = Fabric::new(&names, None).unwrap();
        let pod = fabric.pod_netns("p").unwrap();
        let mut all: Vec<String> = fabric.nodes.iter().map(|n| n.netns.name.clone()).collect();
        all.extend([fabric.bridge.name.clone(), pod.name.clone()]);
        assert!(all.iter().all(|n| netns::list().contains(n)));
        std::panic::panic_any(all)
    })
    .unwrap_err();
    let made = made.downcast::<Vec<String>>().unwrap();
    let left = netns::list();
    assert!(made.iter().all(|n| !left.contains(n)), "left after a panic: {left:?}");

    // a namespace of a process that cannot exist (beyond the kernel's largest pid)
    let stale = Netns::new(&format!("{}4194305-0-node0", netns::PREFIX)).unwrap();
    netns::sweep_stale();
    assert!(!stale.exists(), "the sweep removes what a killed run left");
    let mine = Netns::new(&format!("{}{}-999-mine", netns::PREFIX, std::process::id())).unwrap();
    netns::sweep_stale();
    assert!(mine.exists(), "the sweep leaves this process's own namespaces");
}
