//! The warm reserve over the in-memory store: claims, hand-overs and give-backs as the guarded patches make them,
//! under lost answers; and the agent's reserves (journal, replay, DEL before the hand-over).

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::Mode;
use crate::store::memory::{Fault, FaultPlan, MemoryStore, Op};
use crate::verbs::{Settling, WarmSettled};

const NS: &str = "kube-system";

fn config(pod: &str, reserve: bool) -> (IpamConfig, SliceMode) {
    config_of(pod, reserve, 2)
}

fn config_of(pod: &str, reserve: bool, warm: u32) -> (IpamConfig, SliceMode) {
    let ipam = serde_json::json!({
        "type": "hereabouts", "range": "198.18.0.0/24", "node_slice_size": "/28", "warm_addresses": warm,
        "enable_overlapping_ranges": reserve, "kubernetes": {"kubeconfig": "/k"},
    });
    let stdin = serde_json::json!({"cniVersion": "1.0.0", "name": "net", "type": "macvlan", "ipam": ipam}).to_string();
    let args = format!("K8S_POD_NAMESPACE=ns;K8S_POD_NAME={pod};K8S_POD_UID={pod}-uid");
    let cfg = crate::config::load_with_paths(&crate::config::Input { stdin: stdin.as_bytes(), cni_args: &args }, &[])
        .unwrap();
    let Mode::Slices(mode) = cfg.mode.clone() else { panic!("slices") };
    (cfg, mode)
}

fn take_of(slot: &Slot, pod: &str, container: &str) -> Take {
    Take {
        reserve: "r".into(),
        network: "net".into(),
        kubeconfig: "/k".into(),
        node: "node-a".into(),
        slot: slot.clone(),
        podref: format!("ns/{pod}"),
        poduid: Some(format!("{pod}-uid")),
        container: container.into(),
        ifname: "net1".into(),
        at: crate::clock::now().to_string(),
    }
}

fn budget() -> Budget {
    Budget::new(Duration::from_secs(30))
}

/// Who holds the entry and the reservation of `slot`'s address.
fn holders(store: &MemoryStore, slot: &Slot) -> (Option<String>, Option<String>) {
    let held = &slot.held[0];
    let pool = store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some(held.pool.as_str())).unwrap();
    let entry = pool.spec.allocations.get(&held.offset.to_string()).map(|a| format!("{} {}", a.podref, a.id));
    let reservation = held.reservation.as_ref().and_then(|name| {
        store
            .reservations()
            .into_iter()
            .find(|r| r.metadata.name.as_deref() == Some(name.as_str()))
            .map(|r| format!("{} {}", r.spec.podref, r.spec.containerid))
    });
    (entry, reservation)
}

#[tokio::test]
async fn a_filled_slot_is_the_nodes_and_a_hand_over_makes_it_the_pods_however_often_sent() {
    let store = MemoryStore::new(NS);
    let (cfg, mode) = config("p", true);
    let slot = fill(&store, &cfg, &mode, "node-a", "warm-1", &budget()).await.unwrap();
    assert_eq!(slot.held.len(), 1);
    assert_eq!(
        holders(&store, &slot),
        (Some("hereabouts-warm:node-a warm-1".into()), Some("hereabouts-warm:node-a warm-1".into()))
    );
    let take = take_of(&slot, "p", "c1");
    for _ in 0..2 {
        let outcome = hand_over(&store, std::slice::from_ref(&take), &budget()).await;
        assert!(outcome.iter().all(Result::is_ok), "{outcome:?}");
        assert_eq!(holders(&store, &slot), (Some("ns/p c1".into()), Some("ns/p c1".into())));
    }
    let pool = store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some(&slot.held[0].pool)).unwrap();
    let entry = &pool.spec.allocations[&slot.held[0].offset.to_string()];
    assert!(entry.is_recorded() && entry.reserved && entry.poduid.as_deref() == Some("p-uid"), "{entry:?}");
}

#[tokio::test]
async fn hand_overs_whose_answers_are_lost_read_back_and_finish_in_one_patch_per_pool() {
    let base = MemoryStore::new(NS);
    let (cfg, mode) = config("p", true);
    let mut slots = Vec::new();
    for i in 0..3 {
        slots.push(fill(&base, &cfg, &mode, "node-a", &format!("warm-{i}"), &budget()).await.unwrap());
    }
    let takes: Vec<Take> =
        slots.iter().enumerate().map(|(i, s)| take_of(s, &format!("p{i}"), &format!("c{i}"))).collect();
    // the batch's patch is applied but its answer lost, and so is one reservation's rewrite
    let plan = FaultPlan::quiet(7).at(Op::AddAllocation, 1, Fault::LostResponse).at(
        Op::TakeOverReservation,
        2,
        Fault::LostResponse,
    );
    let faulty = base.handle("agent", plan);
    let writes = base.writes();
    let outcome = hand_over(&faulty, &takes, &budget()).await;
    assert!(outcome.iter().all(Result::is_ok), "{outcome:?}");
    for (i, slot) in slots.iter().enumerate() {
        assert_eq!(holders(&base, slot), (Some(format!("ns/p{i} c{i}")), Some(format!("ns/p{i} c{i}"))));
    }
    assert_eq!(base.writes() - writes, 4, "three reservations and one patch of the pool's three entries");
}

#[tokio::test]
async fn a_warm_entry_another_pod_holds_now_is_reported_lost_and_nothing_is_written() {
    let store = MemoryStore::new(NS);
    let (cfg, mode) = config("p", false);
    let slot = fill(&store, &cfg, &mode, "node-a", "warm-1", &budget()).await.unwrap();
    // another tool frees it and another pod claims it
    let held = &slot.held[0];
    let other = IpAllocation { id: "c9".into(), podref: "ns/q".into(), ifname: "net1".into(), ..Default::default() };
    store.replace_allocation(&held.pool, held.offset, &slot.entry("node-a"), &other).await.unwrap();
    let writes = store.writes();
    let outcome = hand_over(&store, &[take_of(&slot, "p", "c1")], &budget()).await;
    assert!(matches!(outcome[..], [Err(HandOverError::Lost { .. })]), "{outcome:?}");
    assert_eq!(store.writes(), writes);
    assert_eq!(holders(&store, &slot).0, Some("ns/q c9".into()));
}

#[tokio::test]
async fn adoption_takes_whole_slots_of_its_node_and_network_and_leaves_the_journals() {
    let store = MemoryStore::new(NS);
    let (cfg, mode) = config("p", true);
    let a1 = fill(&store, &cfg, &mode, "node-a", "warm-1", &budget()).await.unwrap();
    let a2 = fill(&store, &cfg, &mode, "node-a", "warm-2", &budget()).await.unwrap();
    let b1 = fill(&store, &cfg, &mode, "node-b", "warm-3", &budget()).await.unwrap();
    let (whole, partial) = adopt(&cfg, &store.pools(), "node-a", &|c| c == "warm-2");
    assert_eq!(whole, vec![a1.clone()]);
    assert!(partial.is_empty());
    let mut other = cfg.clone();
    other.name = "other".into();
    assert!(adopt(&other, &store.pools(), "node-a", &|_| false).0.is_empty(), "another network's config");
    assert!(give_back(&store, &a1, "node-a", &budget()).await.is_empty());
    assert_eq!(holders(&store, &a1), (None, None));
    assert_eq!(holders(&store, &a2).0, Some("hereabouts-warm:node-a warm-2".into()));
    assert_eq!(holders(&store, &b1).0, Some("hereabouts-warm:node-b warm-3".into()));
}

fn reserves(dir: &std::path::Path, store: &MemoryStore) -> Reserves<MemoryStore> {
    let reserves = Reserves::open("node-a", dir, Arc::new(|_| Box::pin(async { Ok(()) })));
    reserves.know(std::path::Path::new("/k"), store.clone());
    reserves
}

fn request(container: &str) -> Request {
    Request { container_id: container.into(), ifname: "net1".into(), node: "node-a".into() }
}

/// Reserves over `store` whose first ADD (of `pod`, as the first sandbox `c0`) found them empty, once they are full.
async fn filled(
    dir: &std::path::Path,
    store: &MemoryStore,
    pod: &str,
) -> (Reserves<MemoryStore>, IpamConfig, SliceMode) {
    let r = reserves(dir, store);
    let (cfg, mode) = config(pod, true);
    assert_eq!(r.take(&cfg, &mode, &request("c0"), true, "/k".as_ref(), store.clone()), None, "empty at first");
    until("filled", || r.held().get("net") == Some(&2)).await;
    (r, cfg, mode)
}

/// Waits (on the paused clock) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within a minute");
}

#[tokio::test(start_paused = true)]
async fn the_reserve_answers_from_its_slots_hands_them_over_and_refills() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new(NS);
    let (r, _, mode) = filled(dir.path(), &store, "p0").await;
    let mut answered = Vec::new();
    for i in 1..=2 {
        let (cfg, _) = config(&format!("p{i}"), true);
        let got = r.take(&cfg, &mode, &request(&format!("c{i}")), true, "/k".as_ref(), store.clone()).unwrap();
        let again = r.take(&cfg, &mode, &request(&format!("c{i}")), false, "/k".as_ref(), store.clone());
        assert_eq!(again.as_ref(), Some(&got), "a retry gets the same answer");
        answered.push(got[0].ip);
    }
    until("handed over", || r.pending() == 0).await;
    until("refilled", || r.held().get("net") == Some(&2)).await;
    let pools = store.pools();
    for (i, ip) in answered.iter().enumerate() {
        let holder = pools.iter().find_map(|p| {
            let offset = crate::claim::address_of(p, 0).and_then(|_| {
                p.spec.allocations.iter().find(|(k, _)| crate::claim::address_of(p, k.parse().unwrap()) == Some(*ip))
            })?;
            Some(offset.1.podref.clone())
        });
        assert_eq!(holder, Some(format!("ns/p{}", i + 1)));
    }
    r.stop();
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_takes_writes_nothing_until_it_pauses_then_is_handed_over_and_refilled() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new(NS);
    let r = reserves(dir.path(), &store);
    let (cfg, mode) = config_of("p0", true, 8);
    assert_eq!(r.take(&cfg, &mode, &request("c0"), true, "/k".as_ref(), store.clone()), None, "empty at first");
    until("filled", || r.held().get("net") == Some(&8)).await;
    // six ADDs 20 ms apart: the hand-over and the refill wait for the pause after them, so the burst's ADDs share
    // neither the node's cores nor the API server with their writes
    let writes = store.writes();
    for i in 1..=6 {
        let (cfg, _) = config_of(&format!("p{i}"), true, 8);
        assert!(r.take(&cfg, &mode, &request(&format!("c{i}")), true, "/k".as_ref(), store.clone()).is_some());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.writes(), writes, "nothing written while the takes came");
    until("handed over", || r.pending() == 0).await;
    until("refilled", || r.held().get("net") == Some(&8)).await;
    r.stop();
}

#[tokio::test(start_paused = true)]
async fn a_take_survives_the_agents_death_and_a_del_before_any_write_gives_the_slot_back() {
    let dir = tempfile::tempdir().unwrap();
    let base = MemoryStore::new(NS);
    let (cfg, mode) = config("p1", true);
    // an agent whose API server stops answering once its reserve is full
    let first = reserves(dir.path(), &base);
    assert_eq!(first.take(&cfg, &mode, &request("c0"), true, "/k".as_ref(), base.clone()), None);
    until("filled", || first.held().get("net") == Some(&2)).await;
    let away = base.handle(
        "away",
        (1..=1000).fold(FaultPlan::quiet(3), |p, n| {
            p.at(Op::GetReservation, n, Fault::TooMany).at(Op::AddAllocation, n, Fault::TooMany)
        }),
    );
    let a = first.take(&cfg, &mode, &request("c1"), true, "/k".as_ref(), away.clone()).unwrap();
    let (cfg2, _) = config("p2", true);
    first.know("/k".as_ref(), away.clone());
    let b = first.take(&cfg2, &mode, &request("c2"), true, "/k".as_ref(), away).unwrap();
    assert_ne!(a, b);
    // the agent dies before anything is handed over; its successor replays the journal
    first.stop();
    let second = reserves(dir.path(), &base);
    assert_eq!(second.pending(), 2);
    until("replayed", || second.pending() == 0).await;
    let pools = base.pools();
    let holder = |ip: std::net::IpAddr| {
        pools.iter().find_map(|p| {
            p.spec.allocations.iter().find_map(|(k, e)| {
                (crate::claim::address_of(p, k.parse().unwrap()) == Some(ip)).then(|| e.podref.clone())
            })
        })
    };
    assert_eq!(holder(a[0].ip).as_deref(), Some("ns/p1"));
    assert_eq!(holder(b[0].ip).as_deref(), Some("ns/p2"));

    second.stop();
}

/// S1 of the fourth review: a CHECK of a running container whose take was not handed over yet (the API server
/// away, or inside the quiet pause) gave its slot back to the reserve, and the next pod's first ADD was handed the
/// same address. A CHECK hands over or leaves the take pending, never gives it back.
#[tokio::test(start_paused = true)]
async fn a_check_never_gives_a_running_pods_take_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new(NS);
    let (r, _, mode) = filled(dir.path(), &store, "p0").await;
    // the API server away: every hand-over round fails before it sends anything
    let away = store
        .handle("away", (1..=10_000).fold(FaultPlan::quiet(5), |p, n| p.at(Op::GetReservation, n, Fault::TooMany)));
    r.know("/k".as_ref(), away.clone());
    let (cfg_a, _) = config("pa", true);
    let a = r.take(&cfg_a, &mode, &request("ca"), true, "/k".as_ref(), away.clone()).unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(r.pending(), 1, "not handed over while away");
    for _ in 0..3 {
        assert_eq!(r.settle("net", &request("ca"), Settling::Check).await, WarmSettled::Pending);
    }
    assert_eq!(r.pending(), 1, "still pa's");
    let (cfg_b, _) = config("pb", true);
    let b = r.take(&cfg_b, &mode, &request("cb"), true, "/k".as_ref(), away.clone());
    assert_ne!(b.as_ref(), Some(&a), "pb was handed pa's address");

    // inside the quiet pause, with the API server answering: the CHECK hands the take over at once
    r.know("/k".as_ref(), store.clone());
    until("handed over", || r.pending() == 0).await;
    until("refilled", || r.held().get("net").is_some_and(|n| *n > 0)).await;
    let (cfg_c, _) = config("pc", true);
    let c = r.take(&cfg_c, &mode, &request("cc"), true, "/k".as_ref(), store.clone()).unwrap();
    assert_eq!(r.settle("net", &request("cc"), Settling::Check).await, WarmSettled::HandedOver);
    assert_eq!(r.pending(), 0);
    let (cfg_d, _) = config("pd", true);
    if let Some(d) = r.take(&cfg_d, &mode, &request("cd"), true, "/k".as_ref(), store.clone()) {
        assert_ne!(d, c, "pd was handed pc's address");
    }
    let pc = store
        .pools()
        .iter()
        .flat_map(|p| p.spec.allocations.values().cloned().collect::<Vec<_>>())
        .filter(|e| e.podref == "ns/pc")
        .count();
    assert_eq!(pc, 1, "pc's entry is in the API server");
}

/// S4 of the fourth review: the check for Whereabouts' reconciler ran once per agent, so one installed later (a
/// rollback, its manifest applied again), which frees the node's warm entries, was never seen and the agent kept
/// handing them out. It is checked every FLEET_EVERY: refused, nothing is taken and the reserve is dropped from
/// memory; allowed again, it is read again from the API server.
#[tokio::test(start_paused = true)]
async fn a_whereabouts_reconciler_installed_later_stops_the_reserve_and_its_removal_restarts_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new(NS);
    let whereabouts = Arc::new(AtomicBool::new(false));
    let runs = whereabouts.clone();
    let check: FleetCheck<MemoryStore> = Arc::new(move |_| {
        let runs = runs.load(Ordering::SeqCst);
        Box::pin(async move {
            if runs {
                Err("Deployment kube-system/whereabouts-reconciler runs Whereabouts' reconciler".into())
            } else {
                Ok(())
            }
        })
    });
    let r = Reserves::open("node-a", dir.path(), check);
    r.know(std::path::Path::new("/k"), store.clone());
    let (cfg, mode) = config("p0", true);
    assert_eq!(r.take(&cfg, &mode, &request("c0"), true, "/k".as_ref(), store.clone()), None, "empty at first");
    until("filled", || r.held().get("net") == Some(&2)).await;
    assert_eq!(r.refused(), None);

    whereabouts.store(true, Ordering::SeqCst);
    tokio::time::sleep(FLEET_EVERY + Duration::from_secs(1)).await;
    assert!(r.refused().is_some_and(|why| why.contains("whereabouts-reconciler")), "{:?}", r.refused());
    assert_eq!(r.held().get("net").copied().unwrap_or(0), 0, "the reserve is dropped from memory");
    let (cfg1, _) = config("p1", true);
    assert_eq!(r.take(&cfg1, &mode, &request("c1"), true, "/k".as_ref(), store.clone()), None, "nothing taken");

    whereabouts.store(false, Ordering::SeqCst);
    tokio::time::sleep(FLEET_EVERY + Duration::from_secs(1)).await;
    assert_eq!(r.refused(), None);
    let (cfg2, _) = config("p2", true);
    assert_eq!(r.take(&cfg2, &mode, &request("c2"), true, "/k".as_ref(), store.clone()), None, "read again first");
    until("adopted again", || r.held().get("net") == Some(&2)).await;
    let warm_entries = |store: &MemoryStore| {
        store
            .pools()
            .iter()
            .flat_map(|p| p.spec.allocations.values().cloned().collect::<Vec<_>>())
            .filter(|a| a.podref == "hereabouts-warm:node-a")
            .count()
    };
    assert_eq!(warm_entries(&store), 2, "the node's two slots, read back, none claimed twice");
    let (cfg3, _) = config("p3", true);
    assert!(r.take(&cfg3, &mode, &request("c3"), true, "/k".as_ref(), store.clone()).is_some());
}

/// S3 of the fourth review: a reserve stayed the node's for good once no config asked for it (`warm_addresses`
/// removed or 0, the NAD deleted, its key changed): nothing gave its slots back, and the reconciler keeps a node's
/// warm entries while the Node exists. What no config wants is given back now, from memory and from the API
/// server, but for pending takes (their pods run with those addresses) and reserves made after the NADs were read.
#[tokio::test(start_paused = true)]
async fn a_reserve_no_config_asks_for_is_given_back_but_its_pending_takes() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new(NS);
    let (r, _, mode) = filled(dir.path(), &store, "p0").await;
    let warm_entries = |store: &MemoryStore| {
        let pools = store.pools();
        let mut ids: Vec<String> = pools
            .iter()
            .flat_map(|p| p.spec.allocations.values().cloned().collect::<Vec<_>>())
            .filter(|a| a.podref == "hereabouts-warm:node-a")
            .map(|a| a.id)
            .collect();
        ids.sort();
        ids
    };
    // a pod takes a slot while the API server is away: its take stays pending
    let away = store
        .handle("away", (1..=10_000).fold(FaultPlan::quiet(5), |p, n| p.at(Op::GetReservation, n, Fault::TooMany)));
    r.know("/k".as_ref(), away.clone());
    let (cfg1, _) = config("p1", true);
    r.take(&cfg1, &mode, &request("c1"), true, "/k".as_ref(), away).unwrap();
    until("refilled", || r.held().get("net") == Some(&2)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(r.pending(), 1);
    let before = warm_entries(&store);
    assert_eq!(before.len(), 3, "the reserve's two slots and p1's pending take: {before:?}");

    // the config still asks for it: nothing goes
    let mut wanted = Wanted::default();
    let (cfg, _) = config("p0", true);
    wanted.add("/k".as_ref(), &cfg, &mode);
    assert_eq!(r.retire_unwanted(&wanted, tokio::time::Instant::now(), true).await, 0);
    assert_eq!(warm_entries(&store), before);
    // read before the reserve was made: a reserve younger than the list stays
    assert_eq!(
        r.retire_unwanted(&Wanted::default(), tokio::time::Instant::now() - Duration::from_secs(3600), true).await,
        0
    );
    assert_eq!(warm_entries(&store), before);

    // no NAD asks for it, but ADDs did lately (a config written on the node, no NAD's): kept
    assert_eq!(r.retire_unwanted(&Wanted::default(), tokio::time::Instant::now(), true).await, 0);
    assert_eq!(warm_entries(&store), before);

    // no config asks for it any more, and no ADD for ten minutes: the reserve's slots are given back, the pending
    // take kept (its pod runs with that address)
    tokio::time::sleep(Duration::from_secs(601)).await;
    assert_eq!(r.pending(), 1, "still away");
    assert_eq!(r.retire_unwanted(&wanted, tokio::time::Instant::now(), true).await, 0, "a config asks: kept");
    assert_eq!(warm_entries(&store), before);
    let given = r.retire_unwanted(&Wanted::default(), tokio::time::Instant::now(), true).await;
    assert_eq!(given, 2);
    assert_eq!(r.held().get("net").copied().unwrap_or(0), 0);
    let left = warm_entries(&store);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(r.pending(), 1);
    r.know("/k".as_ref(), store.clone());
    until("handed over", || r.pending() == 0).await;
    assert!(warm_entries(&store).is_empty(), "p1's take is p1's now, nothing of the node's is left");

    // what an earlier agent left in the API server, never in this one's memory, goes the same way
    let (cfg2, mode2) = config("p2", true);
    let earlier = fill(&store, &cfg2, &mode2, "node-a", "warm-earlier", &budget()).await.unwrap();
    assert_eq!(warm_entries(&store), vec!["warm-earlier".to_string()]);
    assert_eq!(r.retire_unwanted(&Wanted::default(), tokio::time::Instant::now(), true).await, 1);
    assert_eq!(holders(&store, &earlier), (None, None));
}

#[tokio::test(start_paused = true)]
async fn a_del_before_any_hand_over_write_gives_the_slot_back_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new(NS);
    let (r, cfg, mode) = filled(dir.path(), &store, "p1").await;
    let writes = store.writes();
    let got = r.take(&cfg, &mode, &request("c1"), true, "/k".as_ref(), store.clone()).unwrap();
    // no await in between: the hand-over round has not run
    assert_eq!(r.settle("net", &request("c1"), Settling::Del).await, WarmSettled::GivenBack);
    assert_eq!(store.writes(), writes, "nothing of the pod's was written");
    assert_eq!(r.held().get("net"), Some(&2), "the slot is back");
    assert_eq!(r.pending(), 0);
    assert_eq!(r.settle("net", &request("c1"), Settling::Del).await, WarmSettled::Nothing);
    // the next pod gets it
    let (cfg2, _) = config("p2", true);
    let next = r.take(&cfg2, &mode, &request("c2"), true, "/k".as_ref(), store.clone()).unwrap();
    assert!(next == got || r.held().get("net") == Some(&1));

    until("handed over", || r.pending() == 0).await;
    // the API server away: rounds fail before sending anything, so a DEL still gives the slot back
    let away = store
        .handle("away", (1..=10_000).fold(FaultPlan::quiet(5), |p, n| p.at(Op::GetReservation, n, Fault::TooMany)));
    r.know("/k".as_ref(), away.clone());
    let (cfg3, _) = config("p3", true);
    until("a slot to take", || r.held().get("net").is_some_and(|n| *n > 0)).await;
    assert!(r.take(&cfg3, &mode, &request("c3"), true, "/k".as_ref(), away).is_some());
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(r.pending(), 1, "not handed over while away");
    assert_eq!(r.settle("net", &request("c3"), Settling::Del).await, WarmSettled::GivenBack);
    let p3 = |podref: &str| podref == "ns/p3";
    assert!(!store.pools().iter().any(|p| p.spec.allocations.values().any(|a| p3(&a.podref))), "no entry of p3");
    assert!(!store.reservations().iter().any(|r| p3(&r.spec.podref)), "no reservation of p3");
    r.stop();
}

#[tokio::test(start_paused = true)]
async fn no_slot_is_taken_while_the_node_is_missing_and_the_reserve_is_read_again_when_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new(NS);
    let (r, cfg, mode) = filled(dir.path(), &store, "p1").await;
    r.node_seen(false);
    assert_eq!(r.held().get("net"), Some(&0), "dropped from memory");
    assert_eq!(r.take(&cfg, &mode, &request("c1"), true, "/k".as_ref(), store.clone()), None);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(r.held().get("net"), Some(&0), "nothing claimed or read while the Node is missing");
    let warm = |s: &MemoryStore| {
        s.pools()
            .iter()
            .flat_map(|p| p.spec.allocations.values().cloned().collect::<Vec<_>>())
            .filter(|a| node_of(&a.podref).is_some())
            .count()
    };
    assert_eq!(warm(&store), 2, "the entries stay the node's");
    r.node_seen(true);
    assert_eq!(r.take(&cfg, &mode, &request("c2"), true, "/k".as_ref(), store.clone()), None, "read again first");
    until("read again", || r.held().get("net") == Some(&2)).await;
    assert_eq!(warm(&store), 2, "the same two: taken in, none claimed anew");
    assert!(r.take(&cfg, &mode, &request("c3"), true, "/k".as_ref(), store.clone()).is_some());
    r.stop();
}
