//! What one ADD and one DEL cost the API server, counted from `apiserver_request_total` (on a control plane of
//! its own, so no other test's requests are counted). The request counts are part of the protocol's contract
//! (docs/design.md: GET, reservation create, guarded patch; plus, the first time, the pool's create and the LIST
//! and patch that settle which pools it replaces); latencies are
//! printed for the record, never asserted.

use std::time::Instant;

use hereabouts_tests::TestCluster;
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::metrics::{delta, whereabouts_requests};
use serde_json::json;

#[tokio::test]
async fn requests_per_add_and_del() {
    let fx = CniFixture::on(TestCluster::own(module_path!()), "cni-cost").await;
    let config = fx.netconf("1.0.0", "cost", json!({"range": "198.18.40.0/22"}));
    let metrics = || async { whereabouts_requests(&fx.cluster.metrics().await) };

    let before = metrics().await;
    fx.add(&config, "first", "c-first").await.result();
    let first = delta(&before, &metrics().await);
    eprintln!("cost: first ADD (pool absent): {first:?}");
    assert_eq!(
        first.values().sum::<u64>(),
        6,
        "GET pool, create pool, LIST and patch to settle what it replaces, create reservation, patch: {first:?}"
    );
    assert_eq!(first.get("LIST ippools"), Some(&1), "{first:?}");

    let before = metrics().await;
    fx.add(&config, "second", "c-second").await.result();
    let add = delta(&before, &metrics().await);
    eprintln!("cost: ADD (pool present): {add:?}");
    assert_eq!(add.values().sum::<u64>(), 3, "GET pool, create reservation, patch: {add:?}");

    let before = metrics().await;
    assert!(fx.del(&config, "second", "c-second").await.success);
    let del = delta(&before, &metrics().await);
    eprintln!("cost: DEL: {del:?}");
    assert_eq!(del.values().sum::<u64>(), 4, "GET pool, patch, GET reservation, delete reservation: {del:?}");

    // For the record: wall time of one ADD into a near-empty pool, as a runtime sees it (process start included).
    let mut times = Vec::new();
    for i in 0..50 {
        let t0 = Instant::now();
        fx.add(&config, &format!("p{i}"), &format!("c{i}")).await.result();
        times.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    eprintln!(
        "cost: ADD wall time over {} runs: median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        times.len(),
        times[times.len() / 2],
        times[(times.len() * 99).div_ceil(100) - 1],
        times[times.len() - 1]
    );
}
