//! The fault campaign (issue 9): 320 pods ADDed over two overlapping ranges (a /22, and a /23 in it in slice mode),
//! 32 at a time from 8 nodes, while
//! the API server is SIGKILLed and restarted twice and a third of the CNI processes are SIGKILLed at random
//! moments (the runtime then tears the sandbox down and retries, as a kubelet does). Then a quarter of the pods
//! vanish without a DEL and a reconciler per node runs. Counted and asserted: no address held by two pods, no
//! live pod without its entry and reservation, and every leftover of a killed or failed ADD gone within the
//! orphan age plus a sweep.
//!
//! It restarts the API server, which every test using it shares: it runs on a control plane of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::objects::mk_pod;
use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
use hereabouts_tests::{TestCluster, deploy, wait};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use tokio::sync::{Mutex, Semaphore};

const PODS: usize = 320;
const AT_ONCE: usize = 32;
const NODES: usize = 8;
const KILL_ONE_IN: u64 = 3;

/// What the campaign saw.
#[derive(Debug, Default)]
struct Counts {
    adds: usize,
    adds_ok: usize,
    adds_failed: BTreeMap<u64, usize>,
    /// The first failure's details, by code.
    first_failure: BTreeMap<u64, String>,
    /// Killed sandboxes whose teardown never came (a runtime that crashed with them).
    never_torn_down: usize,
    killed: usize,
    dels: usize,
    restarts: Vec<Duration>,
}

/// A tiny seeded generator, so a failing run can be told apart by its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn node(i: usize) -> String {
    format!("campaign-node-{}", i % NODES)
}

async fn create_pod(fx: &CniFixture, i: usize) -> String {
    let pod = mk_pod(&fx.ns, &format!("pod-{i}")).node(&node(i)).create(&fx.admin).await;
    pod.metadata.uid.unwrap()
}

/// One pod's ADD as a kubelet drives it: a new sandbox after every failure or kill, whose teardown (DEL) runs
/// first. Returns the addresses the successful ADD reported.
async fn attach(
    fx: Arc<CniFixture>,
    config: Value,
    i: usize,
    uid: String,
    seed: u64,
    counts: Arc<Mutex<Counts>>,
) -> Vec<IpAddr> {
    let mut rng = Rng(seed);
    for attempt in 0.. {
        let container = format!("pod-{i}-sandbox-{attempt}");
        let mut add = fx.invocation("ADD", &config, &format!("pod-{i}"), &container).with_env("NODENAME", &node(i));
        add.args.push_str(&format!(";K8S_POD_UID={uid}"));
        let running = add.start().await;
        counts.lock().await.adds += 1;
        let killed = if attempt == 0 && rng.below(KILL_ONE_IN) == 0 {
            tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
            running.kill().await;
            true
        } else {
            let out = running.wait().await;
            if out.success {
                counts.lock().await.adds_ok += 1;
                return out.ips();
            }
            let err = out.json();
            let code = err["code"].as_u64().unwrap_or(0);
            let mut counts = counts.lock().await;
            *counts.adds_failed.entry(code).or_default() += 1;
            counts.first_failure.entry(code).or_insert_with(|| err["details"].to_string());
            false
        };
        if killed {
            counts.lock().await.killed += 1;
            // half the time the runtime went down with it and never tears it down: left to the reconcilers
            if rng.below(2) == 0 {
                counts.lock().await.never_torn_down += 1;
                continue;
            }
        }
        // the runtime tears the failed sandbox down before it tries again
        let mut del = fx.invocation("DEL", &config, &format!("pod-{i}"), &container).with_env("NODENAME", &node(i));
        del.args.push_str(&format!(";K8S_POD_UID={uid}"));
        for _ in 0..10 {
            counts.lock().await.dels += 1;
            if del.run().await.success {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert!(
            attempt < 20,
            "pod-{i}: no address after 20 sandboxes; failures by code {:?}",
            counts.lock().await.adds_failed
        );
    }
    unreachable!()
}

/// The store, as who holds which address: (pool entries by address, reservations by address).
async fn holders(fx: &CniFixture) -> (BTreeMap<IpAddr, BTreeSet<String>>, BTreeMap<IpAddr, String>) {
    let mut entries: BTreeMap<IpAddr, BTreeSet<String>> = BTreeMap::new();
    for pool in Api::<IpPool>::namespaced(fx.admin.clone(), &fx.ns).list(&Default::default()).await.unwrap() {
        let range = hereabouts_ipam::range::IpRange::parse(&pool.spec.range, None, None, &[]).unwrap();
        for (key, entry) in pool.spec.allocations {
            entries.entry(range.addr_at(key.parse().unwrap())).or_default().insert(entry.podref);
        }
    }
    let reservations = Api::<OverlappingRangeIpReservation>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.metadata.name.unwrap().parse().unwrap(), r.spec.podref))
        .collect();
    (entries, reservations)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_under_api_server_restarts_and_killed_processes() {
    let fx = Arc::new(CniFixture::on(TestCluster::own(module_path!()), "campaign").await);
    deploy::apply_rbac(fx.admin.clone()).await;
    deploy::create_lease(&fx.admin, &fx.ns).await;
    let seed = std::process::id() as u64;
    let wide = fx.netconf("1.0.0", "wide", json!({"range": "198.18.80.0/22", "timeout_seconds": 60}));
    // the /23 inside the /22 holds all 320 pods even if every one lands in it; it runs in slice mode (a /26 for
    // each of the 8 nodes), so single-pool and slice writers of the same addresses meet through the reservations
    let narrow = fx.netconf(
        "1.0.0",
        "narrow",
        json!({"range": "198.18.80.0/23", "node_slice_size": "/26", "timeout_seconds": 60}),
    );
    let mut uids = Vec::with_capacity(PODS);
    for i in 0..PODS {
        uids.push(create_pod(&fx, i).await);
    }

    let counts = Arc::new(Mutex::new(Counts::default()));
    let done = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(AT_ONCE));
    let t0 = Instant::now();
    let mut adds = tokio::task::JoinSet::new();
    for (i, uid) in uids.iter().enumerate() {
        let (fx, counts, done, gate) = (fx.clone(), counts.clone(), done.clone(), gate.clone());
        let config = if i % 2 == 0 { wide.clone() } else { narrow.clone() };
        let uid = uid.clone();
        adds.spawn(async move {
            let _slot = gate.acquire_owned().await.unwrap();
            let ips = attach(fx, config, i, uid, seed ^ (i as u64) << 8, counts).await;
            done.fetch_add(1, Ordering::Relaxed);
            (i, ips)
        });
    }
    // the API server goes down twice in the middle of the burst
    for at in [PODS / 3, 2 * PODS / 3] {
        wait::until(Duration::from_secs(600), "the burst to get that far", || async {
            (done.load(Ordering::Relaxed) >= at).then_some(())
        })
        .await
        .unwrap();
        let down = fx.cluster.restart_apiserver().await;
        counts.lock().await.restarts.push(down);
    }
    let mut attached: BTreeMap<usize, Vec<IpAddr>> = BTreeMap::new();
    while let Some(joined) = adds.join_next().await {
        let (i, ips) = joined.unwrap();
        attached.insert(i, ips);
    }
    let burst = t0.elapsed();

    // No address was handed to two pods.
    let mut by_ip: BTreeMap<IpAddr, Vec<usize>> = BTreeMap::new();
    for (i, ips) in &attached {
        for ip in ips {
            by_ip.entry(*ip).or_default().push(*i);
        }
    }
    let duplicates: Vec<_> = by_ip.iter().filter(|(_, pods)| pods.len() > 1).collect();

    // What the faults left behind, before any reconciler ran: entries and reservations no live pod holds.
    let podref = |i: usize| format!("{}/pod-{i}", fx.ns);
    let expected: BTreeMap<IpAddr, String> =
        attached.iter().flat_map(|(i, ips)| ips.iter().map(move |ip| (*ip, podref(*i)))).collect();
    let (entries, reservations) = holders(&fx).await;
    let stray_entries = entries.iter().filter(|(ip, pods)| expected.get(ip).is_none_or(|p| !pods.contains(p))).count();
    let stray_reservations = reservations.iter().filter(|(ip, p)| expected.get(ip) != Some(*p)).count();

    // A quarter of the pods vanish without a DEL; the reconcilers take over.
    let gone: BTreeSet<usize> = (0..PODS).filter(|i| i % 4 == 3).collect();
    let force = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    for i in &gone {
        Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns).delete(&format!("pod-{i}"), &force).await.unwrap();
    }
    let live: BTreeMap<IpAddr, String> = expected
        .iter()
        .filter(|(_, p)| !gone.iter().any(|i| **p == podref(*i)))
        .map(|(ip, p)| (*ip, p.clone()))
        .collect();
    let t1 = Instant::now();
    let mut reconcilers = Vec::new();
    for n in 0..NODES {
        let opts = ReconcilerOptions {
            cron: "*/5 * * * * *".into(),
            orphan_age: "5s".into(),
            identity: format!("campaign-{n}"),
            ..ReconcilerOptions::new(&node(n), &fx.ns)
        };
        reconcilers.push(Reconciler::start(fx.cluster, &opts).await);
    }
    let settled = wait::until(Duration::from_secs(90), "only live pods to hold anything", || async {
        let (entries, reservations) = holders(&fx).await;
        let entries_ok = entries.len() == live.len()
            && entries.iter().all(|(ip, pods)| live.get(ip).is_some_and(|p| pods.len() == 1 && pods.contains(p)));
        (entries_ok && reservations == live).then_some(())
    })
    .await;
    let reclaim = t1.elapsed();
    let (entries, reservations) = holders(&fx).await;
    let lost: Vec<_> = live
        .iter()
        .filter(|(ip, p)| !entries.get(ip).is_some_and(|pods| pods.contains(*p)) || reservations.get(ip) != Some(*p))
        .collect();

    let counts = counts.lock().await;
    eprintln!(
        "campaign (seed {seed}): {} pods, {} ADD processes ({} ok, failed by code {:?}), {} killed ({} never torn \
         down), {} DELs, API server restarts {:?}, burst {:.1} s; first failure of each code: {:?}",
        PODS,
        counts.adds,
        counts.adds_ok,
        counts.adds_failed,
        counts.killed,
        counts.never_torn_down,
        counts.dels,
        counts.restarts,
        burst.as_secs_f64(),
        counts.first_failure
    );
    eprintln!(
        "campaign: held twice {}, left by faults {} entries + {} reservations, {} pods vanished, live losses {}, \
         everything reclaimed {} in {:.1} s",
        duplicates.len(),
        stray_entries,
        stray_reservations,
        gone.len(),
        lost.len(),
        if settled.is_ok() { "" } else { "NOT" },
        reclaim.as_secs_f64()
    );
    assert!(duplicates.is_empty(), "addresses held by two pods: {duplicates:?}");
    assert_eq!(attached.len(), PODS, "every pod got an address");
    assert!(counts.killed >= PODS / 5, "a third of the first tries were killed: {}", counts.killed);
    assert_eq!(counts.restarts.len(), 2);
    assert!(lost.is_empty(), "live pods lost their claims: {lost:?}");
    if let Err(e) = settled {
        let (entries, reservations) = holders(&fx).await;
        panic!("{e}: entries {entries:?}\nreservations {reservations:?}\n{}", reconcilers[0].logs());
    }
}
