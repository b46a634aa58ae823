//! Adaptive slices (`min_node_slice_size`) on the real control plane: a node's first slice is cut small out of a
//! free one, its next ones are larger, Whereabouts' CNI allocates in a cut slice as it is listed, a lost answer of a
//! cut is read back, and the range fills to its last address with the NodeSlicePool a partition of it throughout.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use hereabouts_ipam::crd::NodeSlicePool;
use hereabouts_tests::fixture::CniFixture;
use ipnet::IpNet;
use serde_json::json;

use super::slices::{add_all, assert_distinct_and_reserved, held, node_slices, owners};

/// The slices listed, by range, with their owners; asserts they cover `range` exactly, no address twice.
fn partition(nsp: &NodeSlicePool, range: &str) -> BTreeMap<IpNet, String> {
    let range: IpNet = range.parse().unwrap();
    let listed: BTreeMap<IpNet, String> = owners(nsp).into_iter().map(|(s, n)| (s.parse().unwrap(), n)).collect();
    let mut covered: u128 = 0;
    let mut last: Option<IpNet> = None;
    for cidr in listed.keys() {
        assert!(range.contains(&cidr.network()) && cidr.prefix_len() >= range.prefix_len(), "{cidr} outside {range}");
        if let Some(before) = last {
            assert!(!before.contains(&cidr.network()), "{cidr} overlaps {before}: {listed:?}");
        }
        covered += 1u128 << (32 - cidr.prefix_len());
        last = Some(*cidr);
    }
    assert_eq!(covered, 1u128 << (32 - range.prefix_len()), "the slices cover {range}: {listed:?}");
    listed
}

fn of_node(listed: &BTreeMap<IpNet, String>, node: &str) -> Vec<IpNet> {
    listed.iter().filter(|(_, n)| n.as_str() == node).map(|(c, _)| *c).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_starts_with_a_small_slice_grows_and_the_range_fills() {
    let fx = CniFixture::new("slice-adapt").await;
    const RANGE: &str = "198.18.90.0/26";
    let ipam = json!({"range": RANGE, "node_slice_size": "/28", "min_node_slice_size": "/30"});
    let config = fx.netconf("1.1.0", "adapt", ipam);

    // nine nodes where fixed /28 slices give four of them one: each gets a /30 of its own
    let first = fx.invocation("ADD", &config, "wb-pod-0", "c-wb-0").with_env("NODENAME", "wb-0").run().await;
    assert!(first.success, "{}", first.stdout);
    let pods: Vec<(String, String)> = (0..24).map(|i| (format!("pod-{i}"), format!("node-{}", i % 8))).collect();
    let outputs = add_all(&fx, &config, &pods, 12).await;
    for (out, (pod, _)) in outputs.iter().zip(&pods) {
        assert!(out.success, "{pod}: {}\n{}", out.stdout, out.stderr);
    }
    let listed = partition(&node_slices(&fx, "adapt").await, RANGE);
    for (out, (pod, node)) in outputs.iter().zip(&pods) {
        let mine = of_node(&listed, node);
        assert_eq!(mine.len(), 1, "{node}: {listed:?}");
        assert_eq!(mine[0].prefix_len(), 30, "{node}'s first slice is the smallest: {listed:?}");
        assert!(mine[0].contains(&out.ips()[0]), "{pod} on {node} from its own slice: {:?} {listed:?}", out.ips());
    }

    // Whereabouts' CNI on wb-0 reads the cut NodeSlicePool as it is: its node's /30, its pool named as Whereabouts
    // names per-node pools
    let wb_slice = of_node(&listed, "wb-0");
    assert_eq!(wb_slice.len(), 1, "{listed:?}");
    let wb = hereabouts_tests::plugin::whereabouts(fx.cluster, &fx.ns, "ADD", &config, "wb-pod-1", "c-wb-1")
        .with_env("NODENAME", "wb-0")
        .run()
        .await;
    assert!(wb.success, "Whereabouts: {}\n{}", wb.stdout, wb.stderr);
    assert!(wb_slice[0].contains(&wb.ips()[0]), "{:?} from {}", wb.ips(), wb_slice[0]);
    let wb_pool = format!("wb-0-{}", wb_slice[0].to_string().replace('/', "-"));
    assert_eq!(fx.pool(&wb_pool).await.spec.allocations.len(), 2, "both plugins wrote wb-0's slice pool");

    // node-0 fills its /30 and grows: its next slice is larger
    for i in 0..6 {
        let pod = format!("more-{i}");
        let out = fx.invocation("ADD", &config, &pod, &format!("c-{pod}")).with_env("NODENAME", "node-0").run().await;
        assert!(out.success, "{pod}: {}", out.stdout);
    }
    let listed = partition(&node_slices(&fx, "adapt").await, RANGE);
    let grown = of_node(&listed, "node-0");
    assert!(grown.len() >= 2 && grown.iter().any(|c| c.prefix_len() < 30), "node-0 grew: {grown:?} of {listed:?}");
    assert!(grown.iter().all(|c| c.prefix_len() >= 28), "never past node_slice_size: {grown:?}");

    // the range fills to its last address (62: the /26's network and broadcast are not hosts); the next ADD is
    // refused with "exhausted"; no address twice
    let mut taken = 1 + 24 + 1 + 6;
    let refused = loop {
        let pod = format!("fill-{taken}");
        let node = format!("node-{}", taken % 8);
        let out = fx.invocation("ADD", &config, &pod, &format!("c-{pod}")).with_env("NODENAME", &node).run().await;
        if !out.success {
            break out;
        }
        taken += 1;
        assert!(taken <= 62, "more addresses than the range has");
    };
    assert_eq!(taken, 62, "full before the range was: {}", refused.stdout);
    assert_eq!(refused.error_code(), 100, "{}", refused.stdout);
    let pools = fx.pools().await;
    let all = held(&pools);
    let distinct: BTreeSet<IpAddr> = all.iter().map(|(ip, _)| *ip).collect();
    assert_eq!((all.len(), distinct.len()), (62, 62), "an address is held twice: {all:?}");
    let listed = partition(&node_slices(&fx, "adapt").await, RANGE);
    assert!(listed.values().all(|n| !n.is_empty()), "every slice claimed once the range is full: {listed:?}");
}

/// The answer of the patch that cuts a node's first slice out of a free one is lost after the server applied it:
/// the ADD reads the NodeSlicePool back, finds the slice its own, and ends with one slice, one entry and its
/// reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_of_a_cut_is_read_back() {
    use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
    let fx = CniFixture::new("slice-cutlost").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let kubeconfig = proxy.kubeconfig(fx.cluster, hereabouts_tests::Identity::Admin, &fx.ns);
    const RANGE: &str = "198.18.91.0/24";
    let ipam = json!({"range": RANGE, "node_slice_size": "/26", "min_node_slice_size": "/29"});
    let config = hereabouts_tests::plugin::netconf("1.1.0", "cutlost", &kubeconfig, ipam);
    proxy.add_rule(Rule::nth(Verb::Patch, "nodeslicepools", 1, Action::DropResponse));
    let out = fx.invocation("ADD", &config, "web", "c1").with_env("NODENAME", "node-c").run().await;
    assert!(out.success, "{}\n{}", out.stdout, out.stderr);
    let dropped =
        proxy.seen().iter().any(|s| s.is(Verb::Patch, "nodeslicepools") && s.action == Some(Action::DropResponse));
    assert!(dropped, "the cut's answer lost: {:?}", proxy.seen());
    let listed = partition(&node_slices(&fx, "cutlost").await, RANGE);
    let mine = of_node(&listed, "node-c");
    assert_eq!(mine.len(), 1, "one slice claimed: {listed:?}");
    assert_eq!(mine[0].prefix_len(), 29, "{listed:?}");
    assert!(mine[0].contains(&out.ips()[0]));
    assert_eq!(listed.len(), 3 + 4, "a /26 cut into a /29, a /29, a /28 and a /27 beside the other three: {listed:?}");
    assert_eq!(assert_distinct_and_reserved(&fx, 1).await, out.ips().into_iter().collect());
}

/// A gone Node's cut slice goes back: the reconciler that holds the Lease (the binary) frees it once its pool has
/// stayed empty for the grace, then joins it with its free buddies back to the NodeSlicePool's slice size, so the
/// next node finds the range whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_nodes_cut_slice_is_freed_and_joined_back() {
    use hereabouts_tests::objects::mk_node;
    use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
    use hereabouts_tests::{deploy, wait};
    let fx = CniFixture::new("slice-join").await;
    const RANGE: &str = "198.18.92.0/26";
    let config =
        fx.netconf("1.1.0", "join", json!({"range": RANGE, "node_slice_size": "/26", "min_node_slice_size": "/28"}));
    // node-g has no Node object: a node that is gone
    let add = fx.invocation("ADD", &config, "on-g", "c-g").with_env("NODENAME", "node-g").run().await;
    assert!(add.success, "{}", add.stdout);
    let listed = partition(&node_slices(&fx, "join").await, RANGE);
    assert_eq!(listed.len(), 3, "a /28 cut for node-g, a /28 and a /27 left free: {listed:?}");
    assert_eq!(of_node(&listed, "node-g").len(), 1);
    let del = fx.invocation("DEL", &config, "on-g", "c-g").with_env("NODENAME", "node-g").run().await;
    assert!(del.success, "{}", del.stderr);

    mk_node("node-a").create(&fx.admin).await;
    deploy::apply_rbac(fx.admin.clone()).await;
    deploy::create_lease(&fx.admin, &fx.ns).await;
    let reconciler = Reconciler::start(fx.cluster, &ReconcilerOptions::new("node-a", &fx.ns)).await;
    let whole = wait::until(std::time::Duration::from_secs(40), "the range one free slice again", || async {
        let listed = partition(&node_slices(&fx, "join").await, RANGE);
        (listed.len() == 1 && listed.values().all(String::is_empty)).then_some(())
    })
    .await;
    if let Err(e) = whole {
        panic!("{e}\n{}\n{:?}", reconciler.logs(), node_slices(&fx, "join").await);
    }
    // and cut again for the next node
    let again = fx.invocation("ADD", &config, "on-a", "c-a").with_env("NODENAME", "node-a").run().await;
    assert!(again.success, "{}", again.stdout);
    let listed = partition(&node_slices(&fx, "join").await, RANGE);
    assert_eq!(of_node(&listed, "node-a").iter().map(|c| c.prefix_len()).collect::<Vec<_>>(), [28], "{listed:?}");
}

/// `node_slice_size` changed in place while pods run, smaller then larger: the NodeSlicePool keeps its spec and
/// its slices in use; a node claiming after the change cuts a free slice to the new size, or, for a larger size
/// than any free slice, takes the largest there is; no address is handed out twice, and every pod keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_slice_size_changes_in_place() {
    let fx = CniFixture::new("slice-resize").await;
    const RANGE: &str = "198.18.93.0/24";
    let sized = |size: &str| fx.netconf("1.1.0", "resize", json!({"range": RANGE, "node_slice_size": size}));
    let add = |config: &serde_json::Value, pod: &str, node: &str| {
        let inv = fx.invocation("ADD", config, pod, &format!("c-{pod}")).with_env("NODENAME", node);
        async move {
            let out = inv.run().await;
            assert!(out.success, "{}", out.stdout);
            out.ips()[0]
        }
    };
    let mut given = vec![add(&sized("/26"), "a-0", "node-a").await];
    let smaller = sized("/28");
    given.push(add(&smaller, "a-1", "node-a").await);
    given.push(add(&smaller, "b-0", "node-b").await);
    let listed = partition(&node_slices(&fx, "resize").await, RANGE);
    assert_eq!(of_node(&listed, "node-a").iter().map(|c| c.prefix_len()).collect::<Vec<_>>(), [26], "{listed:?}");
    assert_eq!(of_node(&listed, "node-b").iter().map(|c| c.prefix_len()).collect::<Vec<_>>(), [28], "{listed:?}");
    let larger = sized("/25");
    given.push(add(&larger, "c-0", "node-c").await);
    let listed = partition(&node_slices(&fx, "resize").await, RANGE);
    assert_eq!(of_node(&listed, "node-c").iter().map(|c| c.prefix_len()).collect::<Vec<_>>(), [26], "{listed:?}");
    for (ip, node) in given.iter().zip(["node-a", "node-a", "node-b", "node-c"]) {
        assert!(of_node(&listed, node).iter().any(|c| c.contains(ip)), "{ip} in {node}'s slice: {listed:?}");
    }
    assert_eq!(node_slices(&fx, "resize").await.spec.slice_size, "/26", "the spec as made");
    assert_eq!(assert_distinct_and_reserved(&fx, 4).await, given.into_iter().collect());
}
