//! The leader's release of gone Nodes' sub-interfaces (`sub_interfaces`) against the reference provider (a real
//! HTTPS server) and the in-memory store injecting faults into the leader's calls — answers lost after the write
//! applied, 409, 429, 500 applied or not, the leader dying half-way and another taking over — while an adversary
//! claims those same addresses for pods, as ADDs would. Whatever the faults: the provider is never asked to
//! release an address after a pod claimed it, every idle sub-interface of a gone Node is released in the end (or
//! was claimed first), no hold is left behind, and a live Node's or a pod-held one stays.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::crd::{IpAllocation, SubInterfaceRecord};
use hereabouts_ipam::provider::{AllocateRequest, HOLD_ID, ProviderClient, RELEASE_PATH, SubEniRequest};
use hereabouts_ipam::store::memory::{Fault, FaultPlan, Op};
use hereabouts_ipam::store::{AsRead, MemoryStore, NewPool, Patched, PoolStore};
use hereabouts_reconciler::sub_interfaces::{SubInterfaceKeeper, steps};
use hereabouts_tests::provider::{Fault as ProviderFault, ProviderOptions, ReferenceProvider};
use serde_json::json;

const POOL: &str = "198.18.60.0-24";
const GONE: &str = "node-gone";
const LIVE: &str = "node-live";
/// Offsets whose sub-interfaces are cached on the gone node with nothing in the pool: the keeper's and the
/// adversary's to race for.
const IDLE_GONE: [u128; 7] = [1, 2, 3, 4, 5, 6, 7];
/// On the gone node, held by a pod: the sweep's, not the keeper's.
const HELD_GONE: u128 = 8;
const ON_LIVE: [u128; 2] = [9, 10];

fn ip(offset: u128) -> String {
    format!("198.18.60.{offset}")
}

fn pod(offset: u128) -> IpAllocation {
    IpAllocation { id: format!("c{offset}"), podref: format!("ns/p{offset}"), ..IpAllocation::default() }
}

async fn client(provider: &ReferenceProvider) -> ProviderClient {
    let section = json!({"url": provider.url(), "ca_file": provider.ca_file(), "parent_interface": "lo",
                         "http_request_timeout": "5s"});
    let config = hereabouts_ipam::config::provider::parse(section.as_object().unwrap(), Duration::from_secs(90))
        .expect("a valid section");
    ProviderClient::new(&config).expect("the provider client")
}

/// The pool and the provider as ADDs on both nodes left them.
async fn seed_world(store: &MemoryStore, provider: &ReferenceProvider, client: &ProviderClient) {
    let mut pool = NewPool { network_name: "net", ..NewPool::new(POOL, "198.18.60.0/24", 254) }.object();
    let all = IDLE_GONE.iter().chain([&HELD_GONE]).map(|o| (*o, GONE)).chain(ON_LIVE.iter().map(|o| (*o, LIVE)));
    for (offset, node) in all {
        let request = AllocateRequest {
            pod_name: format!("p{offset}"),
            pod_namespace: "ns".into(),
            node_name: node.into(),
            sub_eni_requests: vec![SubEniRequest {
                subnet: "198.18.60.0/24".into(),
                ipv4_address: ip(offset),
                ipv4_pool_name: POOL.into(),
                ..SubEniRequest::default()
            }],
            ..AllocateRequest::default()
        };
        client.allocate(&request, &Budget::new(Duration::from_secs(5))).await.expect("the provider made it");
        let record = SubInterfaceRecord { node: node.into(), ..SubInterfaceRecord::default() };
        pool.spec.sub_interfaces.insert(offset.to_string(), record);
    }
    pool.spec.allocations.insert(HELD_GONE.to_string(), pod(HELD_GONE));
    for offset in ON_LIVE {
        pool.spec.allocations.insert(offset.to_string(), pod(offset));
    }
    store.put_pool(pool);
    assert_eq!(provider.sub_enis().len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_release_after_a_pods_claim_under_store_faults_and_a_dying_leader() {
    let kinds = [Fault::LostResponse, Fault::Conflict, Fault::TooMany, Fault::ServerError];
    let live: BTreeSet<String> = [LIVE.to_string()].into();
    let (mut released_total, mut claimed_total, mut leaders_total) = (0, 0, 0);
    let mut faults_total: BTreeMap<Fault, u64> = BTreeMap::new();
    for seed in 1..=12u64 {
        let provider = Arc::new(ReferenceProvider::start(ProviderOptions::default()).await);
        let store = MemoryStore::new("ns");
        seed_world(&store, &provider, &client(&provider).await).await;
        provider.inject(ProviderFault::Status(500));
        let leader_calls_from = provider.calls().len();

        // the adversary: claims idle addresses of the gone node for pods, one every few milliseconds, noting how
        // many provider calls had been answered when its claim applied
        let claims: Arc<Mutex<BTreeMap<u128, usize>>> = Arc::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let adversary = {
            let (store, claims, stop, provider) =
                (store.handle("adds", FaultPlan::quiet(seed)), claims.clone(), stop.clone(), provider.clone());
            tokio::spawn(async move {
                let mut order: Vec<u128> = IDLE_GONE.to_vec();
                order.rotate_left((seed % 7) as usize);
                for offset in order.into_iter().cycle() {
                    if stop.is_cancelled() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(3 + seed % 5)).await;
                    if offset % 2 == u128::from(seed % 2) || claims.lock().unwrap().contains_key(&offset) {
                        continue; // half the addresses only, so that the keeper gets the others
                    }
                    if let Ok(Patched::Applied) =
                        store.add_allocation(POOL, offset, &pod(offset), &AsRead::default()).await
                    {
                        claims.lock().unwrap().insert(offset, provider.calls().len());
                    }
                }
            })
        };

        // leaders, one after another as each dies, until a pass finds nothing to do
        let leader_of = |n: u64| {
            let mut plan = FaultPlan::random(seed * 1000 + n, 0.2, &kinds);
            if n == 0 {
                // the first leader dies at one of its writes: applied or not, the next one finishes its work
                let ops = [Op::AddAllocation, Op::RemoveSubInterface, Op::RemoveAllocation];
                plan = plan.at(ops[(seed % 3) as usize], 1 + (seed % 2) as u32, Fault::Die);
            }
            store.handle(&format!("leader-{n}"), plan)
        };
        let mut leader = 0;
        let mut keeper = SubInterfaceKeeper {
            store: leader_of(0),
            provider: client(&provider).await,
            call_budget: Duration::from_secs(5),
        };
        let mut quiet_passes = 0;
        for pass in 0.. {
            assert!(pass < 200, "seed {seed}: no end after 200 passes: {:?}", store.pools());
            let died = async {
                while !keeper.store.is_dead() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            tokio::select! {
                _ = keeper.pass(&live) => {}
                () = died => {
                    leader += 1;
                    keeper.store = leader_of(leader);
                    continue;
                }
                () = tokio::time::sleep(Duration::from_secs(60)) => panic!("seed {seed}: a pass that hangs without dying"),
            }
            let pool = store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some(POOL)).unwrap();
            if steps(&pool, &live).is_empty() {
                quiet_passes += 1;
                // two quiet passes, the adversary still running in between: nothing can be left to race for
                if quiet_passes == 2 {
                    break;
                }
            } else {
                quiet_passes = 0;
            }
        }
        stop.cancel();
        adversary.await.unwrap();

        let calls = provider.calls();
        let claims = claims.lock().unwrap().clone();
        let releases: Vec<(usize, String)> = calls
            .iter()
            .enumerate()
            .skip(leader_calls_from)
            .filter(|(_, c)| c.path == RELEASE_PATH && c.status == 200)
            .map(|(i, c)| (i, c.body["ipAddress"].as_str().unwrap().to_string()))
            .collect();
        for (offset, seen) in &claims {
            let late: Vec<_> = releases.iter().filter(|(i, a)| *a == ip(*offset) && i >= seen).collect();
            assert!(late.is_empty(), "seed {seed}: {} released after a pod claimed it: {late:?}", ip(*offset));
        }
        let pool = store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some(POOL)).unwrap();
        assert!(!pool.spec.allocations.values().any(|e| e.id == HOLD_ID), "seed {seed}: a hold is left: {pool:?}");
        let enis = provider.sub_enis();
        for offset in IDLE_GONE {
            if claims.contains_key(&offset) {
                assert_eq!(pool.spec.allocations[&offset.to_string()], pod(offset), "seed {seed}");
                continue;
            }
            assert!(!enis.contains_key(&ip(offset)), "seed {seed}: {} not released: {enis:?}", ip(offset));
            assert!(
                !pool.spec.sub_interfaces.contains_key(&offset.to_string()),
                "seed {seed}: record of {offset} stays"
            );
            assert!(!pool.spec.allocations.contains_key(&offset.to_string()), "seed {seed}: {offset} not free");
        }
        for offset in ON_LIVE.iter().chain([&HELD_GONE]) {
            assert!(enis.contains_key(&ip(*offset)), "seed {seed}: {} released", ip(*offset));
            assert!(pool.spec.sub_interfaces.contains_key(&offset.to_string()), "seed {seed}");
        }
        released_total += IDLE_GONE.len() - claims.len();
        claimed_total += claims.len();
        leaders_total += leader + 1;
        for (fault, n) in store.faults() {
            *faults_total.entry(fault).or_default() += n;
        }
    }
    eprintln!(
        "12 seeds: {released_total} released through the provider, {claimed_total} claimed by pods first, \
         {leaders_total} leaders, store faults {faults_total:?}"
    );
    assert!(claimed_total > 0 && released_total > 0, "both sides of the race were exercised");
    assert!(faults_total.len() >= 4, "the faults were injected: {faults_total:?}");
    assert!(faults_total.get(&Fault::Die).is_some_and(|n| *n > 0), "a leader died half-way: {faults_total:?}");
}
