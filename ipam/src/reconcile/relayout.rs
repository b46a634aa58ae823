//! Online re-layout: the live entries of pools a changed config replaced ([`crate::store::OVERLAPS_ANNOTATION`]: a
//! range grown, shrunk or moved; node slices given up for one pool) move into the pool that replaced them, each pod
//! keeping its address, while ADDs and DELs go on. Once the replacing pool is older than any ADD runs (no ADD begun
//! under the old config is left), each entry whose address the new range holds is copied into the new pool at the
//! same address, guarded on that offset being free, then removed from the old one, guarded on being as read; the
//! old pool, emptied, is then retired ([`super::retire`]). Reservations are named after the network and the address,
//! so they stay as they are.
//!
//! Every step can be cut short and taken again: a copy whose answer was lost is found in the new pool as the same
//! attachment's, and the old entry is then removed; a copy whose old entry went meanwhile (the pod's DEL, which
//! looks in both pools) is taken back, and a DEL that released an entry in the replaced pool reads the new pool
//! once more (the move may have come between its reads and its removal), so no entry outlives its pod. An offset of the new pool held by another
//! attachment is never written (ADDs of the new pool keep off what the old pools hold, so it is reported, not
//! expected). An entry whose address the new range does not hold (a range shrunk below a live address) stays where
//! it is until its pod goes, and is reported.

use std::net::IpAddr;

use std::time::Duration;

use crate::budget::Budget;
use crate::claim::pool_scope;
use crate::crd::{IpAllocation, IpPool};
use crate::error::IpamError;
use crate::range::{Hosts, IpRange};
use crate::store::{AsRead, Patched, PoolStore, StoreError, guard, overlaps_of};

/// How long one move may take, all its requests and their retries.
const MOVE_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// One entry of a replaced pool, and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The replaced pool.
    pub from: String,
    /// Its offset there.
    pub from_offset: u128,
    /// The pool that replaced it.
    pub to: String,
    /// The same address's offset there.
    pub to_offset: u128,
    /// The address.
    pub ip: IpAddr,
    /// The entry.
    pub entry: IpAllocation,
    /// Whether the replaced pool, as read, has annotations (the removal adds its trace to them).
    pub annotated: bool,
}

/// What the listed pools call for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The entries to move.
    pub moves: Vec<Move>,
    /// Entries whose address no settled replacing pool's range holds (a range shrunk below them, a slice no node
    /// holds yet): `(pool, address, podref)`.
    pub stranded: Vec<(String, IpAddr, String)>,
    /// Replacing pools younger than the settle time, left for a later pass: ADDs under the old config may run.
    pub unsettled: Vec<String>,
}

/// What applying a plan came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moved {
    /// Entries now in the replacing pool only.
    pub moved: usize,
    /// Moves not made this time (an entry gone or changed meanwhile, an offset another attachment holds, a
    /// request that failed): the next pass reads again.
    pub skipped: usize,
}

/// The addresses a pool's entries may have for an ADD to have been able to hand them out: a range's pool, its inner
/// hosts (every address of a /31 or a /32, which only `enable_l3` makes); a slice's pool, every address of the
/// slice (a slice's first and last addresses are hosts of the range it cuts).
fn hosts_of(pool: &IpPool) -> Option<IpRange> {
    let all = IpRange::parse_as(&pool.spec.range, None, None, &[], Hosts::All).ok();
    let (range, network) = pool_scope(pool)?;
    let whole = pool.metadata.name.as_deref() == Some(crate::names::pool_name(&network, range.cidr()).as_str());
    if !whole {
        return all;
    }
    IpRange::parse(&pool.spec.range, None, None, &[]).ok().or(all)
}

/// The moves `pools` (as listed) call for at `now`, into replacing pools older than `settle`
/// ([`super::retire::settled`]). A pool may be replaced by several (one pool given up for node slices: each slice's
/// pool names it); each entry goes to the one whose range holds its address.
pub fn plan(pools: &[IpPool], now: k8s_openapi::jiff::Timestamp, settle: Duration) -> Plan {
    let mut plan = Plan::default();
    // each replaced pool: the settled pools that replace it, with the config that made each
    let mut replacing: std::collections::BTreeMap<String, Vec<(String, IpRange, Option<String>)>> = Default::default();
    for new in pools {
        let named = overlaps_of(new);
        let Some(to) = new.metadata.name.clone().filter(|_| !named.is_empty()) else { continue };
        if !super::retire::settled(new, now, settle) {
            plan.unsettled.push(to);
            continue;
        }
        let Some(hosts) = hosts_of(new) else { continue };
        let config = crate::store::config_of(new).map(str::to_string);
        for from in named {
            replacing.entry(from).or_default().push((to.clone(), hosts.clone(), config.clone()));
        }
    }
    for (from, into) in &replacing {
        let Some(old) = pools.iter().find(|p| p.metadata.name.as_deref() == Some(from.as_str())) else { continue };
        let Some((old_range, _)) = pool_scope(old) else { continue };
        for (key, entry) in &old.spec.allocations {
            let Some(ip) = key.parse().ok().and_then(|o| old_range.checked_addr_at(o)) else { continue };
            let from_offset = old_range.offset_of(ip).expect("an address of the range");
            // an entry recorded for another config (one that shares the network name) is never that config's to move
            let for_it = |config: &Option<String>| match (config, &entry.network) {
                (Some(config), Some(network)) => config == network,
                _ => true,
            };
            let target = into.iter().filter(|(_, _, config)| for_it(config)).find_map(|(to, hosts, _)| {
                hosts.offset_of(ip).filter(|&o| hosts.is_usable(o)).map(|to_offset| (to, to_offset))
            });
            match target {
                Some((to, to_offset)) => plan.moves.push(Move {
                    from: from.clone(),
                    from_offset,
                    to: to.clone(),
                    to_offset,
                    ip,
                    entry: entry.clone(),
                    annotated: old.metadata.annotations.is_some(),
                }),
                None => plan.stranded.push((from.clone(), ip, entry.podref.clone())),
            }
        }
    }
    plan
}

/// Whether `found` is the attachment `moving` is (the same pod and interface, or the same IPAMClaim), whichever
/// sandbox of it holds the entry now.
fn same_attachment(found: &IpAllocation, moving: &IpAllocation) -> bool {
    match (&found.ipamclaim, &moving.ipamclaim) {
        (Some(a), Some(b)) => a == b,
        _ => found.podref == moving.podref && found.ifname == moving.ifname,
    }
}

/// Makes one move: the copy, then the old entry's removal; a copy whose old entry went meanwhile is taken back.
async fn apply_one(store: &impl PoolStore, m: &Move) -> Result<bool, IpamError> {
    let budget = Budget::new(MOVE_BUDGET);
    let free = AsRead::default();
    let copied = budget
        .retry(StoreError::is_transient, || store.add_allocation(&m.to, m.to_offset, &m.entry, &free))
        .await
        .map_err(|e| IpamError::from_retry(&format!("pool {}: copy allocation {}", m.to, m.to_offset), e))?;
    let mine = match copied {
        Patched::Applied => true,
        Patched::Missing => return Ok(false),
        Patched::Refused(_) => {
            // taken: our own copy whose answer was lost, the attachment's newer sandbox, or another attachment
            let read = crate::claim::read_pool(store, &m.to, &budget).await?;
            let found = read.as_ref().and_then(|p| p.spec.allocations.get(&m.to_offset.to_string()));
            match found {
                Some(found) if same_attachment(found, &m.entry) => found.id == m.entry.id,
                Some(found) => {
                    tracing::error!(pool = %m.to, ip = %m.ip, holder = %found.podref, moving = %m.entry.podref,
                        "the replacing pool holds this address for another attachment; not moved");
                    return Ok(false);
                }
                None => return Ok(false),
            }
        }
    };
    // the removal leaves a trace in the same patch: after a lost answer, the trace tells this removal from the
    // pod's DEL
    let patch = guard::move_out(m.from_offset, &m.entry, m.annotated);
    let removal = budget.retry(StoreError::is_transient, || store.apply_pool_patch(&m.from, "move out", &patch)).await;
    let went_meanwhile = match removal {
        Ok((Patched::Applied, _)) => false,
        Ok((Patched::Missing, _)) => true,
        Ok((Patched::Refused(_), _)) | Err(_) => {
            let read = crate::claim::read_pool(store, &m.from, &budget).await?;
            let moved_by_us = read.as_ref().is_some_and(|p| {
                let trace =
                    p.metadata.annotations.as_ref().and_then(|a| a.get(&guard::moved_annotation(m.from_offset)));
                trace == Some(&m.entry.id) && !p.spec.allocations.contains_key(&m.from_offset.to_string())
            });
            if moved_by_us {
                false
            } else if read.is_some_and(|p| guard::still_holds(&p, m.from_offset, &m.entry)) {
                // still there (the removal failed, or was refused for another reason): the next pass again
                return Ok(false);
            } else {
                true
            }
        }
    };
    if !went_meanwhile {
        tracing::info!(from = %m.from, to = %m.to, ip = %m.ip, podref = %m.entry.podref,
            "entry moved to the pool that replaced its own");
        return Ok(true);
    }
    // the old entry went meanwhile: its pod's DEL, which the copy must not outlive
    if mine {
        crate::claim::remove_entry(store, &m.to, m.to_offset, &m.entry, None, &budget).await?;
        tracing::info!(pool = %m.to, ip = %m.ip, podref = %m.entry.podref, "entry released meanwhile: copy taken back");
    }
    Ok(false)
}

/// Moves what `pools` (as listed) call for at `now` ([`plan`]).
pub async fn move_replaced(
    store: &impl PoolStore,
    pools: &[IpPool],
    now: k8s_openapi::jiff::Timestamp,
    settle: Duration,
) -> Moved {
    let plan = plan(pools, now, settle);
    for (pool, ip, podref) in &plan.stranded {
        tracing::warn!(%pool, %ip, %podref,
            "no pool that replaced this one holds the address (a shrunk range; a slice no node holds yet): it stays");
    }
    let mut done = Moved::default();
    for m in &plan.moves {
        match apply_one(store, m).await {
            Ok(true) => done.moved += 1,
            Ok(false) => done.skipped += 1,
            Err(e) => {
                done.skipped += 1;
                tracing::warn!(from = %m.from, to = %m.to, ip = %m.ip, error = %e, "entry not moved this pass");
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    use super::*;
    use crate::store::memory::{Fault, FaultPlan, Op};
    use crate::store::{MemoryStore, NewPool};

    const OLD: &str = "198.18.80.0-29";
    const NEW: &str = "198.18.80.0-28";

    fn entry(pod: &str) -> IpAllocation {
        IpAllocation {
            id: format!("c-{pod}"),
            podref: format!("ns/{pod}"),
            ifname: "net1".into(),
            ..Default::default()
        }
    }

    /// The old /29 holding `old` (offset, pod), the /28 that replaced it, made `age` ago, holding `new`.
    fn fleet(old: &[(u128, &str)], new: &[(u128, &str)], age: SignedDuration) -> (MemoryStore, Timestamp) {
        let store = MemoryStore::new("ns");
        let named = [OLD.to_string()];
        let now = Timestamp::now();
        let mut grown = NewPool { overlaps: &named, ..NewPool::new(NEW, "198.18.80.0/28", 14) }.object();
        grown.metadata.creation_timestamp = Some(Time(now - age));
        for (offset, pod) in new {
            grown.spec.allocations.insert(offset.to_string(), entry(pod));
        }
        store.put_pool(grown);
        let mut replaced = NewPool::new(OLD, "198.18.80.0/29", 6).object();
        for (offset, pod) in old {
            replaced.spec.allocations.insert(offset.to_string(), entry(pod));
        }
        store.put_pool(replaced);
        (store, now)
    }

    /// Every pool's entries, as (pool, offset, pod).
    fn held(store: &MemoryStore) -> Vec<(String, String, String)> {
        let mut all = Vec::new();
        for p in store.pools() {
            for (k, e) in p.spec.allocations {
                all.push((p.metadata.name.clone().unwrap(), k, e.podref));
            }
        }
        all.sort();
        all
    }

    fn row(pool: &str, offset: u128, pod: &str) -> (String, String, String) {
        (pool.to_string(), offset.to_string(), format!("ns/{pod}"))
    }

    fn pool_of(store: &MemoryStore, name: &str) -> IpPool {
        store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some(name)).unwrap()
    }

    /// The pools as the mover lists them, then the pods' DELs of the old pool's entries at `offsets` after that.
    fn released_after_listing(store: &MemoryStore, offsets: &[&str]) -> Vec<IpPool> {
        let listed = store.pools();
        let mut old = pool_of(store, OLD);
        old.spec.allocations.retain(|k, _| !offsets.contains(&k.as_str()));
        store.put_pool(old);
        listed
    }

    #[tokio::test]
    async fn the_replaced_pools_entries_move_at_their_addresses_once_no_old_add_can_run() {
        let (store, now) = fleet(&[(1, "a"), (2, "b"), (6, "c")], &[(3, "d")], SignedDuration::from_mins(1));
        assert!(
            plan(&store.pools(), now, crate::SETTLE_TIME).moves.is_empty(),
            "a minute old: an ADD under the old config may run"
        );
        assert_eq!(plan(&store.pools(), now, crate::SETTLE_TIME).unsettled, [NEW]);

        let (store, now) = fleet(&[(1, "a"), (2, "b"), (6, "c")], &[(3, "d")], SignedDuration::from_mins(10));
        assert_eq!(
            move_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await,
            Moved { moved: 3, skipped: 0 }
        );
        assert_eq!(held(&store), [row(NEW, 1, "a"), row(NEW, 2, "b"), row(NEW, 3, "d"), row(NEW, 6, "c")]);
        assert_eq!(
            super::super::retire::retire_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await.unwrap(),
            1
        );
        assert_eq!(store.pools().len(), 1, "the emptied pool retired");
    }

    #[tokio::test]
    async fn a_shrunk_range_moves_what_fits_and_leaves_the_rest_until_its_pod_goes() {
        let store = MemoryStore::new("ns");
        let now = Timestamp::now();
        let named = ["198.18.81.0-28".to_string()];
        let mut small = NewPool { overlaps: &named, ..NewPool::new("198.18.81.0-29", "198.18.81.0/29", 6) }.object();
        small.metadata.creation_timestamp = Some(Time(now - SignedDuration::from_mins(10)));
        store.put_pool(small);
        let mut big = NewPool::new(&named[0], "198.18.81.0/28", 14).object();
        for (offset, pod) in [(1, "a"), (7, "broadcast-of-the-29"), (12, "outside")] {
            big.spec.allocations.insert(offset.to_string(), entry(pod));
        }
        store.put_pool(big);
        let planned = plan(&store.pools(), now, crate::SETTLE_TIME);
        assert_eq!(planned.moves.len(), 1);
        let stranded: Vec<&str> = planned.stranded.iter().map(|(_, _, p)| p.as_str()).collect();
        assert_eq!(stranded, ["ns/outside", "ns/broadcast-of-the-29"], "in the pool's key order");
        move_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await;
        assert_eq!(
            held(&store),
            [
                row("198.18.81.0-28", 12, "outside"),
                row("198.18.81.0-28", 7, "broadcast-of-the-29"),
                row("198.18.81.0-29", 1, "a")
            ]
        );
    }

    #[tokio::test]
    async fn a_slices_first_address_is_a_host_of_the_range_it_cuts() {
        let store = MemoryStore::new("ns");
        let now = Timestamp::now();
        let named = ["198.18.84.0-28".to_string()];
        let mut slice = NewPool { overlaps: &named, ..NewPool::new("n2-198.18.84.8-29", "198.18.84.8/29", 8) }.object();
        slice.metadata.creation_timestamp = Some(Time(now - SignedDuration::from_mins(10)));
        store.put_pool(slice);
        let mut whole = NewPool::new(&named[0], "198.18.84.0/28", 14).object();
        whole.spec.allocations.insert("8".into(), entry("at-the-slices-first"));
        store.put_pool(whole);
        assert_eq!(move_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await.moved, 1);
        assert_eq!(held(&store), [row("n2-198.18.84.8-29", 0, "at-the-slices-first")]);
    }

    #[tokio::test]
    async fn lost_answers_and_a_mover_killed_half_way_leave_each_entry_once_in_the_new_pool() {
        let (store, now) = fleet(&[(1, "a"), (2, "b")], &[], SignedDuration::from_mins(10));
        // the copy's answer lost, and the move-out's (a pool patch, injected as the writes of entries are)
        let lossy = FaultPlan::quiet(1).at(Op::AddAllocation, 1, Fault::LostResponse).at(
            Op::AddAllocation,
            2,
            Fault::LostResponse,
        );
        let moved = move_replaced(&store.handle("lossy", lossy), &store.pools(), now, crate::SETTLE_TIME).await;
        assert_eq!(moved.moved, 2, "{moved:?}");
        assert_eq!(held(&store), [row(NEW, 1, "a"), row(NEW, 2, "b")]);

        // killed after its copy was applied, before the old entry went: the next pass finishes it
        let (store, now) = fleet(&[(1, "a")], &[], SignedDuration::from_mins(10));
        let dies = FaultPlan::quiet(1).at(Op::AddAllocation, 2, Fault::Die);
        let killed = store.handle("dies", dies);
        let listed = store.pools();
        let cut = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            move_replaced(&killed, &listed, now, crate::SETTLE_TIME),
        );
        assert!(cut.await.is_err(), "the mover died");
        let left = held(&store);
        assert!(left.contains(&row(NEW, 1, "a")), "copied: {left:?}");
        // whether the removal it died in was applied or not, the next pass leaves the entry once, in the new pool
        move_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await;
        assert_eq!(held(&store), [row(NEW, 1, "a")]);
    }

    #[tokio::test]
    async fn a_copy_whose_entry_was_released_meanwhile_is_taken_back() {
        let (store, now) = fleet(&[(1, "a")], &[], SignedDuration::from_mins(10));
        let listed = released_after_listing(&store, &["1"]);
        assert_eq!(move_replaced(&store, &listed, now, crate::SETTLE_TIME).await, Moved { moved: 0, skipped: 1 });
        assert_eq!(held(&store), [], "no entry outlives its pod");
    }

    /// A pod's two interfaces on the network hold two entries with one container ID. The trace a move leaves names
    /// its offset: the second interface's entry, released meanwhile, is not read as moved by the first one's trace,
    /// and its copy is taken back.
    #[tokio::test]
    async fn a_trace_names_its_offset_so_a_second_interfaces_release_is_seen() {
        let (store, now) = fleet(&[], &[], SignedDuration::from_mins(10));
        let mut old = pool_of(&store, OLD);
        for (offset, ifname) in [(1, "net1"), (2, "net2")] {
            old.spec.allocations.insert(offset.to_string(), IpAllocation { ifname: ifname.into(), ..entry("a") });
        }
        store.put_pool(old);
        let listed = released_after_listing(&store, &["2"]);
        assert_eq!(move_replaced(&store, &listed, now, crate::SETTLE_TIME).await, Moved { moved: 1, skipped: 1 });
        assert_eq!(held(&store), [row(NEW, 1, "a")], "net2's entry released: no copy of it outlives it");
    }

    /// The same, with the copy's answer lost: the copy found on reading back is the mover's own, so it too is taken back.
    #[tokio::test]
    async fn a_copy_whose_answer_was_lost_and_whose_entry_was_released_meanwhile_is_taken_back() {
        let (store, now) = fleet(&[(1, "a")], &[], SignedDuration::from_mins(10));
        let listed = released_after_listing(&store, &["1"]);
        let lossy = store.handle("lossy", FaultPlan::quiet(1).at(Op::AddAllocation, 1, Fault::LostResponse));
        assert_eq!(move_replaced(&lossy, &listed, now, crate::SETTLE_TIME).await, Moved { moved: 0, skipped: 1 });
        assert_eq!(held(&store), [], "no entry outlives its pod");
    }

    #[tokio::test]
    async fn an_offset_another_attachment_holds_is_never_written() {
        let (store, now) = fleet(&[(1, "a")], &[(1, "intruder")], SignedDuration::from_mins(10));
        assert_eq!(
            move_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await,
            Moved { moved: 0, skipped: 1 }
        );
        assert_eq!(held(&store), [row(NEW, 1, "intruder"), row(OLD, 1, "a")], "both left as they were, for a person");
    }

    /// A copy an admission policy refuses fails the move, which is counted skipped; the next pass tries again.
    #[tokio::test]
    async fn a_refused_copy_is_counted_skipped_and_leaves_the_entry() {
        let (store, now) = fleet(&[(1, "a"), (2, "b")], &[], SignedDuration::from_mins(10));
        let refused = store.handle("refused", FaultPlan::quiet(1).at(Op::AddAllocation, 1, Fault::Refused));
        assert_eq!(
            move_replaced(&refused, &store.pools(), now, crate::SETTLE_TIME).await,
            Moved { moved: 1, skipped: 1 }
        );
        assert_eq!(held(&store), [row(NEW, 2, "b"), row(OLD, 1, "a")]);
    }

    /// Two NetworkAttachmentDefinitions of one network name share its pools; a grown range of one of them replaces
    /// the old pool for that config's entries only.
    #[test]
    fn an_entry_another_config_recorded_stays_for_that_config() {
        let now = Timestamp::now();
        let named = [OLD.to_string()];
        let mut grown =
            NewPool { overlaps: &named, config_name: "ns/grown", ..NewPool::new(NEW, "198.18.80.0/28", 14) }.object();
        grown.metadata.creation_timestamp = Some(Time(now - SignedDuration::from_mins(10)));
        let mut old = NewPool::new(OLD, "198.18.80.0/29", 6).object();
        for (offset, pod, config) in [(1, "mine", "ns/grown"), (2, "theirs", "ns/other"), (3, "unrecorded", "")] {
            let recorded = Some(config.to_string()).filter(|c| !c.is_empty());
            old.spec.allocations.insert(offset.to_string(), IpAllocation { network: recorded, ..entry(pod) });
        }
        let planned = plan(&[grown, old], now, crate::SETTLE_TIME);
        let moved: Vec<&str> = planned.moves.iter().map(|m| m.entry.podref.as_str()).collect();
        assert_eq!(moved, ["ns/mine", "ns/unrecorded"]);
        let stranded: Vec<&str> = planned.stranded.iter().map(|(_, _, p)| p.as_str()).collect();
        assert_eq!(stranded, ["ns/theirs"]);
    }

    /// A persistent address's claim moved to a new pod whose ADD, under the new config, already took the address in
    /// the replacing pool: the old pool's entry is the same attachment's earlier sandbox, and goes.
    #[tokio::test]
    async fn an_ipamclaims_newer_pod_holding_the_copy_is_the_same_attachment() {
        let (store, now) = fleet(&[], &[], SignedDuration::from_mins(10));
        let of_claim = |pod: &str| IpAllocation { ipamclaim: Some("vm-disk".into()), ..entry(pod) };
        for (name, pod) in [(OLD, "vm-before"), (NEW, "vm-after")] {
            let mut pool = pool_of(&store, name);
            pool.spec.allocations.insert("1".into(), of_claim(pod));
            store.put_pool(pool);
        }
        assert_eq!(
            move_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await,
            Moved { moved: 1, skipped: 0 }
        );
        assert_eq!(held(&store), [row(NEW, 1, "vm-after")], "the claim's address once, with its newer pod");
    }
}
