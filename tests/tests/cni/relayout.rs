//! A range that changes shape while pods hold addresses of it (issue 28's finding): the compiled plugin against the
//! test API server, with `enable_overlapping_ranges: false` (no reservations to say what the old range holds).

use std::collections::BTreeSet;
use std::net::IpAddr;

use hereabouts_ipam::store::OVERLAPS_ANNOTATION;
use hereabouts_tests::Identity;
use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::plugin::netconf;
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
