//! Slice mode (`node_slice_size`) on the real control plane: the CNI binary claims slices of a
//! NodeSlicePool for its node, allocates in its slices' pools, borrows when no slice is free, and never hands one
//! address out twice.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use futures::StreamExt;
use futures::stream;
use hereabouts_ipam::crd::{IpPool, NodeSliceAllocation, NodeSlicePool, NodeSlicePoolSpec, NodeSlicePoolStatus};
use hereabouts_ipam::names;
use hereabouts_ipam::range::IpRange;
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::plugin::Output;
use ipnet::IpNet;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

/// Runs ADD for `pods` (pod name, node), `at_once` at a time.
pub(crate) async fn add_all(fx: &CniFixture, config: &Value, pods: &[(String, String)], at_once: usize) -> Vec<Output> {
    stream::iter(pods.iter().map(|(pod, node)| {
        let inv = fx.invocation("ADD", config, pod, &format!("c-{pod}")).with_env("NODENAME", node);
        async move { inv.run().await }
    }))
    .buffered(at_once)
    .collect()
    .await
}

/// Creates the NodeSlicePool `name` as Whereabouts' controller writes it: every `/prefix` slice of `range`
/// listed, the first ones owned by `owners` in order, the rest free.
async fn put_node_slices(fx: &CniFixture, name: &str, range: &str, prefix: u8, owners: &[&str]) {
    let slices = hereabouts_ipam::slices::divide(range.parse().unwrap(), prefix).unwrap();
    let owner = |i: usize| owners.get(i).map(|o| o.to_string()).unwrap_or_default();
    let allocations = (slices.into_iter().enumerate())
        .map(|(i, cidr)| NodeSliceAllocation { node_name: owner(i), slice_range: names::range_string(cidr) })
        .collect();
    let spec = NodeSlicePoolSpec { range: range.into(), slice_size: format!("/{prefix}") };
    let mut nsp = NodeSlicePool::new(name, spec);
    nsp.status = Some(NodeSlicePoolStatus { allocations });
    Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns).create(&PostParams::default(), &nsp).await.unwrap();
}

pub(crate) async fn node_slices(fx: &CniFixture, name: &str) -> NodeSlicePool {
    Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns).get(name).await.unwrap()
}

/// Every (address, podref) the pools of the namespace hold, computed from each pool's own range.
pub(crate) fn held(pools: &[IpPool]) -> Vec<(IpAddr, String)> {
    let mut all = Vec::new();
    for pool in pools {
        let range = IpRange::parse(&pool.spec.range, None, None, &[]).unwrap();
        for (offset, entry) in &pool.spec.allocations {
            all.push((range.addr_at(offset.parse().unwrap()), entry.podref.clone()));
        }
    }
    all
}

/// No address twice across every pool, and each reservation names the pod its address's entry holds.
pub(crate) async fn assert_distinct_and_reserved(fx: &CniFixture, expected: usize) -> BTreeSet<IpAddr> {
    let pools = fx.pools().await;
    let held = held(&pools);
    let addresses: BTreeSet<IpAddr> = held.iter().map(|(ip, _)| *ip).collect();
    assert_eq!(addresses.len(), held.len(), "an address is held twice: {held:?}");
    assert_eq!(held.len(), expected, "entries: {held:?}");
    let reservations: BTreeMap<String, String> =
        fx.reservations().await.into_iter().map(|r| (r.metadata.name.unwrap(), r.spec.podref)).collect();
    for (ip, podref) in &held {
        let name = hereabouts_ipam::names::reservation_name("", *ip);
        assert_eq!(reservations.get(&name), Some(podref), "reservation of {ip}");
    }
    assert_eq!(reservations.len(), held.len(), "one reservation per entry");
    addresses
}

/// Which node owns which slice: no slice has two owners by construction (a list), so check the other way:
/// every owner named by a pool's name owns that slice.
pub(crate) fn owners(nsp: &NodeSlicePool) -> BTreeMap<String, String> {
    nsp.status.as_ref().unwrap().allocations.iter().map(|a| (a.slice_range.clone(), a.node_name.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_nodes_thirty_two_at_a_time_each_in_its_own_slices() {
    let fx = CniFixture::new("slice-burst").await;
    let config = fx.netconf("1.1.0", "burst", json!({"range": "198.18.80.0/22", "node_slice_size": "/26"}));
    let pods: Vec<(String, String)> = (0..192).map(|i| (format!("pod-{i}"), format!("node-{}", i % 8))).collect();
    let outputs = add_all(&fx, &config, &pods, 32).await;
    for (out, (pod, _)) in outputs.iter().zip(&pods) {
        assert!(out.success, "{pod}: {}\n{}", out.stdout, out.stderr);
    }
    let addresses = assert_distinct_and_reserved(&fx, 192).await;
    let given: BTreeSet<IpAddr> = outputs.iter().flat_map(|o| o.ips()).collect();
    assert_eq!(given, addresses, "the pools hold exactly what was handed out");

    let nsp = node_slices(&fx, "burst").await;
    let owners = owners(&nsp);
    assert_eq!(owners.len(), 16, "a /22 in /26 slices");
    // 24 pods a node fit one /26: each node claimed exactly one slice and wrote only its own pool
    let owned: BTreeMap<&str, usize> = owners.values().filter(|n| !n.is_empty()).fold(BTreeMap::new(), |mut m, n| {
        *m.entry(n.as_str()).or_default() += 1;
        m
    });
    assert_eq!(owned.len(), 8, "{owners:?}");
    assert!(owned.values().all(|n| *n == 1), "{owners:?}");
    for pool in fx.pools().await {
        let name = pool.metadata.name.clone().unwrap();
        let owner = &owners[&pool.spec.range];
        // an unnamed network: `<node>-<slice>`, as Whereabouts names per-node pools; the NodeSlicePool has the
        // config's name
        assert_eq!(name, format!("{owner}-{}", pool.spec.range.replace('/', "-")));
        for entry in pool.spec.allocations.values() {
            assert_eq!(entry.node.as_deref(), Some(owner.as_str()), "{name}: every entry from its owner");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_nodes_than_slices_race_borrow_and_fill_the_range() {
    let fx = CniFixture::new("slice-race").await;
    // four /28 slices of a /26: 62 usable addresses (the /26's network and broadcast are not hosts; the slices'
    // own are)
    let config = fx.netconf("1.1.0", "race", json!({"range": "198.18.84.0/26", "node_slice_size": "28"}));
    let pods: Vec<(String, String)> = (0..62).map(|i| (format!("pod-{i}"), format!("node-{}", i % 8))).collect();
    let outputs = add_all(&fx, &config, &pods, 16).await;
    for (out, (pod, _)) in outputs.iter().zip(&pods) {
        assert!(out.success, "{pod}: {}\n{}", out.stdout, out.stderr);
    }
    let addresses = assert_distinct_and_reserved(&fx, 62).await;
    assert!(addresses.contains(&"198.18.84.16".parse::<IpAddr>().unwrap()), "a slice's own network address is a host");
    let owners = owners(&node_slices(&fx, "race").await);
    let distinct: BTreeSet<&String> = owners.values().collect();
    assert_eq!(distinct.len(), 4, "four slices, four different owners: {owners:?}");
    assert!(!owners.values().any(String::is_empty), "every slice claimed");
    // the four nodes without a slice borrowed: their entries live in other nodes' pools
    let borrowed = held(&fx.pools().await).len();
    assert_eq!(borrowed, 62);

    // the range is full: the next ADD, on any node, is refused with "exhausted" and writes nothing
    let versions = |pools: Vec<IpPool>| -> Vec<Option<String>> {
        pools.into_iter().map(|p| p.metadata.resource_version).collect()
    };
    let before = versions(fx.pools().await);
    let out = fx.invocation("ADD", &config, "one-more", "c-more").with_env("NODENAME", "node-9").run().await;
    assert_eq!(out.error_code(), 100, "{}", out.stdout);
    assert_eq!(versions(fx.pools().await), before, "nothing written");
    assert_eq!(fx.reservations().await.len(), 62);

    // DEL of a borrowed address, from its node, frees it in the other node's pool, reservation and all
    let lender_of = |pools: &[IpPool], pod: &str| {
        pools.iter().find(|p| p.spec.allocations.values().any(|a| a.podref.ends_with(&format!("/{pod}")))).cloned()
    };
    let pools = fx.pools().await;
    let (pod, node) = pods
        .iter()
        .find(|(pod, node)| !lender_of(&pools, pod).unwrap().metadata.name.unwrap().contains(&format!("-{node}-")))
        .expect("some pod borrowed");
    let del = fx.invocation("DEL", &config, pod, &format!("c-{pod}")).with_env("NODENAME", node).run().await;
    assert!(del.success, "{}", del.stderr);
    assert!(lender_of(&fx.pools().await, pod).is_none(), "{pod}'s borrowed entry is gone");
    assert_eq!(fx.reservations().await.len(), 61);
    // and the freed address is handed out again
    let again = fx.invocation("ADD", &config, "again", "c-again").with_env("NODENAME", "node-9").run().await;
    assert_eq!(again.ips().len(), 1, "{}", again.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_add_gets_its_address_back_and_check_and_del_find_it() {
    let fx = CniFixture::new("slice-retry").await;
    let config = fx.netconf("1.1.0", "retry", json!({"range": "198.18.85.0/24", "node_slice_size": "/28"}));
    let run = |cmd: &'static str, pod: &str, container: &str| {
        fx.invocation(cmd, &config, pod, container).with_env("NODENAME", "node-r")
    };
    // fill the node's first slice so that the pod's address is in its second
    for i in 0..16 {
        run("ADD", &format!("fill-{i}"), &format!("f{i}")).run().await.result();
    }
    let first = run("ADD", "web", "c1").run().await.ips();
    assert!(run("DEL", "fill-3", "f3").run().await.success);
    // a new sandbox of the same pod: its address, not the one just freed in the first slice
    assert_eq!(run("ADD", "web", "c2").run().await.ips(), first);
    assert!(run("CHECK", "web", "c2").run().await.success);
    let del = run("DEL", "web", "c2").run().await;
    assert!(del.success, "{}", del.stderr);
    assert_eq!(run("CHECK", "web", "c2").run().await.error_code(), 102);
    assert_distinct_and_reserved(&fx, 15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_slices() {
    let fx = CniFixture::new("slice-v6").await;
    let config = fx.netconf("1.1.0", "v6", json!({"range": "2001:db8:80::/112", "node_slice_size": "/120"}));
    let pods: Vec<(String, String)> = (0..48).map(|i| (format!("pod-{i}"), format!("node-{}", i % 4))).collect();
    let outputs = add_all(&fx, &config, &pods, 16).await;
    let given: BTreeSet<IpAddr> = outputs.iter().flat_map(|o| o.ips()).collect();
    assert_eq!(given.len(), 48);
    assert_eq!(assert_distinct_and_reserved(&fx, 48).await, given);
    let owners = owners(&node_slices(&fx, "v6").await);
    assert_eq!(owners.len(), 256);
    for (pod, node) in &pods {
        let ip = outputs[pods.iter().position(|(p, _)| p == pod).unwrap()].ips()[0];
        let slice = owners.iter().find(|(s, _)| s.parse::<IpNet>().unwrap().contains(&ip)).unwrap();
        assert_eq!(slice.1, node, "{pod} on {node} got {ip} from its own slice");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_slice_pool_as_whereabouts_controller_writes_it_is_used_as_is() {
    let fx = CniFixture::new("slice-wb").await;
    // what Whereabouts' node-slice controller creates for two Nodes: every slice listed, two assigned
    put_node_slices(&fx, "wbnet", "198.18.86.0/24", 26, &["worker-a", "worker-b"]).await;

    let config = fx.netconf(
        "1.1.0",
        "attach",
        json!({
            "range": "198.18.86.0/24", "node_slice_size": "/26", "network_name": "wbnet"
        }),
    );
    let b = fx.invocation("ADD", &config, "on-b", "cb").with_env("NODENAME", "worker-b").run().await.ips();
    assert_eq!(b, ["198.18.86.64".parse::<IpAddr>().unwrap()], "worker-b's slice, from its first host");
    let pool = fx.pool("wbnet-worker-b-198.18.86.64-26").await;
    assert_eq!(pool.spec.range, "198.18.86.64/26");
    assert_eq!(pool.spec.allocations.keys().collect::<Vec<_>>(), ["0"], "offsets from the slice's own network");
    let a = fx.invocation("ADD", &config, "on-a", "ca").with_env("NODENAME", "worker-a").run().await.ips();
    assert_eq!(a, ["198.18.86.1".parse::<IpAddr>().unwrap()]);
    assert_eq!(
        fx.reservations().await.iter().filter(|r| r.metadata.name.as_deref() == Some("wbnet-198.18.86.1")).count(),
        1
    );
    assert_eq!(
        owners(&node_slices(&fx, "wbnet").await)["198.18.86.128/26"],
        "",
        "no slice claimed by a node that had one"
    );

    // a config that slices the network otherwise (the NAD's node_slice_size changed in place) takes the slices as
    // listed: worker-a goes on in its /26, a new node cuts a free /26 and owns a /27 of it; the spec stays
    let other = fx.netconf(
        "1.1.0",
        "attach",
        json!({
            "range": "198.18.86.0/24", "node_slice_size": "/27", "network_name": "wbnet"
        }),
    );
    let out = fx.invocation("ADD", &other, "odd", "co").with_env("NODENAME", "worker-a").run().await;
    assert_eq!(out.ips(), ["198.18.86.2".parse::<IpAddr>().unwrap()], "{}", out.stdout);
    let out = fx.invocation("ADD", &other, "new", "cn").with_env("NODENAME", "worker-c").run().await;
    let owners = owners(&node_slices(&fx, "wbnet").await);
    let of_c: Vec<&String> = owners.iter().filter(|(_, n)| n.as_str() == "worker-c").map(|(s, _)| s).collect();
    assert_eq!(of_c.len(), 1, "{owners:?}");
    assert!(of_c[0].ends_with("/27"), "{owners:?}");
    assert!(of_c[0].parse::<IpNet>().unwrap().contains(&out.ips()[0]), "{}", out.stdout);
    assert_eq!(node_slices(&fx, "wbnet").await.spec.slice_size, "/26");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_range_in_slice_mode_is_refused_before_anything_is_written() {
    let fx = CniFixture::new("slice-two").await;
    let config = fx.netconf(
        "1.1.0",
        "two",
        json!({
            "node_slice_size": "/26",
            "ipRanges": [{"range": "198.18.87.0/24"}, {"range": "2001:db8:87::/120"}]
        }),
    );
    let out = fx.add(&config, "web", "c1").await;
    assert_eq!(out.error_code(), 7, "{}", out.stdout);
    assert!(out.stdout.contains("node_slice_size"), "{}", out.stdout);
    let nsps = Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns).list(&ListParams::default()).await.unwrap();
    assert!(nsps.items.is_empty());
    assert_eq!(fx.object_count().await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whereabouts_fast_ipam_and_hereabouts_on_one_range_never_share_an_address() {
    let fx = CniFixture::new("slice-mixed").await;
    // the NodeSlicePool as Whereabouts' controller leaves it for two Whereabouts nodes; the rest is free
    put_node_slices(&fx, "mixed", "198.18.88.0/24", 27, &["wb-0", "wb-1"]).await;

    let config = fx.netconf("1.1.0", "mixed", json!({"range": "198.18.88.0/24", "node_slice_size": "/27"}));
    let mut runs = Vec::new();
    for i in 0..64 {
        let pod = format!("pod-{i}");
        let inv = if i % 3 == 0 {
            hereabouts_tests::plugin::whereabouts(fx.cluster, &fx.ns, "ADD", &config, &pod, &format!("c-{pod}"))
                .with_env("NODENAME", &format!("wb-{}", i % 2))
        } else {
            fx.invocation("ADD", &config, &pod, &format!("c-{pod}")).with_env("NODENAME", &format!("h-{}", i % 4))
        };
        runs.push(async move { (i, inv.run().await) });
    }
    let outputs: Vec<(usize, Output)> = stream::iter(runs).buffer_unordered(16).collect().await;
    let mut given = Vec::new();
    for (i, out) in &outputs {
        assert!(
            out.success,
            "pod-{i} ({}): {}\n{}",
            if i % 3 == 0 { "Whereabouts" } else { "hereabouts" },
            out.stdout,
            out.stderr
        );
        given.extend(out.ips());
    }
    let distinct: BTreeSet<IpAddr> = given.iter().copied().collect();
    assert_eq!(distinct.len(), 64, "an address was handed out twice: {given:?}");
    let pools = fx.pools().await;
    let held = held(&pools);
    let addresses: BTreeSet<IpAddr> = held.iter().map(|(ip, _)| *ip).collect();
    assert_eq!((held.len(), addresses), (64, distinct), "the pools hold exactly what was handed out");
    // each plugin wrote its own nodes' slice pools
    let owners = owners(&node_slices(&fx, "mixed").await);
    for pool in &pools {
        let owner = &owners[&pool.spec.range];
        assert!(pool.metadata.name.as_deref().unwrap().starts_with(&format!("{owner}-")), "{:?}", pool.metadata.name);
    }
    assert_eq!(owners.values().filter(|n| n.starts_with("h-")).count(), 4, "{owners:?}");
}

/// The answers of the NodeSlicePool's create, the slice claim and the first pool patch are lost after the server
/// applied them: each is read back, and the ADD ends with one slice, one entry and its reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_of_the_slice_writes_are_read_back() {
    use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
    let fx = CniFixture::new("slice-lost").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let kubeconfig = proxy.kubeconfig(fx.cluster, hereabouts_tests::Identity::Admin, &fx.ns);
    let config = hereabouts_tests::plugin::netconf(
        "1.1.0",
        "lost",
        &kubeconfig,
        json!({"range": "198.18.89.0/24", "node_slice_size": "/28"}),
    );
    proxy.add_rule(Rule::nth(Verb::Create, "nodeslicepools", 1, Action::DropResponse));
    proxy.add_rule(Rule::nth(Verb::Patch, "nodeslicepools", 1, Action::DropResponse));
    proxy.add_rule(Rule::nth(Verb::Patch, "ippools", 1, Action::DropResponse));
    let out = fx.invocation("ADD", &config, "web", "c1").with_env("NODENAME", "node-l").run().await;
    let ips = out.ips();
    for (verb, resource) in
        [(Verb::Create, "nodeslicepools"), (Verb::Patch, "nodeslicepools"), (Verb::Patch, "ippools")]
    {
        let dropped = proxy.seen().iter().any(|s| s.is(verb, resource) && s.action == Some(Action::DropResponse));
        assert!(dropped, "{verb:?} {resource} lost: {:?}", proxy.seen());
    }
    let owners = owners(&node_slices(&fx, "lost").await);
    assert_eq!(owners.values().filter(|n| *n == "node-l").count(), 1, "one slice claimed: {owners:?}");
    assert_eq!(assert_distinct_and_reserved(&fx, 1).await, ips.into_iter().collect());
}

/// An ADD killed while its slice claim is in flight: the claim lands after the kill; the runtime's next sandbox
/// uses that slice and claims no other, and the DEL of the killed sandbox frees nothing of the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_claim_is_the_next_sandboxs_slice() {
    use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
    let fx = CniFixture::new("slice-kill").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let kubeconfig = proxy.kubeconfig(fx.cluster, hereabouts_tests::Identity::Admin, &fx.ns);
    let ipam = json!({"range": "198.18.90.0/24", "node_slice_size": "/28"});
    let held = hereabouts_tests::plugin::netconf("1.1.0", "kill", &kubeconfig, ipam.clone());
    proxy.add_rule(Rule::nth(Verb::Patch, "nodeslicepools", 1, Action::Hold));
    let running = fx.invocation("ADD", &held, "web", "c1").with_env("NODENAME", "node-k").start().await;
    proxy.wait_held(1).await;
    running.kill().await;
    assert_eq!(proxy.release_held(), 1);
    let claimed = || async { owners(&node_slices(&fx, "kill").await).values().any(|n| n == "node-k") };
    hereabouts_tests::wait::until(std::time::Duration::from_secs(10), "the held claim to land", || async {
        claimed().await.then_some(())
    })
    .await
    .unwrap();

    let direct = fx.netconf("1.1.0", "kill", ipam);
    let run = |cmd: &'static str, container: &str| {
        fx.invocation(cmd, &direct, "web", container).with_env("NODENAME", "node-k")
    };
    let ips = run("ADD", "c2").run().await.ips();
    let owners = owners(&node_slices(&fx, "kill").await);
    let mine: Vec<&String> = owners.iter().filter(|(_, n)| *n == "node-k").map(|(s, _)| s).collect();
    assert_eq!(mine.len(), 1, "{owners:?}");
    assert!(mine[0].parse::<IpNet>().unwrap().contains(&ips[0]), "{ips:?} from {mine:?}");
    assert!(run("DEL", "c1").run().await.success);
    assert_eq!(assert_distinct_and_reserved(&fx, 1).await, ips.into_iter().collect());
}

/// `max_slices_per_node: 1` through the compiled plugin: a node whose one slice is full gets code 100 naming the cap
/// while the other slices are free, borrows once another node holds one, and never claims a second slice; no
/// address is held twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_at_its_slice_cap_borrows_instead_of_claiming_another() {
    let fx = CniFixture::new("slice-cap").await;
    // the chart's cni.providerEvents right, here in the pods' namespace: the cap's Events on the pods
    let events = hereabouts_tests::rbac::cni_event_rules();
    hereabouts_tests::rbac::grant_to(fx.admin.clone(), &fx.ns, "cni-events", hereabouts_tests::Identity::Cni, events)
        .await;
    let config = fx.netconf(
        "1.1.0",
        "capped",
        json!({"range": "198.18.85.0/26", "node_slice_size": "28", "max_slices_per_node": 1}),
    );
    let add = |pod: String, node: &'static str| {
        let inv = fx.invocation("ADD", &config, &pod, &format!("c-{pod}")).with_env("NODENAME", node);
        async move { inv.run().await }
    };
    // node-a's one /28: 15 or 16 addresses (an edge slice gives up the /26's network or broadcast address)
    let mut taken = 0;
    let refused = loop {
        let out = add(format!("a-{taken}"), "node-a").await;
        if !out.success {
            break out;
        }
        taken += 1;
        assert!(taken <= 16, "node-a took a second slice");
    };
    assert!(taken >= 15, "{taken}");
    assert_eq!(refused.error_code(), 100, "{}", refused.stdout);
    assert!(refused.stdout.contains("holds 1 slices (max_slices_per_node)"), "{}", refused.stdout);
    assert!(add("b-0".into(), "node-b").await.success);
    let borrowed = add(format!("a-{taken}"), "node-a").await;
    assert!(borrowed.success, "{}", borrowed.stdout);
    let owners = owners(&node_slices(&fx, "capped").await);
    let of = |node: &str| owners.values().filter(|o| o.as_str() == node).count();
    assert_eq!((of("node-a"), of("node-b"), of("")), (1, 1, 2), "{owners:?}");
    let slice_of_b = owners.iter().find(|(_, o)| o.as_str() == "node-b").map(|(s, _)| s.parse::<IpNet>().unwrap());
    assert!(slice_of_b.unwrap().contains(&borrowed.ips()[0]), "borrowed from node-b's slice: {:?}", borrowed.ips());
    assert_distinct_and_reserved(&fx, taken + 2).await;
    // the pod the cap refused, then borrowed for, was told each time; no other pod was
    let listed = kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let told: Vec<(String, String)> = listed
        .iter()
        .filter(|e| e.reason.as_deref() == Some(hereabouts_ipam::slices::SLICE_CAP_REASON))
        .map(|e| (e.involved_object.name.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()))
        .collect();
    assert_eq!(told.len(), 2, "{told:?}");
    assert!(told.iter().all(|(pod, _)| *pod == format!("a-{taken}")), "{told:?}");
    assert!(told.iter().any(|(_, m)| m.contains("borrowed from another node's slice")), "{told:?}");
}
