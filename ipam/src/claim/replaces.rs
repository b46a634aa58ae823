//! What a new pool replaces. When a config's layout changes (a range grown, shrunk or moved; one pool given up for
//! node slices; slices of another size), the new layout's pool names the overlapping pools of the old one
//! ([`crate::store::OVERLAPS_ANNOTATION`]): its claims keep off what they hold, its first claim marks them replaced, and the
//! leader moves their entries over ([`crate::reconcile::relayout`]).
//!
//! A pool that named the pools it found when it listed them before its create would miss one made at the same time
//! (the old config's first ADD and the new config's, each listing before the other's create lands), and neither
//! pool's claims would read the other's entries or mark: one address handed out twice (found by the simulation's
//! range-grown cases). So a pool of a layout that can change is born pending ([`crate::store::PENDING_ANNOTATION`]),
//! naming nothing, and no address is claimed in it until [`settle`] has listed the pools after its create and
//! decided, of each overlapping pool of its config that it does not name yet:
//! - one that names it replaces it: nothing to name;
//! - one that is settled: this pool names it (a settled pool's decision is final, and it may hand out addresses
//!   already);
//! - one still pending with a lower name: this pool names it;
//! - one still pending with a higher name: that one is settled first (so it names this one), then this one again.
//!
//! Each decision is written with a test of the pool's version as listed, so a decision made on a list that changed
//! since is refused and made again on a new list. Of two overlapping pools, whichever settles last saw the other
//! (it listed after the other's create, or the other listed after its own), and the rule has it named one way only:
//! never neither (the duplicate), never both (each would refuse the other's claims).

use crate::budget::Budget;
use crate::crd::IpPool;
use crate::error::IpamError;
use crate::names;
use crate::range::IpRange;
use crate::store::{Patched, PoolStore, StoreError, config_of, guard, keeps_off_of, overlaps_of, replaces_pending};

async fn list<S: PoolStore>(store: &S, name: &str, budget: &Budget) -> Result<Vec<IpPool>, IpamError> {
    budget
        .retry(StoreError::is_transient, || store.list_pools())
        .await
        .map_err(|e| IpamError::from_retry(&format!("pool {name}: list the pools it may replace"), e))
}

/// Among `listed`, the pools that a pool `name` of `range`, made by the config `config` of the network `network`,
/// replaces: those of [`overlapping`] (its network name's) that are the config's own — made by an ADD of the same
/// netconf `name` ([`crate::store::CONFIG_ANNOTATION`]), or, made before that was recorded, holding entries all of
/// that network — but, for a slice's pool (`slice`), pools of the very same CIDR (another node's pool of the same
/// slice: a slice that changed hands is not a layout that changed). Another config that shares the network name
/// (overlapping ranges of two networks, kept apart by their reservations) is not a layout this one replaces: its
/// pools are neither moved from nor retired.
///
/// The second list: the overlapping pools of the network that no hereabouts config made (no config recorded, no entry
/// with a network: Whereabouts wrote them), which the pool keeps off ([`crate::store::KEEPS_OFF_ANNOTATION`])
/// without taking them as its own layout.
fn among(
    listed: &[IpPool],
    name: &str,
    range: &IpRange,
    config: &str,
    network: &str,
    slice: bool,
) -> (Vec<String>, Vec<String>) {
    let same = names::range_string(range.cidr());
    let ours = |pool: &IpPool| match config_of(pool) {
        Some(made_by) => made_by == config,
        None => {
            let entries = &pool.spec.allocations;
            !entries.is_empty() && entries.values().all(|e| e.network.as_deref() == Some(config))
        }
    };
    let unmade =
        |pool: &IpPool| config_of(pool).is_none() && pool.spec.allocations.values().all(|e| e.network.is_none());
    let (mut replaced, mut kept_off) = (Vec::new(), Vec::new());
    for other in overlapping(listed, name, range, network) {
        let Some(pool) = listed.iter().find(|p| p.metadata.name.as_deref() == Some(other.as_str())) else { continue };
        if slice && pool.spec.range == same {
            continue;
        }
        if ours(pool) {
            replaced.push(other);
        } else if unmade(pool) && !pool.spec.allocations.is_empty() {
            kept_off.push(other);
        }
    }
    (replaced, kept_off)
}

/// The pools of `listed` that a new pool `name` of `range` for the network `network_name` replaces: those of the same
/// network (as [`super::pool_scope`] reads a pool's network) whose ranges overlap `range`, but for node-warm
/// pools (IaaS provider mode: never one range's).
fn overlapping(listed: &[IpPool], name: &str, range: &IpRange, network_name: &str) -> Vec<String> {
    let mine = range.cidr();
    let mut found: Vec<String> = listed
        .iter()
        .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n != name) && p.spec.node_name.is_none())
        .filter_map(|p| {
            let (theirs, network) = super::pool_scope(p)?;
            let theirs = theirs.cidr();
            (network == network_name && crate::cut::overlap(mine, theirs)).then(|| p.metadata.name.clone()).flatten()
        })
        .collect();
    found.sort();
    found
}

/// What settling a pending pool takes, given the pools as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// Write it settled, naming these (what it named before, and what the list adds).
    Name { overlaps: Vec<String>, keeps_off: Vec<String> },
    /// This pending pool, of a higher name, is to be settled first: it is to name this one.
    First(String),
}

/// The step that settles the pending `pool`, by the rule of this module's head, on `listed`.
fn step(listed: &[IpPool], pool: &IpPool) -> Step {
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let (mut overlaps, mut keeps_off) = (overlaps_of(pool), keeps_off_of(pool));
    let Some((range, network)) = super::pool_scope(pool) else { return Step::Name { overlaps, keeps_off } };
    let slice = name != names::pool_name(&network, range.cidr());
    let (replaced, kept_off) = among(listed, name, &range, config_of(pool).unwrap_or_default(), &network, slice);
    for other in replaced {
        if overlaps.contains(&other) {
            continue;
        }
        let Some(theirs) = listed.iter().find(|p| p.metadata.name.as_deref() == Some(other.as_str())) else { continue };
        if overlaps_of(theirs).iter().any(|n| n == name) {
            continue;
        }
        if replaces_pending(theirs) && other.as_str() > name {
            return Step::First(other);
        }
        overlaps.push(other);
    }
    for other in kept_off {
        if !keeps_off.contains(&other) {
            keeps_off.push(other);
        }
    }
    Step::Name { overlaps, keeps_off }
}

/// `pool` as read, settled: what it replaces decided ([`crate::store::PENDING_ANNOTATION`] gone), by this call or another's.
/// `None`: the pool is gone (its caller reads or makes it again). A settled pool is returned as it is, without a
/// request.
pub(crate) async fn settle<S: PoolStore>(
    store: &S,
    pool: IpPool,
    budget: &Budget,
) -> Result<Option<IpPool>, IpamError> {
    if !replaces_pending(&pool) {
        return Ok(Some(pool));
    }
    let name = pool.metadata.name.clone().unwrap_or_default();
    // the last refusal: the pool it was sent to, at the version tested, and what the server said
    let mut refused: Option<(String, String, String)> = None;
    // no pause between rounds: a round is taken again only when the pools changed between its list and its patch,
    // and each pool settles once and is marked once, so the rounds are few however many ADDs settle at once (and a
    // loser reads the pool settled at once, as a claim that lost its offset reads the pool again)
    'listing: loop {
        if budget.expired() {
            return Err(IpamError::Expired(format!("pool {name}: decide which pools it replaces")));
        }
        let listed = list(store, &name, budget).await?;
        let find = |n: &str| listed.iter().find(|p| p.metadata.name.as_deref() == Some(n));
        // refused while the pool stayed as tested and pending: not our test but a policy or a schema, which
        // refuses again
        if let Some((at, version, message)) = refused.take()
            && find(&at).is_some_and(|p| replaces_pending(p) && p.metadata.resource_version.as_ref() == Some(&version))
        {
            return Err(IpamError::Refused { what: format!("pool {at}: settle what it replaces"), message });
        }
        let Some(mine) = find(&name) else { return Ok(None) };
        if !replaces_pending(mine) {
            return Ok(Some(mine.clone()));
        }
        // each pool settled first has a higher name than the last: the walk ends
        let mut target = mine;
        let (overlaps, keeps_off) = loop {
            match step(&listed, target) {
                Step::Name { overlaps, keeps_off } => break (overlaps, keeps_off),
                Step::First(higher) => match find(&higher) {
                    Some(first) => target = first,
                    None => continue 'listing,
                },
            }
        };
        let target_name = target.metadata.name.clone().unwrap_or_default();
        let version = target.metadata.resource_version.clone().unwrap_or_default();
        let patch = guard::settle(&version, &overlaps, &keeps_off);
        let written = budget
            .retry(StoreError::is_transient, || store.apply_pool_patch(&target_name, "settle what it replaces", &patch))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {target_name}: settle what it replaces"), e))?;
        match written {
            (Patched::Applied, Some(after)) if target_name == name => {
                tracing::info!(pool = %name, replaces = ?overlaps, keeps_off = ?keeps_off, "settled what it replaces");
                return Ok(Some(after));
            }
            (Patched::Applied, _) => {
                tracing::info!(pool = %target_name, replaces = ?overlaps, before = %name, "settled what it replaces");
            }
            // changed since the list (another settled it, marked it, or named itself in it), or refused for
            // another reason: the next list tells
            (Patched::Refused(message), _) => {
                tracing::debug!(pool = %target_name, %message, "settle refused; listing again");
                refused = Some((target_name, version, message));
            }
            (Patched::Missing, _) => tracing::debug!(pool = %target_name, "gone before it settled; listing again"),
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewPool;

    #[test]
    fn a_new_pool_replaces_the_overlapping_pools_of_its_own_network_only() {
        let pool = |name: &str, range: &str, network: &str, node: Option<&str>| {
            NewPool { network_name: network, node_name: node, ..NewPool::new(name, range, 0) }.object()
        };
        let listed = [
            pool("198.18.61.0-30", "198.18.61.0/30", "", None),
            pool("198.18.61.4-30", "198.18.61.4/30", "", None),
            pool("198.18.62.0-30", "198.18.62.0/30", "", None),
            pool("blue-198.18.61.0-30", "198.18.61.0/30", "blue", None),
            pool("198.18.61.0-29", "198.18.61.0/29", "", None),
            pool("warm-198.18.61.0-28", "198.18.61.0/28", "", Some("node-a")),
            pool("198.18.0.0-16", "198.18.0.0/16", "", None),
        ];
        let range = IpRange::parse("198.18.61.0/29", None, None, &[]).unwrap();
        assert_eq!(
            overlapping(&listed, "198.18.61.0-29", &range, ""),
            ["198.18.0.0-16", "198.18.61.0-30", "198.18.61.4-30"],
            "its own network's pools inside it and around it; not itself, another network's, a disjoint one or a \
             node-warm pool"
        );
        assert_eq!(overlapping(&listed, "blue-198.18.61.0-29", &range, "blue"), ["blue-198.18.61.0-30"]);
    }

    /// Found by the agents' simulation: two networks sharing the network name with overlapping ranges (one pool and
    /// slices, kept apart by their reservations) are not one layout replacing another: a new pool names only its
    /// own config's pools, so the leader never moves another network's entries into it, nor retires its pools.
    #[test]
    fn a_new_pool_replaces_only_its_own_configs_pools() {
        use crate::crd::IpAllocation;
        let store = crate::store::MemoryStore::new("ns");
        let entry = |network: Option<&str>| IpAllocation {
            id: "c".into(),
            podref: "ns/p".into(),
            network: network.map(str::to_string),
            ..Default::default()
        };
        let made_by = |name: &str, range: &str, config: &str, entries: &[Option<&str>]| {
            let mut pool = NewPool { config_name: config, ..NewPool::new(name, range, 0) }.object();
            for (i, network) in entries.iter().enumerate() {
                pool.spec.allocations.insert((i + 1).to_string(), entry(*network));
            }
            store.put_pool(pool);
        };
        made_by("198.18.90.0-30", "198.18.90.0/30", "net", &[]);
        made_by("198.18.90.4-30", "198.18.90.4/30", "other", &[Some("other")]);
        made_by("198.18.90.8-30", "198.18.90.8/30", "", &[Some("net"), Some("net")]);
        made_by("198.18.90.12-30", "198.18.90.12/30", "", &[Some("net"), None]);
        made_by("198.18.90.16-30", "198.18.90.16/30", "", &[]);
        made_by("198.18.90.20-30", "198.18.90.20/30", "", &[None, None]);
        let cfg = crate::config::load_with_paths(
            &crate::config::Input {
                stdin: br#"{"cniVersion":"1.0.0","name":"net","ipam":{"type":"hereabouts","range":"198.18.90.0/27"}}"#,
                cni_args: "",
            },
            &[],
        )
        .unwrap();
        let range = IpRange::parse("198.18.90.0/27", None, None, &[]).unwrap();
        let (replaced, kept_off) = among(&store.pools(), "198.18.90.0-27", &range, &cfg.name, &cfg.network_name, false);
        assert_eq!(
            replaced,
            ["198.18.90.0-30", "198.18.90.8-30"],
            "made by this config, or holding entries of it only; not another config's, a mixed or an empty unknown one"
        );
        assert_eq!(kept_off, ["198.18.90.20-30"], "kept off: entries no hereabouts config recorded (Whereabouts')");
    }

    const NET: &str = "net";

    fn name(range: &str) -> String {
        names::pool_name(NET, range.parse().unwrap())
    }

    /// The pool `net` makes for `range`, naming the pools of `overlaps` (ranges), born pending or not.
    fn made(range: &str, pending: bool, overlaps: &[&str]) -> IpPool {
        let named: Vec<String> = overlaps.iter().map(|r| name(r)).collect();
        let n = name(range);
        NewPool { network_name: NET, config_name: NET, pending, overlaps: &named, ..NewPool::new(&n, range, 0) }
            .object()
    }

    fn budget() -> Budget {
        Budget::new(std::time::Duration::from_secs(30))
    }

    fn read(store: &crate::store::MemoryStore, range: &str) -> IpPool {
        store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some(name(range).as_str())).unwrap()
    }

    /// Who names whom among `ranges`, as stored: every overlapping pair one way exactly, and nothing left pending.
    fn assert_one_way(store: &crate::store::MemoryStore, ranges: &[&str]) {
        let pools: Vec<IpPool> = ranges.iter().map(|r| read(store, r)).collect();
        for (i, a) in pools.iter().enumerate() {
            assert!(!replaces_pending(a), "{:?} still pending", a.metadata.name);
            for b in &pools[i + 1..] {
                let (na, nb) = (a.metadata.name.clone().unwrap(), b.metadata.name.clone().unwrap());
                let overlap = crate::cut::overlap(a.spec.range.parse().unwrap(), b.spec.range.parse().unwrap());
                let (ab, ba) = (overlaps_of(a).contains(&nb), overlaps_of(b).contains(&na));
                if overlap {
                    assert!(
                        ab ^ ba,
                        "{na} and {nb} overlap: exactly one names the other (a names b {ab}, b names a {ba})"
                    );
                } else {
                    assert!(!ab && !ba, "{na} and {nb} do not overlap");
                }
            }
        }
    }

    /// The rule, on lists: a pool that names this one is left alone, a settled pool or a pending one of a lower name
    /// is named, a pending one of a higher name goes first; a pool of another config or network is no concern.
    #[test]
    fn a_pending_pool_names_what_the_rule_says() {
        let (wide, low, high) = ("198.18.63.0/28", "198.18.63.0/29", "198.18.63.8/29");
        assert!(name(wide) < name(low) && name(low) < name(high), "names in the order the cases assume");
        let other_config = {
            let n = names::pool_name(NET, "198.18.63.0/30".parse().unwrap());
            NewPool { network_name: NET, config_name: "other", ..NewPool::new(&n, "198.18.63.0/30", 0) }.object()
        };
        let cases = [
            // (listed, settling, expected)
            (vec![made(wide, true, &[]), made(low, true, &[])], wide, Step::First(name(low))),
            (
                vec![made(wide, true, &[]), made(low, true, &[])],
                low,
                Step::Name { overlaps: vec![name(wide)], keeps_off: vec![] },
            ),
            (
                vec![made(wide, true, &[]), made(low, false, &[])],
                wide,
                Step::Name { overlaps: vec![name(low)], keeps_off: vec![] },
            ),
            (
                vec![made(wide, true, &[]), made(low, false, &[wide])],
                wide,
                Step::Name { overlaps: vec![], keeps_off: vec![] },
            ),
            (
                vec![made(wide, true, &[low]), made(low, true, &[])],
                wide,
                Step::Name { overlaps: vec![name(low)], keeps_off: vec![] },
            ),
            (vec![made(wide, true, &[]), made(low, true, &[]), made(high, false, &[])], wide, Step::First(name(low))),
            (
                vec![made(wide, true, &[]), made(low, false, &[]), made(high, false, &[]), other_config.clone()],
                wide,
                Step::Name { overlaps: vec![name(low), name(high)], keeps_off: vec![] },
            ),
        ];
        for (i, (listed, settling, expected)) in cases.into_iter().enumerate() {
            let pool = listed.iter().find(|p| p.metadata.name.as_deref() == Some(name(settling).as_str())).unwrap();
            assert_eq!(step(&listed, pool), expected, "case {i}");
        }
    }

    /// What a pending pool keeps off is what it kept off at its create and what the list adds (Whereabouts' pools
    /// with entries), each once; a node's pool of a slice is no layout of another node's pool of the same slice.
    #[test]
    fn a_pending_pool_keeps_off_each_unmade_pool_once_and_passes_over_the_same_slice() {
        let unmade = |range: &str| {
            let mut pool = NewPool::new(&name(range), range, 0).object();
            pool.metadata.annotations = None;
            pool.spec.allocations.insert("1".into(), crate::crd::IpAllocation { id: "c".into(), ..Default::default() });
            pool
        };
        let (wide, a, b) = ("198.18.66.0/28", "198.18.66.0/30", "198.18.66.4/30");
        let mut pending = made(wide, true, &[]);
        let annotations = pending.metadata.annotations.as_mut().unwrap();
        annotations.insert(crate::store::KEEPS_OFF_ANNOTATION.into(), name(a));
        let listed = [pending.clone(), unmade(a), unmade(b)];
        assert_eq!(step(&listed, &pending), Step::Name { overlaps: vec![], keeps_off: vec![name(a), name(b)] });

        let slice = "198.18.66.16/29";
        let of_node = |node: &str, pending: bool| {
            let n = names::pool_name(&format!("{NET}-{node}"), slice.parse().unwrap());
            NewPool { network_name: NET, config_name: NET, pending, ..NewPool::new(&n, slice, 0) }.object()
        };
        let (mine, theirs) = (of_node("node-a", true), of_node("node-b", false));
        let whole = made("198.18.66.16/28", false, &[]);
        let listed = [mine.clone(), theirs, whole];
        assert_eq!(
            step(&listed, &mine),
            Step::Name { overlaps: vec![name("198.18.66.16/28")], keeps_off: vec![] },
            "the range's pool is a layout it replaces; node-b's pool of the same slice is not"
        );
        // one pool given back for slices as large as the range: the range's pool replaces the slice's pool
        let whole = made(slice, true, &[]);
        let of_b = of_node("node-b", false);
        let listed = [whole.clone(), of_b.clone()];
        assert_eq!(
            step(&listed, &whole),
            Step::Name { overlaps: vec![of_b.metadata.name.unwrap()], keeps_off: vec![] }
        );
    }

    /// A pool alone settles with one list and one patch, and what the patch answers is what it returns: a second
    /// list or patch is refused here.
    #[tokio::test]
    async fn a_pool_alone_settles_with_one_list_and_one_patch() {
        use crate::store::memory::{Fault, FaultPlan, Op};
        let store = crate::store::MemoryStore::new("ns");
        store.put_pool(made("198.18.68.0/28", true, &[]));
        let plan = FaultPlan::quiet(1).at(Op::ListPools, 2, Fault::Refused).at(Op::AddAllocation, 2, Fault::Refused);
        let once = store.handle("once", plan);
        let settled = settle(&once, read(&store, "198.18.68.0/28"), &budget()).await.unwrap().unwrap();
        assert!(!replaces_pending(&settled) && overlaps_of(&settled).is_empty());
    }

    /// A pending pool marked replaced (by the first claim of a pool that names it) between its list and its
    /// settle: the settle, sent before the mark and landing after it, is refused by its version test, and the next
    /// list shows why (the pool changed), so it settles again rather than failing as refused by a policy.
    #[tokio::test(start_paused = true)]
    async fn a_settle_refused_because_the_pool_changed_is_made_again() {
        use crate::store::memory::{Fault, FaultPlan, Op};
        let (wide, narrow) = ("198.18.67.0/28", "198.18.67.0/29");
        let store = crate::store::MemoryStore::new("ns");
        store.put_pool(made(wide, false, &[narrow]));
        store.put_pool(made(narrow, true, &[]));
        // the settle's patch is the store's first guarded pool patch, and it reaches the server 5 s late
        let late = store.handle("late", FaultPlan::quiet(1).at(Op::AddAllocation, 1, Fault::LateRequest));
        let long = budget();
        let settling = settle(&late, read(&store, narrow), &long);
        let marking = async {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let mark = guard::mark_replaced(true, &crate::clock::now().to_string());
            store.apply_pool_patch(&name(narrow), "mark replaced", &mark).await.unwrap()
        };
        let (settled, (marked, _)) = tokio::join!(settling, marking);
        assert_eq!(marked, Patched::Applied);
        let settled = settled.expect("settled on the next list").unwrap();
        assert!(!replaces_pending(&settled) && crate::store::replaced_at(&settled).is_some());
        assert_one_way(&store, &[wide, narrow]);
    }

    /// Two pools made at once, neither naming the other: settling the lower name settles the higher first (which
    /// names it); settling the higher first names the lower, which then names nothing; a pool settled without
    /// naming a pending one is named by it. Each way, one names the other and no pool is left pending.
    #[tokio::test]
    async fn two_pools_made_at_once_end_named_one_way() {
        let (wide, narrow) = ("198.18.64.0/28", "198.18.64.0/29");
        for (first, second) in [(wide, narrow), (narrow, wide)] {
            let store = crate::store::MemoryStore::new("ns");
            store.put_pool(made(wide, true, &[]));
            store.put_pool(made(narrow, true, &[]));
            let settled = settle(&store, read(&store, first), &budget()).await.unwrap().unwrap();
            assert!(!replaces_pending(&settled));
            assert_one_way(&store, &[first]);
            settle(&store, read(&store, second), &budget()).await.unwrap().unwrap();
            assert_one_way(&store, &[wide, narrow]);
            assert_eq!(overlaps_of(&read(&store, narrow)), [name(wide)], "the higher name names the lower");
        }
        // a settled pool may hand out addresses already: the pending one names it, whatever the names
        let store = crate::store::MemoryStore::new("ns");
        store.put_pool(made(wide, true, &[]));
        store.put_pool(made(narrow, false, &[]));
        settle(&store, read(&store, wide), &budget()).await.unwrap().unwrap();
        assert_eq!(overlaps_of(&read(&store, wide)), [name(narrow)]);
        assert_one_way(&store, &[wide, narrow]);
        // a settled pool is returned as it is, without a request
        let dead = store.handle("dead", crate::store::memory::FaultPlan::quiet(1));
        dead.kill();
        let as_read = read(&store, wide);
        let back = settle(&dead, as_read.clone(), &budget()).await.unwrap().unwrap();
        assert_eq!(back.metadata, as_read.metadata);
    }

    /// Three pools made at once (a /28 and the two /29s in it), settled by three processes at once, each request
    /// slow at random and lost, refused or failed at random: every overlapping pair ends named one way, over 200
    /// seeds. A process that ran out of its budget leaves its pool to the next ADD, which settles it.
    #[tokio::test(start_paused = true)]
    async fn pools_settled_at_once_under_faults_end_named_one_way() {
        use crate::store::memory::{Fault, FaultPlan};
        let ranges = ["198.18.65.0/28", "198.18.65.0/29", "198.18.65.8/29"];
        for seed in 0..200u64 {
            let store = crate::store::MemoryStore::new("ns");
            for range in ranges {
                store.put_pool(made(range, true, &[]));
            }
            let kinds = [Fault::LostResponse, Fault::Conflict, Fault::ServerError, Fault::Timeout, Fault::TooMany];
            let runs = ranges.iter().enumerate().map(|(i, range)| {
                let mut plan = FaultPlan::random(seed * 10 + i as u64, 0.2, &kinds);
                plan.max_latency_ms = 20;
                let handle = store.handle(&format!("p{i}"), plan);
                let pool = read(&store, range);
                async move {
                    let short = Budget::new(std::time::Duration::from_secs(5));
                    let _ = settle(&handle, pool, &short).await;
                }
            });
            futures::future::join_all(runs).await;
            for range in ranges {
                settle(&store, read(&store, range), &budget()).await.unwrap().unwrap();
            }
            assert_one_way(&store, &ranges);
        }
    }
}
