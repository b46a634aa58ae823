//! A range that changes shape while pods hold addresses of it (issue 28's finding): the compiled plugin against the
//! test API server, with `enable_overlapping_ranges: false` (no reservations to say what the old range holds).

use std::collections::BTreeSet;
use std::net::IpAddr;

use hereabouts_ipam::store::OVERLAPS_ANNOTATION;
use hereabouts_tests::Identity;
use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::plugin::netconf;
use kube::Api;
use serde_json::json;

/// A /30 grown to a /29: the grown range writes into a new pool, which names the old one, and its ADDs never hand
/// out what the old pool's pods still hold, though the create of the new pool lost its answer; the grown range
/// fills up with the rest and then says so; an old pod's DEL under the grown config releases its entry in the old
/// pool, and the grown range may then hand the address out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grown_range_never_hands_out_what_the_old_range_still_holds() {
    let fx = CniFixture::new("grow").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let kubeconfig = proxy.kubeconfig(fx.cluster, Identity::Cni, &fx.ns);
    let ipam = |range: &str| json!({"range": range, "enable_overlapping_ranges": false});
    let old = netconf("1.0.0", "grow", &kubeconfig, ipam("198.18.106.0/30"));
    let grown = netconf("1.0.0", "grow", &kubeconfig, ipam("198.18.106.0/29"));
    let mut old_held = BTreeSet::new();
    for pod in ["old-a", "old-b"] {
        let out = fx.add_on(&old, "node-1", pod).await;
        assert!(out.success, "{}", out.stdout);
        old_held.extend(out.ips());
    }

    // the first ADD of the grown range creates its pool, and never hears that it did
    proxy.add_rule(Rule::nth(Verb::Create, "ippools", 1, Action::DropResponse));
    let mut handed: BTreeSet<IpAddr> = BTreeSet::new();
    for i in 0..4 {
        let out = fx.add_on(&grown, "node-1", &format!("new-{i}")).await;
        assert!(out.success, "new-{i}: {}", out.stdout);
        let ip = out.ips()[0];
        assert!(!old_held.contains(&ip), "{ip} is held in the old range's pool ({old_held:?})");
        assert!(handed.insert(ip), "{ip} handed out twice");
    }
    let lost = proxy.seen().iter().filter(|s| s.action == Some(Action::DropResponse)).count();
    assert_eq!(lost, 1, "the create's answer was lost");
    let new_pool = fx.pool("198.18.106.0-29").await;
    let names = new_pool.metadata.annotations.unwrap_or_default().get(OVERLAPS_ANNOTATION).cloned();
    assert_eq!(names.as_deref(), Some("198.18.106.0-30"), "the new pool names the one it replaces");

    let full = fx.add_on(&grown, "node-1", "new-4").await;
    assert!(!full.success, "six usable, two held by the old pool's pods: {}", full.stdout);
    assert_eq!(full.error_code(), 100, "range exhausted: {}", full.stdout);

    // an old pod's DEL runs with the NAD as it is now: it finds the entry in the pool the new one replaced
    assert!(fx.del_on(&grown, "node-1", "old-a").await.success);
    let old_pool = fx.pool("198.18.106.0-30").await;
    assert_eq!(old_pool.spec.allocations.len(), 1, "old-a's entry released, old-b's kept: {:?}", old_pool.spec);
    let after = fx.add_on(&grown, "node-1", "new-4").await;
    assert!(after.success, "{}", after.stdout);
    assert!(old_held.contains(&after.ips()[0]), "the address the old pod gave back: {:?}", after.ips());
}

/// The leader moves the live entries of a grown range's old pool into the new one while the pods run (with
/// reservations, the default), each keeping its address and its reservation; the old pool, emptied, goes; an old
/// pod's DEL then finds its entry in the new pool. Shrunk back, the same happens the other way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_moves_live_entries_into_the_grown_range_and_back_again() {
    use hereabouts_tests::plugin::Invocation;
    use hereabouts_tests::reconciler::{PodFixture, Reconciler, ReconcilerOptions};
    use std::collections::BTreeMap;
    use std::time::Duration;
    let fx = PodFixture::new("relayout", "198.18.107.0/29").await;
    let kubeconfig = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let small = netconf("1.0.0", "relayout", &kubeconfig, json!({"range": "198.18.107.0/29"}));
    let grown = netconf("1.0.0", "relayout", &kubeconfig, json!({"range": "198.18.107.0/28"}));
    let (small_pool, grown_pool) = ("198.18.107.0-29", "198.18.107.0-28");
    let mut uids = BTreeMap::new();
    let add = async |config: &serde_json::Value, pod: &str, uid: &str| {
        let mut inv = Invocation::new("ADD", config, &fx.ns, pod, &format!("c-{pod}")).with_env("NODENAME", "n1");
        inv.args.push_str(&format!(";K8S_POD_UID={uid}"));
        inv.run().await.ips()[0]
    };
    let mut held = BTreeMap::new();
    for pod in ["a", "b", "c"] {
        let uid = fx.pod(pod, "n1").await.metadata.uid.unwrap();
        held.insert(pod.to_string(), add(&small, pod, &uid).await);
        uids.insert(pod.to_string(), uid);
    }
    let uid = fx.pod("d", "n1").await.metadata.uid.unwrap();
    held.insert("d".into(), add(&grown, "d", &uid).await);
    uids.insert("d".into(), uid);
    let named = fx.pool(grown_pool).await.metadata.annotations.unwrap_or_default().get(OVERLAPS_ANNOTATION).cloned();
    assert_eq!(named.as_deref(), Some(small_pool), "with reservations too, the new pool names the one it replaces");

    let opts = ReconcilerOptions { cron: "*/2 * * * * *".into(), ..ReconcilerOptions::new("n1", &fx.ns) };
    let reconciler = Reconciler::start(fx.cluster, &opts).await;
    let holders = async |pool: &str| -> BTreeMap<String, IpAddr> {
        let api = kube::Api::<hereabouts_ipam::crd::IpPool>::namespaced(fx.admin.clone(), &fx.ns);
        let Some(read) = api.get_opt(pool).await.unwrap() else { return BTreeMap::new() };
        let range: ipnet::IpNet = read.spec.range.parse().unwrap();
        let base = match range.network() {
            IpAddr::V4(n) => u32::from(n),
            IpAddr::V6(_) => unreachable!(),
        };
        read.spec
            .allocations
            .iter()
            .map(|(k, e)| {
                let pod = e.podref.rsplit('/').next().unwrap().to_string();
                (pod, IpAddr::V4((base + k.parse::<u32>().unwrap()).into()))
            })
            .collect()
    };
    let settled = async |from: &str, into: &str, expected: &BTreeMap<String, IpAddr>| {
        hereabouts_tests::wait::until(
            Duration::from_secs(40),
            &format!("{from}'s entries to move into {into}"),
            || async {
                let gone = kube::Api::<hereabouts_ipam::crd::IpPool>::namespaced(fx.admin.clone(), &fx.ns)
                    .get_opt(from)
                    .await
                    .unwrap()
                    .is_none();
                (gone && holders(into).await == *expected).then_some(())
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    };
    settled(small_pool, grown_pool, &held).await;
    let reserved = fx.reservations().await;
    for pod in held.keys() {
        assert!(reserved.contains(&fx.podref(pod)), "{pod}'s reservation stays: {reserved:?}");
    }

    // an old pod goes: its DEL finds the entry where it moved
    let del = Invocation::new("DEL", &grown, &fx.ns, "a", "c-a").with_env("NODENAME", "n1").run().await;
    assert!(del.success, "{}", del.stdout);
    fx.delete("a").await;
    held.remove("a");
    assert_eq!(holders(grown_pool).await, held);

    // and back: the /29 again; its new pool names the /28, and the live entries move back
    let uid = fx.pod("e", "n1").await.metadata.uid.unwrap();
    let e = add(&small, "e", &uid).await;
    assert!(!held.values().any(|ip| *ip == e), "e's {e} is another pod's");
    held.insert("e".into(), e);
    settled(grown_pool, small_pool, &held).await;
    let log = reconciler.logs();
    assert!(log.contains("entry moved to the pool that replaced its own"), "{log}");
}

/// `kubectl hereabouts ipam migrate`: a dry run lists the moves a grown range calls for and writes nothing;
/// `--apply` makes them and retires the emptied pool; a settle time below an ADD's is refused without
/// `--unsafe-ages`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_hereabouts_migrate_shows_the_plan_and_applies_it() {
    use hereabouts_tests::ctl::ctl;
    let fx = CniFixture::new("migrate").await;
    let old = netconf("1.0.0", "migrate", &fx.kubeconfig, json!({"range": "198.18.108.0/29"}));
    let grown = netconf("1.0.0", "migrate", &fx.kubeconfig, json!({"range": "198.18.108.0/28"}));
    for pod in ["a", "b"] {
        assert!(fx.add_on(&old, "node-1", pod).await.success);
    }
    assert!(fx.add_on(&grown, "node-1", "c").await.success);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let admin = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let refused = ctl(&admin, &fx.ns, &["ipam", "migrate", "--settle", "1s"]).await;
    assert!(!refused.success && refused.stderr.contains("--unsafe-ages"), "{}", refused.stderr);

    let dry = ctl(&admin, &fx.ns, &["ipam", "migrate", "--settle", "1s", "--unsafe-ages"]).await;
    eprintln!("{}", dry.stdout);
    assert!(dry.success, "{}", dry.stderr);
    for ip in ["198.18.108.1", "198.18.108.2"] {
        assert!(dry.stdout.contains(&format!("move: {ip} (")), "{ip}: {}", dry.stdout);
    }
    assert!(dry.stdout.contains("2 to move, 0 to stay; --apply moves them"), "{}", dry.stdout);
    assert_eq!(fx.pool("198.18.108.0-29").await.spec.allocations.len(), 2, "a dry run writes nothing");

    let applied = ctl(&admin, &fx.ns, &["ipam", "migrate", "--settle", "1s", "--unsafe-ages", "--apply"]).await;
    eprintln!("{}", applied.stdout);
    assert!(applied.success, "{}", applied.stderr);
    assert!(applied.stdout.contains("moved 2, not moved 0"), "{}", applied.stdout);
    assert_eq!(fx.pool("198.18.108.0-28").await.spec.allocations.len(), 3, "a, b and c in the grown pool");
    assert!(fx.pools().await.iter().all(|p| p.spec.range != "198.18.108.0/29"), "the emptied pool retired");
    let nothing = ctl(&admin, &fx.ns, &["ipam", "migrate", "--settle", "1s", "--unsafe-ages"]).await;
    assert!(nothing.stdout.contains("nothing to migrate"), "{}", nothing.stdout);
}

/// Changing `node_slice_size` while pods run, as docs/configuration.md has the operator do it: the network goes to
/// one pool per range (the slice pools' entries move into the range's pool and the slice pools go), the emptied
/// NodeSlicePool is deleted, and the network takes the new slice size (the old pool's entries move into the new
/// slices' pools). Every pod keeps its address throughout, with its reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_slice_size_by_way_of_one_pool_keeps_every_address() {
    use hereabouts_ipam::crd::{IpPool, NodeSlicePool};
    use hereabouts_tests::plugin::Invocation;
    use hereabouts_tests::reconciler::{PodFixture, Reconciler, ReconcilerOptions};
    use std::collections::BTreeMap;
    use std::time::Duration;
    let fx = PodFixture::new("reslice", "198.18.109.0/28").await;
    let kubeconfig = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let with = |ipam: serde_json::Value| netconf("1.0.0", "reslice", &kubeconfig, ipam);
    let small = with(json!({"range": "198.18.109.0/28", "node_slice_size": "/30"}));
    let one = with(json!({"range": "198.18.109.0/28"}));
    let large = with(json!({"range": "198.18.109.0/28", "node_slice_size": "/29"}));
    let add = async |config: &serde_json::Value, pod: &str, node: &str| {
        let uid = fx.pod(pod, node).await.metadata.uid.unwrap();
        let mut inv = Invocation::new("ADD", config, &fx.ns, pod, &format!("c-{pod}")).with_env("NODENAME", node);
        inv.args.push_str(&format!(";K8S_POD_UID={uid}"));
        let out = inv.run().await;
        assert!(out.success, "{pod}: {}", out.stdout);
        out.ips()[0]
    };
    let mut held = BTreeMap::new();
    for (pod, node) in [("a", "n1"), ("b", "n1"), ("c", "n2")] {
        held.insert(fx.podref(pod), add(&small, pod, node).await);
    }
    let pools = Api::<IpPool>::namespaced(fx.admin.clone(), &fx.ns);
    // every entry of the namespace, as podref -> address, and how many pools hold them
    let holders = async || {
        let mut found = BTreeMap::new();
        let listed = pools.list(&Default::default()).await.unwrap().items;
        for pool in &listed {
            let range: ipnet::IpNet = pool.spec.range.parse().unwrap();
            let IpAddr::V4(base) = range.network() else { unreachable!() };
            for (k, e) in &pool.spec.allocations {
                found.insert(e.podref.clone(), IpAddr::V4((u32::from(base) + k.parse::<u32>().unwrap()).into()));
            }
        }
        (found, listed.iter().filter(|p| !p.spec.allocations.is_empty()).count())
    };
    let opts = ReconcilerOptions { cron: "*/2 * * * * *".into(), ..ReconcilerOptions::new("n1", &fx.ns) };
    let reconciler = Reconciler::start(fx.cluster, &opts).await;
    let until_in_one_pool = async |what: &str, expected: &BTreeMap<String, IpAddr>, range: &str| {
        hereabouts_tests::wait::until(Duration::from_secs(40), what, || async {
            let listed = pools.list(&Default::default()).await.unwrap().items;
            let (found, _) = holders().await;
            let only = listed.len() == 1 && listed[0].spec.range == range;
            (only && found == *expected).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    };

    // 1. one pool per range: the slices' entries move into the range's pool, the slice pools go
    held.insert(fx.podref("d"), add(&one, "d", "n2").await);
    until_in_one_pool("the slice pools' entries to move into the range's pool", &held, "198.18.109.0/28").await;

    // 2. the NodeSlicePool, which no pool uses now, is deleted
    let node_slices = Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns);
    for nsp in node_slices.list(&Default::default()).await.unwrap().items {
        node_slices.delete(&nsp.metadata.name.unwrap(), &Default::default()).await.unwrap();
    }

    // 3. the new slice size: the range's pool's entries move into the new slices' pools, which hold them
    held.insert(fx.podref("e"), add(&large, "e", "n1").await);
    held.insert(fx.podref("f"), add(&large, "f", "n2").await);
    let last = std::sync::Mutex::new(String::new());
    hereabouts_tests::wait::until(Duration::from_secs(40), "the range's pool to give way to /29 slices", || async {
        let listed = pools.list(&Default::default()).await.unwrap().items;
        let whole_gone = listed.iter().all(|p| p.spec.range != "198.18.109.0/28");
        let found = holders().await.0;
        let names: Vec<_> =
            listed.iter().map(|p| (&p.metadata.name, &p.metadata.annotations, p.spec.allocations.len())).collect();
        *last.lock().unwrap() = format!("{found:?} in {names:?}");
        (whole_gone && found == held).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {} (expected {held:?})\n{}", last.lock().unwrap(), reconciler.logs()));
    let addresses: std::collections::BTreeSet<_> = held.values().collect();
    assert_eq!(addresses.len(), held.len(), "no address twice: {held:?}");
    let reserved = fx.reservations().await;
    for podref in held.keys() {
        assert!(reserved.contains(podref), "{podref}'s reservation: {reserved:?}");
    }
}
