//! The reconciler keeps live pods' addresses and repairs what faults and Whereabouts leave behind, on the real
//! control plane (issue 9's defects 4, 9, 12 and 13): static pods are matched by name, a failed release is tried
//! again without waiting for the cron, a reservation no entry accounts for is released even while its pod
//! lives, a live entry's missing reservation is put back, and an address held by two pods is reported.

use std::time::{Duration, Instant};

use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
use hereabouts_tests::objects::{mk_entry, mk_pod, mk_pool, mk_reservation};
use hereabouts_tests::plugin::{whereabouts, whereabouts_via};
use hereabouts_tests::reconciler::{PodFixture as Fx, Reconciler, ReconcilerOptions};
use hereabouts_tests::{Identity, wait};
use kube::api::{Api, PostParams};
use serde_json::json;

/// How often the cron runs in these tests that want it: every 2 s.
const OFTEN: &str = "*/2 * * * * *";
/// A cron that never comes in a test's life.
const NEVER: &str = "0 0 1 1 *";

async fn reservation_holder(fx: &Fx, name: &str) -> Option<String> {
    Api::<OverlappingRangeIpReservation>::namespaced(fx.admin.clone(), &fx.ns)
        .get_opt(name)
        .await
        .unwrap()
        .map(|r| r.spec.podref)
}

/// Defect 4: a static pod's CNI_ARGS UID is the kubelet's, never its mirror pod's; the reconciler took the
/// mismatch for a replaced pod and freed the address after the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pod_keeps_its_address_past_twice_the_grace_period() {
    let fx = Fx::new("rep-static", "198.18.56.0/24").await;
    let node = format!("node-{}", fx.ns);
    let mirror = mk_pod(&fx.ns, &format!("etcd-{node}"))
        .node(&node)
        .annotation("kubernetes.io/config.mirror", "4c1f6fd0-kubelet-hash")
        .annotation("kubernetes.io/config.source", "file")
        .create(&fx.admin)
        .await;
    let name = mirror.metadata.name.clone().unwrap();
    let ip = fx.add_as(&name, "4c1f6fd0-kubelet-hash", &node, "c-static").await;
    let reconciler = Reconciler::start(
        fx.cluster,
        &ReconcilerOptions { cron: OFTEN.into(), ..ReconcilerOptions::new(&node, &fx.ns) },
    )
    .await;
    // grace 1 s: three cluster reconciles and two node passes take well over twice that
    reconciler.wait_for_more("hereabouts_reconcile_runs_total", 3.0).await;
    reconciler.wait_for_more("hereabouts_node_resyncs_total", 2.0).await;
    assert!(fx.holders("198.18.56.0-24").await.contains(&fx.podref(&name)), "{}", reconciler.logs());
    assert_eq!(reservation_holder(&fx, &ip.to_string()).await, Some(fx.podref(&name)));
    assert_eq!(reconciler.metric("hereabouts_released_total").await, 0.0);
}

/// Defect 13: in a fleet mixing both, Whereabouts' DEL of a failed ADD deletes the reservation by name with no
/// owner check — hereabouts' claim on a live pod's address. The reconciler puts it back within one pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_whereabouts_deleted_under_a_live_pod_is_restored() {
    let fx = Fx::new("rep-restore", "198.18.57.0/24").await;
    let node = format!("node-{}", fx.ns);
    let narrow = hereabouts_tests::plugin::netconf(
        "1.0.0",
        "narrow",
        &fx.cluster.kubeconfig(Identity::Admin, &fx.ns),
        json!({"range": "198.18.57.0/28"}),
    );
    // Whereabouts, on an overlapping range, picks .1 and writes its pool; its reservation create is held up...
    let proxy = FaultProxy::start(fx.cluster).await;
    proxy.add_rule(Rule::nth(Verb::Create, "overlappingrangeipreservations", 1, Action::Hold));
    let kubeconfig = proxy.kubeconfig(fx.cluster, Identity::Admin, &fx.ns);
    let theirs = whereabouts_via(fx.cluster, &kubeconfig, &fx.ns, "ADD", &narrow, "theirs", "c-theirs").start().await;
    proxy.wait_held(1).await;
    // ...while hereabouts claims .1 for a live pod...
    let ours = fx.pod("ours", &node).await;
    assert_eq!(fx.add(&ours, &node, "c-ours").await.to_string(), "198.18.57.1");
    // ...so Whereabouts' create meets our reservation and its ADD fails,
    proxy.release_held();
    let failed = theirs.wait().await;
    assert!(!failed.success && failed.stdout.contains("already exists"), "{} {}", failed.stdout, failed.stderr);
    // and the runtime's DEL of that failed sandbox deletes the reservation of .1 by name, owner unchecked.
    let del = whereabouts(fx.cluster, &fx.ns, "DEL", &narrow, "theirs", "c-theirs").run().await;
    assert!(del.success, "{} {}", del.stdout, del.stderr);
    assert_eq!(reservation_holder(&fx, "198.18.57.1").await, None, "Whereabouts' DEL took our claim");

    let t0 = Instant::now();
    let reconciler = Reconciler::start(
        fx.cluster,
        &ReconcilerOptions { cron: OFTEN.into(), ..ReconcilerOptions::new(&node, &fx.ns) },
    )
    .await;
    wait::until(Duration::from_secs(20), "the reservation to be restored", || async {
        (reservation_holder(&fx, "198.18.57.1").await == Some(fx.podref("ours"))).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    eprintln!("restored {:?} after the reconciler started", t0.elapsed());
    // counted once the restorer has read the entry back after its create, a moment after the create shows
    wait::until(Duration::from_secs(10), "the restore to be counted", || async {
        (reconciler.metric("hereabouts_reservations_restored_total").await >= 1.0).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    assert!(fx.holders("198.18.57.0-24").await.contains(&fx.podref("ours")), "the entry stays");
}

/// Defect 12: a reservation no pool entry accounts for (a killed ADD whose retry landed on another address) was
/// kept for as long as a pod of that name existed — for a StatefulSet, for good. Once older than any ADD runs,
/// it goes; the pod's real claim stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_reservation_of_a_live_pod_is_released() {
    let fx = Fx::new("rep-orphan", "198.18.58.0/24").await;
    let node = format!("node-{}", fx.ns);
    let web = fx.pod("web-0", &node).await;
    let ip = fx.add(&web, &node, "c-2").await;
    let stray = mk_reservation("198.18.58.77", &fx.podref("web-0")).container("c-1").ifname("net1").build();
    Api::<OverlappingRangeIpReservation>::namespaced(fx.admin.clone(), &fx.ns)
        .create(&PostParams::default(), &stray)
        .await
        .unwrap();
    // orphan age 2 s; the cron never runs: the node loop's resync does not carry this one (no node label), so the
    // cluster reconcile must, and a short cron lets it
    let reconciler = Reconciler::start(
        fx.cluster,
        &ReconcilerOptions { cron: OFTEN.into(), ..ReconcilerOptions::new(&node, &fx.ns) },
    )
    .await;
    wait::until(Duration::from_secs(20), "the orphan to go", || async {
        reservation_holder(&fx, "198.18.58.77").await.is_none().then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    assert_eq!(reservation_holder(&fx, &ip.to_string()).await, Some(fx.podref("web-0")), "the live claim stays");
    assert!(fx.holders("198.18.58.0-24").await.contains(&fx.podref("web-0")));
}

/// An address held by two pods (entries in two overlapping pools, as Whereabouts with overlapping ranges off
/// writes them) is reported — an Event on each pod and a metric — and neither is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_held_by_two_pods_is_reported_and_both_kept() {
    let fx = Fx::new("rep-conflict", "198.18.59.0/24").await;
    let node = format!("node-{}", fx.ns);
    for (name, range, pod) in [("198.18.59.0-24", "198.18.59.0/24", "a"), ("198.18.59.0-28", "198.18.59.0/28", "b")] {
        fx.pod(pod, &node).await;
        let pool = mk_pool(name, range).entry(5, mk_entry(&format!("c-{pod}"), &fx.podref(pod)).ifname("net1")).build();
        Api::<IpPool>::namespaced(fx.admin.clone(), &fx.ns).create(&PostParams::default(), &pool).await.unwrap();
    }
    let reconciler = Reconciler::start(
        fx.cluster,
        &ReconcilerOptions { cron: OFTEN.into(), ..ReconcilerOptions::new(&node, &fx.ns) },
    )
    .await;
    reconciler.wait_for_more("hereabouts_reconcile_runs_total", 2.0).await;
    assert!(reconciler.metric("hereabouts_address_conflicts").await >= 1.0, "{}", reconciler.logs());
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&Default::default())
        .await
        .unwrap();
    for pod in ["a", "b"] {
        assert!(
            events.items.iter().any(|e| e.reason.as_deref() == Some("AddressConflict")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod)),
            "an AddressConflict event on {pod}"
        );
    }
    assert!(fx.holders("198.18.59.0-24").await.contains(&fx.podref("a")));
    assert!(fx.holders("198.18.59.0-28").await.contains(&fx.podref("b")));
}

/// Defect 9: the node loop dropped a release that failed and waited for the (daily) cron. It retries with
/// backoff: here the first two removals of a deleted pod's entry are refused (403, as while RBAC is being
/// rolled out) on their way to the API server, and the third, seconds later, goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_is_retried_before_any_cron() {
    let fx = Fx::new("rep-retry", "198.18.60.0/24").await;
    let node = format!("node-{}", fx.ns);
    let gone = fx.pod("gone", &node).await;
    fx.add(&gone, &node, "c-gone").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let opts = ReconcilerOptions {
        cron: NEVER.into(),
        kubeconfig: Some(proxy.kubeconfig(fx.cluster, Identity::Restricted, &fx.ns)),
        // no periodic pass either: only the retry queue may try again
        node_resync: "1h".into(),
        ..ReconcilerOptions::new(&node, &fx.ns)
    };
    let reconciler = Reconciler::start(fx.cluster, &opts).await;
    // the leader's pool counts are PATCHes of ippools too: the refusals are for the releases, so they are armed
    // once the count is written (it changes again only when the release goes through)
    hereabouts_tests::wait::until(Duration::from_secs(20), "the leader's count of the pool", || async {
        let annotations = fx.pool("198.18.60.0-24").await.metadata.annotations.unwrap_or_default();
        (annotations.get(hereabouts_ipam::store::ALLOCATED_ANNOTATION).map(String::as_str) == Some("1")).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    proxy.add_rule(Rule {
        times: 2,
        ..Rule::nth(Verb::Patch, "ippools", 1, Action::Status(403, "forbidden: RBAC not yet in place".into()))
    });
    fx.delete("gone").await;
    let took = fx.wait_released("198.18.60.0-24", &fx.podref("gone"), Duration::from_secs(30)).await;
    let refused = proxy.seen().iter().filter(|s| s.is(Verb::Patch, "ippools") && s.action.is_some()).count();
    assert_eq!(refused, 2, "both refusals fired: {:?}", proxy.seen());
    assert!(reconciler.metric("hereabouts_release_retries_total").await >= 2.0, "{}", reconciler.logs());
    assert_eq!(reconciler.metric("hereabouts_reconcile_runs_total").await, 0.0, "no cron ran");
    eprintln!("released after two refusals in {took:?}");
}
