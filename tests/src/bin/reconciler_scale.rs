//! Measures the reconciler at scale on the test control plane: its resident memory while serving a cluster of
//! 50 nodes and 50 pools (one per node, as slices are) holding ALLOCATIONS entries in all (default 5,000; the
//! first argument sets it, e.g. 50000), and the time from a pod's deletion (without CNI DEL) to the release of
//! its address, over 200 deletions on the reconciler's node. Only the reconciler's node's pods are created: the
//! others' entries are what a node's reconciler must not hold in memory. Prints the figures.
//!
//! `cargo run --release -p hereabouts-tests --bin reconciler_scale [ALLOCATIONS]` (after `make build`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use hereabouts_ipam::crd::{IpAllocation, IpPool, IpPoolSpec};
use hereabouts_tests::objects::mk_pod;
use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
use hereabouts_tests::{TestCluster, deploy};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};

const POOLS: usize = 50;
const NODES: usize = 50;
const DELETIONS: usize = 200;

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn pct(sorted: &[f64], p: usize) -> f64 {
    sorted[((sorted.len() * p).div_ceil(100)).saturating_sub(1)]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cluster = TestCluster::get();
    let admin = cluster.admin().await;
    deploy::apply_rbac(admin.clone()).await;
    let ns = cluster.namespace("scale").await;
    let pods_api = Api::<Pod>::namespaced(admin.clone(), &ns);
    let total: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(5000);
    let per_pool = total / POOLS;
    anyhow::ensure!((DELETIONS..=1000).contains(&per_pool), "ALLOCATIONS / {POOLS} must be 200 to 1000");

    // Pod i's entry is in pool i / per_pool, written by node (i / per_pool) % NODES: pool 0 is node-0's, the
    // reconciler's, and holds the DELETIONS first pods.
    let t0 = Instant::now();
    let node_of = |i: usize| format!("node-{}", (i / per_pool) % NODES);
    let on_node: Vec<usize> = (0..total).filter(|i| node_of(*i) == "node-0").collect();
    let created: Vec<(usize, String)> = futures::stream::iter(on_node.clone())
        .map(|i| {
            let api = pods_api.clone();
            let (node, ns) = (node_of(i), ns.clone());
            async move {
                let pod = mk_pod(&ns, &format!("p{i}")).node(&node).build();
                let pod = api.create(&PostParams::default(), &pod).await.expect("create pod");
                (i, pod.metadata.uid.unwrap_or_default())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let uids: BTreeMap<usize, String> = created.into_iter().collect();
    println!("created node-0's {} pods in {:.1} s", on_node.len(), t0.elapsed().as_secs_f64());

    // Pools, written in the plugin's own format.
    let pools_api = Api::<IpPool>::namespaced(admin.clone(), &ns);
    for p in 0..POOLS {
        let mut allocations = BTreeMap::new();
        for k in 0..per_pool {
            let i = p * per_pool + k;
            allocations.insert(
                (k + 1).to_string(),
                IpAllocation {
                    id: format!("c{i}"),
                    podref: format!("{ns}/p{i}"),
                    ifname: "net1".into(),
                    poduid: Some(uids.get(&i).cloned().unwrap_or_else(|| format!("uid-{i}"))),
                    allocated: Some("2026-01-01T00:00:00Z".into()),
                    node: Some(node_of(i)),
                    network: Some("scale".into()),
                    reserved: false,
                    statefulset: None,
                    ipamclaim: None,
                    recorded_for: Some(format!("c{i}")),
                },
            );
        }
        let name = format!("198.19.{}.0-22", p * 4);
        let pool = IpPool::new(
            &name,
            IpPoolSpec { range: format!("198.19.{}.0/22", p * 4), allocations, ..Default::default() },
        );
        pools_api.create(&PostParams::default(), &pool).await?;
    }
    println!("created {POOLS} pools of {per_pool} allocations ({total} in all)");

    let opts =
        ReconcilerOptions { cron: "0 0 1 1 *".into(), grace: "60s".into(), ..ReconcilerOptions::new("node-0", &ns) };
    let reconciler = Reconciler::start(cluster, &opts).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pid = reconciler.pid();
    println!("reconciler RSS, synced, idle: {:.1} MiB", rss_mib(pid));

    // Deletions: one at a time, timing each until its entry is gone from its pool.
    let mut latencies = Vec::with_capacity(DELETIONS);
    let force = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    for i in 0..DELETIONS {
        let pool = format!("198.19.{}.0-22", (i / per_pool) * 4);
        let key = (i % per_pool + 1).to_string();
        let t = Instant::now();
        pods_api.delete(&format!("p{i}"), &force).await?;
        loop {
            let current = pools_api.get(&pool).await?;
            if !current.spec.allocations.contains_key(&key) {
                break;
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(30),
                "p{i} not released after 30 s:\n{}",
                reconciler.logs()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        latencies.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    println!(
        "deletion -> release over {DELETIONS} deletions: median {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        pct(&latencies, 50),
        pct(&latencies, 99),
        latencies[latencies.len() - 1]
    );
    println!("reconciler RSS after the deletions: {:.1} MiB", rss_mib(pid));
    let left: usize = pools_api.list(&Default::default()).await?.items.iter().map(|p| p.spec.allocations.len()).sum();
    anyhow::ensure!(left == total - DELETIONS, "{left} allocations left, expected {}", total - DELETIONS);
    println!("allocations left: {left} (every live pod kept its address)");
    Ok(())
}
