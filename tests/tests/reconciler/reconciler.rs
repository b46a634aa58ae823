//! The reconciler on the real control plane: a process with the restricted identity bound by exactly the
//! ClusterRole of `deploy/daemonset.yaml`, giving back what deleted and finished pods held and nothing a live
//! pod holds.

use std::collections::BTreeSet;
use std::time::Duration;

use hereabouts_ipam::crd::OverlappingRangeIpReservation;
use hereabouts_tests::objects::mk_reservation;
use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
use hereabouts_tests::{Identity, wait};
use kube::api::{Api, PostParams};

use hereabouts_tests::reconciler::PodFixture as Fx;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_and_finished_pods_are_released_and_live_ones_kept() {
    let fx = Fx::new("rec-node", "198.18.50.0/24").await;
    let node = format!("node-{}", fx.ns);
    let reconciler = Reconciler::start(
        fx.cluster,
        &ReconcilerOptions { grace: "60s".into(), ..ReconcilerOptions::new(&node, &fx.ns) },
    )
    .await;

    let gone = fx.pod("gone", &node).await;
    let done = fx.pod("done", &node).await;
    let live = fx.pod("live", &node).await;
    for (pod, cid) in [(&gone, "c-gone"), (&done, "c-done"), (&live, "c-live")] {
        fx.add(pod, &node, cid).await;
    }
    let pool = "198.18.50.0-24";

    // Deleted without CNI DEL, one second after its ADD: released at once, the grace period notwithstanding.
    fx.delete("gone").await;
    let took = fx.wait_released(pool, &fx.podref("gone"), Duration::from_secs(5)).await;
    eprintln!("reconciler: deleted pod released after {took:?}");
    fx.set_phase("done", "Succeeded").await;
    fx.wait_released(pool, &fx.podref("done"), Duration::from_secs(5)).await;

    // two more passes of the node loop over this node: nothing live may go
    reconciler.wait_for_more("hereabouts_node_resyncs_total", 2.0).await;
    assert_eq!(fx.holders(pool).await, BTreeSet::from([fx.podref("live")]), "the live pod keeps its address");
    assert!(reconciler.metric("hereabouts_released_total").await >= 2.0, "{}", reconciler.logs());
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        events.items.iter().any(|e| e.reason.as_deref() == Some("AddressReleased")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gone")),
        "an AddressReleased event on the pod"
    );
    let mut reconciler = reconciler;
    assert!(reconciler.stop(), "SIGTERM ends the reconciler cleanly:\n{}", reconciler.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_deleted_while_stopped_are_released_after_start() {
    let fx = Fx::new("rec-resync", "198.18.51.0/24").await;
    let node = format!("node-{}", fx.ns);
    let mut names = Vec::new();
    for i in 0..4 {
        let pod = fx.pod(&format!("p{i}"), &node).await;
        fx.add(&pod, &node, &format!("c{i}")).await;
        names.push(format!("p{i}"));
    }
    fx.delete("p0").await;
    fx.delete("p1").await;
    let reconciler = Reconciler::start(
        fx.cluster,
        &ReconcilerOptions { cron: "0 0 1 1 *".into(), ..ReconcilerOptions::new(&node, &fx.ns) },
    )
    .await;
    let pool = "198.18.51.0-24";
    fx.wait_released(pool, &fx.podref("p0"), Duration::from_secs(10)).await;
    fx.wait_released(pool, &fx.podref("p1"), Duration::from_secs(10)).await;
    assert_eq!(fx.holders(pool).await, BTreeSet::from([fx.podref("p2"), fx.podref("p3")]), "{}", reconciler.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_frees_orphans_of_a_dead_node_and_nothing_live() {
    let fx = Fx::new("rec-cron", "198.18.52.0/24").await;
    let dead = format!("dead-{}", fx.ns);
    let here = format!("here-{}", fx.ns);
    let pool = "198.18.52.0-24";

    let orphan = fx.pod("orphan", &dead).await;
    fx.add(&orphan, &dead, "c-orphan").await;
    let web = fx.pod("web-0", &dead).await;
    let web_ip = fx.add(&web, &dead, "c-web-a").await;
    // StatefulSet: web-0 is deleted without DEL and recreated under the same name; its ADD gets the address back.
    fx.delete("web-0").await;
    let web_again = fx.pod("web-0", &dead).await;
    assert_eq!(fx.add(&web_again, &dead, "c-web-b").await, web_ip);
    fx.delete("orphan").await;
    // a reservation no pool records, of a pod that is gone
    let stray = mk_reservation("198.18.52.200", &fx.podref("never")).container("c-x").ifname("net1").build();
    Api::<OverlappingRangeIpReservation>::namespaced(fx.admin.clone(), &fx.ns)
        .create(&PostParams::default(), &stray)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await; // older than the grace period now

    let reconciler = Reconciler::start(fx.cluster, &ReconcilerOptions::new(&here, &fx.ns)).await;
    // A Pending pod whose ADD happened just now, while the cron runs.
    let pending = fx.pod("pending", &dead).await;
    fx.add(&pending, &dead, "c-pending").await;

    fx.wait_released(pool, &fx.podref("orphan"), Duration::from_secs(10)).await;
    wait::until(Duration::from_secs(10), "the stray reservation to go", || async {
        (!fx.reservations().await.contains(&fx.podref("never"))).then_some(())
    })
    .await
    .unwrap();
    // two more cluster reconciles: nothing live may go
    reconciler.wait_for_more("hereabouts_reconcile_runs_total", 2.0).await;
    assert_eq!(
        fx.holders(pool).await,
        BTreeSet::from([fx.podref("pending"), fx.podref("web-0")]),
        "{}",
        reconciler.logs()
    );
    assert_eq!(fx.reservations().await, BTreeSet::from([fx.podref("pending"), fx.podref("web-0")]));
    assert!(reconciler.metric("hereabouts_reconcile_runs_total").await >= 2.0);
}

/// S8 of the fourth review: the leader judged a reservation's age by its own clock, so one running 15 min fast took
/// an ADD's fresh reservation (its entry not written yet) for an orphan older than `--orphan-age` and deleted it;
/// the entry then landed unreserved. Ages are judged on the API server's clock, as `kubectl hereabouts` judges them.
#[tokio::test]
async fn a_leader_whose_clock_runs_fast_judges_ages_by_the_api_servers() {
    let fx = Fx::new("rec-skew", "198.18.53.0/24").await;
    let here = format!("here-{}", fx.ns);
    let live = fx.pod("live", &here).await;
    fx.add(&live, &here, "c-live").await; // the range's pool
    // an ADD under way: its reservation is made, its entry not yet
    let claim = mk_reservation("198.18.53.9", &fx.podref("adding")).container("c-adding").ifname("net1").build();
    Api::<OverlappingRangeIpReservation>::namespaced(fx.admin.clone(), &fx.ns)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let mut options = ReconcilerOptions::new(&here, &fx.ns);
    options.orphan_age = "60s".into();
    options.env = vec![(hereabouts_ipam::clock::SKEW_FOR_TESTS.into(), "900".into())];
    let reconciler = Reconciler::start(fx.cluster, &options).await;
    reconciler.wait_for_more("hereabouts_reconcile_runs_total", 3.0).await;
    assert!(
        fx.reservations().await.contains(&fx.podref("adding")),
        "the fresh reservation was deleted:\n{}",
        reconciler.logs()
    );
    assert!(reconciler.logs().contains("this node's clock is off the API server's"), "{}", reconciler.logs());
}

/// The ticks a reconciler's log says it ran the cluster reconcile for.
fn ticks(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("cluster reconcile done"))
        .filter_map(|l| l.split("tick=").nth(1)?.split_whitespace().next().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_run_the_cron_work_once_per_tick() {
    let fx = Fx::new("rec-lease", "198.18.53.0/24").await;
    let a = Reconciler::start(
        fx.cluster,
        &ReconcilerOptions { identity: "a".into(), ..ReconcilerOptions::new("node-a", &fx.ns) },
    )
    .await;
    let b = Reconciler::start(
        fx.cluster,
        &ReconcilerOptions { identity: "b".into(), ..ReconcilerOptions::new("node-b", &fx.ns) },
    )
    .await;
    // the window watched: every tick in it must run once, on the one Lease holder (waiting for four ticks instead
    // would shorten what "throughout" covers)
    tokio::time::sleep(Duration::from_secs(11)).await;
    let (ta, tb) = (ticks(&a.logs()), ticks(&b.logs()));
    let all: Vec<&String> = ta.iter().chain(&tb).collect();
    let distinct: BTreeSet<&String> = all.iter().copied().collect();
    assert_eq!(all.len(), distinct.len(), "a tick ran twice: a {ta:?} b {tb:?}");
    assert!(distinct.len() >= 4, "about one run per 2-s tick in 11 s: a {ta:?} b {tb:?}");
    assert!(ta.is_empty() || tb.is_empty(), "one instance holds the lease throughout: a {ta:?} b {tb:?}");
}

/// The controller Deployment's scope: two replicas, no node of their own. The leader gives back what deleted pods
/// of every node held, the follower nothing; when the leader goes, the follower takes the Lease over and gives
/// back what was deleted meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_scope_releases_every_nodes_pods_on_its_leader_only() {
    let fx = Fx::new("rec-cluster", "198.18.58.0/24").await;
    let pool = "198.18.58.0-24";
    let replica = |name: &str| ReconcilerOptions {
        cluster: true,
        identity: name.into(),
        cron: "0 0 1 1 *".into(),
        ..ReconcilerOptions::new("unused", &fx.ns)
    };
    let first = Reconciler::start(fx.cluster, &replica("controller-1")).await;
    let second = Reconciler::start(fx.cluster, &replica("controller-2")).await;
    for (i, node) in ["node-a", "node-b", "node-c"].iter().enumerate() {
        let pod = fx.pod(&format!("p{i}"), node).await;
        fx.add(&pod, node, &format!("c{i}")).await;
    }
    fx.delete("p0").await;
    fx.delete("p1").await;
    fx.wait_released(pool, &fx.podref("p0"), Duration::from_secs(10)).await;
    fx.wait_released(pool, &fx.podref("p1"), Duration::from_secs(10)).await;
    let released = [first.metric("hereabouts_released_total").await, second.metric("hereabouts_released_total").await];
    assert!(
        released.contains(&0.0) && released.iter().sum::<f64>() >= 2.0,
        "the leader released both nodes' pods, the follower nothing: {released:?}\n{}\n{}",
        first.logs(),
        second.logs()
    );
    let (mut leader, follower) = if released[0] > 0.0 { (first, second) } else { (second, first) };
    assert!(leader.stop(), "{}", leader.logs());
    fx.delete("p2").await;
    // the Lease lapses (15 s), the follower takes it and resyncs
    fx.wait_released(pool, &fx.podref("p2"), Duration::from_secs(40)).await;
    assert!(follower.metric("hereabouts_released_total").await >= 1.0, "{}", follower.logs());
}

/// An upgrade from the layout where each node's DaemonSet pod ran the cluster-wide work (`run` for its node, as
/// ServiceAccount hereabouts) to the controller: while an old node pod still runs beside the new controller they
/// share the Lease, the old one gives back its node's gone pods, and once it is replaced the controller gives back
/// every node's. Every deleted pod's address comes back once, and no live pod's goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_node_pods_to_the_controller_loses_nothing() {
    let fx = Fx::new("rec-upgrade", "198.18.59.0/24").await;
    let pool = "198.18.59.0-24";
    let mut old = Reconciler::start(
        fx.cluster,
        &ReconcilerOptions {
            identity: "old-node-a".into(),
            cron: "0 0 1 1 *".into(),
            ..ReconcilerOptions::new("node-a", &fx.ns)
        },
    )
    .await;
    for (name, node) in [("p0", "node-a"), ("p1", "node-a"), ("p2", "node-a"), ("p3", "node-b"), ("p4", "node-b")] {
        let pod = fx.pod(name, node).await;
        fx.add(&pod, node, &format!("c-{name}")).await;
    }
    let controller = Reconciler::start(
        fx.cluster,
        &ReconcilerOptions {
            cluster: true,
            identity: "controller-1".into(),
            cron: "0 0 1 1 *".into(),
            ..ReconcilerOptions::new("unused", &fx.ns)
        },
    )
    .await;
    // both running: the old node pod gives back its node's deleted pod
    fx.delete("p0").await;
    fx.wait_released(pool, &fx.podref("p0"), Duration::from_secs(10)).await;
    // the old pod replaced: the controller takes the Lease over and gives back both nodes' gone pods
    let released_by_old = old.metric("hereabouts_released_total").await;
    assert!(old.stop(), "{}", old.logs());
    fx.delete("p1").await;
    fx.delete("p3").await;
    fx.wait_released(pool, &fx.podref("p1"), Duration::from_secs(40)).await;
    fx.wait_released(pool, &fx.podref("p3"), Duration::from_secs(10)).await;
    assert_eq!(fx.holders(pool).await, BTreeSet::from([fx.podref("p2"), fx.podref("p4")]), "the live pods keep theirs");
    let released = released_by_old + controller.metric("hereabouts_released_total").await;
    assert_eq!(released, 3.0, "each gone pod's address given back once:\n{}\n{}", old.logs(), controller.logs());
}

#[tokio::test]
async fn an_invalid_schedule_is_a_startup_error() {
    let fx = Fx::new("rec-badcron", "198.18.54.0/24").await;
    let out = std::process::Command::new(hereabouts_tests::plugin::workspace_bin("hereabouts-reconciler"))
        .args([
            "run",
            "--node-name",
            "n",
            "--namespace",
            &fx.ns,
            "--cron-expression",
            "61 * * * *",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--kubeconfig")
        .arg(fx.cluster.kubeconfig(Identity::Restricted, &fx.ns))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid cron expression \"61 * * * *\""), "{stderr}");
}

/// Whether `r` exports any pool gauge.
async fn exports_gauges(r: &Reconciler) -> bool {
    r.get("/metrics").await.unwrap_or_default().contains("hereabouts_pool_allocated{")
}

/// The pool gauges: exported by the leader alone, following ADDs within seconds, with the capacity the config
/// gives (range_end), written into the pool's annotations for `kubectl get ippools` too, and taken over by the next
/// leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_exports_pool_gauges_and_they_follow_adds() {
    let mut fx = Fx::new("rec-gauges", "198.18.98.0/28").await;
    fx.config["ipam"]["range_end"] = serde_json::json!("198.18.98.10");
    let opts = |id: &str, node: &str| ReconcilerOptions { identity: id.into(), ..ReconcilerOptions::new(node, &fx.ns) };
    let mut a = Reconciler::start(fx.cluster, &opts("a", "node-a")).await;
    let mut b = Reconciler::start(fx.cluster, &opts("b", "node-b")).await;
    for i in 0..3 {
        let pod = fx.pod(&format!("p{i}"), "node-a").await;
        fx.add(&pod, "node-a", &format!("c{i}")).await;
    }
    let allocated = r#"hereabouts_pool_allocated{pool="198.18.98.0-28"}"#;
    let size = r#"hereabouts_pool_size{pool="198.18.98.0-28"}"#;
    wait::until(Duration::from_secs(20), "the leader's gauges to count 3", || async {
        (a.metric(allocated).await + b.metric(allocated).await == 3.0).then_some(())
    })
    .await
    .unwrap();
    let a_leads = exports_gauges(&a).await;
    let (leader, follower) = if a_leads { (&mut a, &mut b) } else { (&mut b, &mut a) };
    assert!(!exports_gauges(follower).await, "a follower exports no pool gauge:\n{}", follower.logs());
    assert_eq!(leader.metric(size).await, 10.0, "range_end .10: 10 usable addresses");
    // the same figures where `kubectl get ippools` shows them (the CRD's printer columns)
    wait::until(Duration::from_secs(20), "the pool's annotations to count 3 of 10", || async {
        let annotations = fx.pool("198.18.98.0-28").await.metadata.annotations.unwrap_or_default();
        let shown = |key: &str| annotations.get(key).cloned().unwrap_or_default();
        let counts =
            (shown(hereabouts_ipam::store::ALLOCATED_ANNOTATION), shown(hereabouts_ipam::store::USABLE_ANNOTATION));
        (counts == ("3".to_string(), "10".to_string())).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", leader.logs()));
    // as kubectl asks for them: the API server's table of the pools
    let table: serde_json::Value = {
        let path = format!("/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/{}/ippools", fx.ns);
        let request = http::Request::get(path)
            .header(http::header::ACCEPT, "application/json;as=Table;v=v1;g=meta.k8s.io")
            .body(Vec::new())
            .unwrap();
        fx.cluster.admin().await.request(request).await.unwrap()
    };
    let columns: Vec<&str> =
        table["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    let row = &table["rows"][0]["cells"];
    let cell = |name: &str| row[columns.iter().position(|c| *c == name).unwrap()].clone();
    assert_eq!((cell("Allocated"), cell("Usable")), (serde_json::json!("3"), serde_json::json!("10")), "{columns:?}");

    leader.stop();
    wait::until(Duration::from_secs(40), "the next leader's gauges", || async {
        (follower.metric(allocated).await == 3.0).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", follower.logs()));
}

/// A fleet mixed with upstream Whereabouts: its ADD gives a pod recreated under the same name the entry the pod's
/// predecessor left, rewriting only `id`; the `poduid` hereabouts wrote (kept under hereabouts' CRDs) is then the
/// old pod's. Judged by it, the reconciler released the running pod's address as "replaced" a second after it
/// started; now it judges such an entry by the pod's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_whereabouts_gave_a_recreated_pod_stays_with_it() {
    let fx = Fx::new("rec-mixed", "198.18.90.0/24").await;
    let node = format!("node-{}", fx.ns);
    let first = fx.pod("web-0", &node).await;
    let ip = fx.add(&first, &node, "c-hereabouts").await;
    fx.delete("web-0").await;
    let again = fx.pod("web-0", &node).await;
    assert_ne!(again.metadata.uid, first.metadata.uid, "a new pod of the same name");
    let wb = hereabouts_tests::plugin::whereabouts(fx.cluster, &fx.ns, "ADD", &fx.config, "web-0", "c-whereabouts")
        .with_env("NODENAME", &node)
        .run()
        .await;
    assert!(wb.success, "Whereabouts' ADD: {} {}", wb.stdout, wb.stderr);
    assert_eq!(wb.ips(), vec![ip], "Whereabouts gives the new pod its predecessor's entry");
    let pool = "198.18.90.0-24";
    let entry = fx.pool(pool).await.spec.allocations.into_values().next().expect("the entry");
    assert_eq!((entry.id.as_str(), entry.poduid.as_deref()), ("c-whereabouts", first.metadata.uid.as_deref()));

    let reconciler = Reconciler::start(fx.cluster, &ReconcilerOptions::new(&node, &fx.ns)).await;
    reconciler.wait_for_more("hereabouts_node_resyncs_total", 2.0).await;
    reconciler.wait_for_more("hereabouts_reconcile_runs_total", 2.0).await;
    assert_eq!(
        fx.holders(pool).await,
        BTreeSet::from([fx.podref("web-0")]),
        "the running pod keeps its address:\n{}",
        reconciler.logs()
    );
}

/// A gone node's slice whose pool holds no entry is freed (its pool deleted) after the grace period; but while an
/// address of the slice still cools (reuse cooldown), its pool holds the release record, and deleting it would let
/// the slice's next owner hand that address out at once. Such a slice waits for its records to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_nodes_slice_with_a_cooling_address_is_not_freed() {
    use hereabouts_ipam::crd::{IpPool, NodeSlicePool};
    let fx = Fx::new("rec-cooling", "198.18.52.0/24").await;
    let (cooling_node, idle_node) = (format!("gone-a-{}", fx.ns), format!("gone-b-{}", fx.ns));
    let slices: NodeSlicePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "NodeSlicePool", "metadata": {"name": "coolnet"},
        "spec": {"range": "198.18.103.0/24", "sliceSize": "/26"},
        "status": {"allocations": [{"nodeName": cooling_node, "sliceRange": "198.18.103.0/26"},
                                   {"nodeName": idle_node, "sliceRange": "198.18.103.64/26"}]}}))
    .unwrap();
    Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns).create(&PostParams::default(), &slices).await.unwrap();
    let pools = Api::<IpPool>::namespaced(fx.admin.clone(), &fx.ns);
    let released_now = k8s_openapi::jiff::Timestamp::now().to_string();
    let cooling_pool = format!("coolnet-{cooling_node}-198.18.103.0-26");
    let idle_pool = format!("coolnet-{idle_node}-198.18.103.64-26");
    for (name, range, released) in
        [(&cooling_pool, "198.18.103.0/26", Some(released_now.as_str())), (&idle_pool, "198.18.103.64/26", None)]
    {
        let mut pool: IpPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
            "metadata": {"name": name, "annotations": {"hereabouts.cni.cncf.io/reuse-cooldown-seconds": "600"}},
            "spec": {"range": range, "allocations": {}}}))
        .unwrap();
        pool.spec.released = released.map(|at| [("5".to_string(), at.to_string())].into());
        pools.create(&PostParams::default(), &pool).await.unwrap();
    }
    let node = format!("node-{}", fx.ns);
    let _reconciler = Reconciler::start(fx.cluster, &ReconcilerOptions::new(&node, &fx.ns)).await;
    // the idle slice is freed (the leader works), and by then the cooling one has met the same passes
    wait::until(Duration::from_secs(15), "the idle gone node's slice to be freed", || async {
        pools.get_opt(&idle_pool).await.unwrap().is_none().then_some(())
    })
    .await
    .unwrap();
    let owners: Vec<String> = Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns)
        .get("coolnet")
        .await
        .unwrap()
        .status
        .unwrap()
        .allocations
        .into_iter()
        .map(|a| a.node_name)
        .collect();
    assert_eq!(owners[0], cooling_node, "the cooling slice keeps its owner");
    let kept = pools.get_opt(&cooling_pool).await.unwrap().expect("its pool, with the release record, stays");
    assert_eq!(kept.spec.released.unwrap().get("5"), Some(&released_now));
}

/// The warm reserve: an entry (and reservation) whose podref is a node's token, `hereabouts-warm:<node>`, names no
/// pod; the cluster reconcile reads the Node instead. The reserve of a Node that exists stays, entry and
/// reservation; that of a Node that does not is given back, its reservation with it (the entry's own release
/// deletes it, as for a pod's; had that failed, the orphan rule would a pass later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_entry_is_kept_while_its_node_exists_and_released_with_it() {
    use hereabouts_ipam::crd::{IpAllocation, IpPool};
    use hereabouts_ipam::warm;
    use hereabouts_tests::objects::{mk_node, mk_pool};
    use k8s_openapi::api::core::v1::Node;

    let fx = Fx::new("rec-warm", "198.18.110.0/24").await;
    let (here, gone) = (format!("warm-here-{}", fx.ns), format!("warm-gone-{}", fx.ns));
    mk_node(&here).create(&fx.admin).await;
    let an_hour_ago =
        (k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(3600)).to_string();
    let warm_entry = |node: &str, id: &str| IpAllocation {
        id: id.into(),
        podref: warm::podref(node),
        ifname: id.into(),
        node: Some(node.into()),
        allocated: Some(an_hour_ago.clone()),
        reserved: true,
        recorded_for: Some(id.into()),
        ..Default::default()
    };
    let pool = "198.18.110.0-24";
    let made = mk_pool(pool, "198.18.110.0/24")
        .entry(5, warm_entry(&here, "warm-here"))
        .entry(6, warm_entry(&gone, "warm-gone"))
        .build();
    Api::<IpPool>::namespaced(fx.admin.clone(), &fx.ns).create(&PostParams::default(), &made).await.unwrap();
    let reservations = Api::<OverlappingRangeIpReservation>::namespaced(fx.admin.clone(), &fx.ns);
    for (ip, node, id) in [("198.18.110.5", &here, "warm-here"), ("198.18.110.6", &gone, "warm-gone")] {
        let claim = mk_reservation(ip, &warm::podref(node)).container(id).ifname(id).build();
        reservations.create(&PostParams::default(), &claim).await.unwrap();
    }

    let reconciler = Reconciler::start(fx.cluster, &ReconcilerOptions::new(&format!("node-{}", fx.ns), &fx.ns)).await;
    // not before the Node has been missing for a minute, whatever the grace for pods (S5 of the fourth review: a
    // short grace freed the entries while the node's agent could still take them)
    let t0 = std::time::Instant::now();
    reconciler.wait_for_more("hereabouts_reconcile_runs_total", 2.0).await;
    let podref = warm::podref(&gone);
    assert!(fx.holders(pool).await.contains(&podref), "released after {:?}:\n{}", t0.elapsed(), reconciler.logs());
    wait::until(Duration::from_secs(100), "the gone node's warm entry and reservation to go", || async {
        let podref = warm::podref(&gone);
        (!fx.holders(pool).await.contains(&podref) && !fx.reservations().await.contains(&podref)).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    assert!(t0.elapsed() >= hereabouts_ipam::reconcile::rules::WARM_GRACE_FLOOR, "{:?}", t0.elapsed());
    // two more cluster reconciles and node passes: the existing node's reserve stays
    reconciler.wait_for_more("hereabouts_reconcile_runs_total", 2.0).await;
    reconciler.wait_for_more("hereabouts_node_resyncs_total", 2.0).await;
    let kept = BTreeSet::from([warm::podref(&here)]);
    assert_eq!(fx.holders(pool).await, kept, "{}", reconciler.logs());
    assert_eq!(fx.reservations().await, kept);
    assert_eq!(reconciler.metric(r#"hereabouts_released_total{reason="node_gone"}"#).await, 1.0);
    Api::<Node>::all(fx.admin.clone()).delete(&here, &Default::default()).await.unwrap();
}
