//! The leader as the node-slice controller, over the store: frees the slices of Nodes that are gone once their
//! pools have stayed empty for a grace period, gives a free slice whose pools hold entries back to their node (a
//! NodeSlicePool lost and re-created lists only the creating node's slices), gives a slice to each node it is told to (the nodes of a mixed fleet
//! that run Whereabouts' CNI in fast IPAM, which never claims one), and drops owner references to
//! NetworkAttachmentDefinitions from NodeSlicePools (Whereabouts' controller adds them; one naming a NAD of another
//! namespace, or a NAD deleted while others of the network remain, lets the garbage collector delete the
//! NodeSlicePool under live entries). Which Nodes exist is the caller's to say.
//!
//! While no slice of a NodeSlicePool is free, the slice of a live node whose pools have stayed empty and unchanged
//! for [`IDLE`] is freed too, one per pass: claims ahead give a slice to every node that runs the agent, and with
//! overlap off (no borrowing) busy nodes would otherwise be refused (code 100) while idle ones hold slices they never
//! use. Freed the same way as a gone node's slice, so the node's next ADD claims again, safely.
//!
//! A gone node's slice pool is deleted (only if it is still the empty object that was read) before its slice is
//! freed: a borrower that read the pool earlier then fails its guarded patch, and an ADD of that node that
//! re-creates the pool reads the slice again after writing its entry ([`super::add`]), so no entry can land where
//! the slice's next owner would not see it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::growth;
use super::plan::{self, Slice};
use crate::cooldown;
use crate::crd::NodeSlicePool;
use crate::names;
use crate::store::{Deleted, Patched, PoolStore, SliceStore, StoreError, Version};

/// How many pairs of free slices one pass joins in one NodeSlicePool (each a read and a patch).
const MAX_JOINS: usize = 64;

/// The kind whose owner references are dropped.
const NAD_KIND: &str = "NetworkAttachmentDefinition";

/// What one pass changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    /// Slices given to a node that had none.
    pub assigned: usize,
    /// Slices of gone nodes freed.
    pub freed: usize,
    /// Free slices given back to the node whose pool of them holds entries.
    pub returned: usize,
    /// Pairs of free cut slices joined into one (adaptive slices).
    pub joined: usize,
    /// NodeSlicePools whose NetworkAttachmentDefinition owner references were dropped.
    pub unowned: usize,
    /// Writes left undone because the NodeSlicePool changed since it was read (a node claimed a slice meanwhile)
    /// or the write failed: worth another pass soon rather than at the next interval.
    pub deferred: usize,
}

/// How long a live node's slice pools must stay empty and unchanged before the slice is freed while no slice of
/// its NodeSlicePool is free.
pub const IDLE: Duration = Duration::from_secs(30 * 60);

/// A slice: its NodeSlicePool, its range, its node.
type SliceKey = (String, String, String);

/// A slice's empty pools, each with the version it was read at.
type EmptyPools = Vec<(String, Version)>;

/// The keeper's state: when each gone node's slice was first seen empty, and each live node's slice empty as it is.
#[derive(Debug)]
pub struct Keeper<S> {
    pub store: S,
    /// How long a gone node's slice pool must stay empty before the slice is freed.
    pub grace: Duration,
    /// How long a live node's slice pools must stay empty and unchanged before the slice is freed, while none is
    /// free ([`IDLE`]).
    pub idle: Duration,
    empty_since: HashMap<SliceKey, Instant>,
    idle_since: HashMap<SliceKey, (Instant, Vec<Version>)>,
}

impl<S: PoolStore + SliceStore> Keeper<S> {
    pub fn new(store: S, grace: Duration) -> Self {
        Self { store, grace, idle: IDLE, empty_since: HashMap::new(), idle_since: HashMap::new() }
    }

    /// One pass over every NodeSlicePool of the namespace. `live`: the Nodes that exist; `assign`: those of them
    /// to give a slice of each NodeSlicePool when they own none. A failure on one slice is logged and left to the
    /// next pass.
    pub async fn pass(&mut self, live: &BTreeSet<String>, assign: &BTreeSet<String>) -> Result<Kept, StoreError> {
        let listed = self.store.list_node_slices().await?;
        let mut kept = Kept::default();
        let mut seen = BTreeSet::new();
        for listing in &listed {
            self.unown(listing, &mut kept).await;
            self.keep(listing, live, assign, &mut kept, &mut seen).await;
            self.join(listing, &mut kept).await;
        }
        self.empty_since.retain(|key, _| seen.contains(key));
        self.idle_since.retain(|key, _| seen.contains(key));
        Ok(kept)
    }

    async fn unown(&self, listing: &NodeSlicePool, kept: &mut Kept) {
        let Some(owners) = &listing.metadata.owner_references else { return };
        if !owners.iter().any(|o| o.kind == NAD_KIND) {
            return;
        }
        let name = listing.metadata.name.clone().unwrap_or_default();
        let version = listing.metadata.resource_version.clone().unwrap_or_default();
        let others: Vec<_> = owners.iter().filter(|o| o.kind != NAD_KIND).cloned().collect();
        match self.store.keep_node_slices_owners(&name, &version, &others).await {
            Ok(Patched::Applied) => {
                tracing::warn!(node_slices = %name,
                    "dropped owner references to NetworkAttachmentDefinitions (Whereabouts' node-slice controller \
                     adds them; it must not run beside hereabouts)");
                kept.unowned += 1;
            }
            Ok(other) => {
                tracing::debug!(node_slices = %name, ?other, "changed meanwhile; next pass");
                kept.deferred += 1;
            }
            Err(e) => {
                tracing::warn!(node_slices = %name, error = %e, "dropping owner references failed");
                kept.deferred += 1;
            }
        }
    }

    async fn keep(
        &mut self,
        listing: &NodeSlicePool,
        live: &BTreeSet<String>,
        assign: &BTreeSet<String>,
        kept: &mut Kept,
        seen: &mut BTreeSet<(String, String, String)>,
    ) {
        let name = listing.metadata.name.clone().unwrap_or_default();
        let slices = plan::slices_of(listing);
        let mut freeable: HashMap<usize, Vec<(String, Version)>> = HashMap::new();
        for slice in slices.iter().filter(|s| !s.node.is_empty() && !live.contains(&s.node)) {
            let Some(empty) = self.empty_pools(&name, slice).await else { continue };
            let key = (name.clone(), slice.cidr.to_string(), slice.node.clone());
            seen.insert(key.clone());
            let since = *self.empty_since.entry(key).or_insert_with(Instant::now);
            if since.elapsed() >= self.grace {
                freeable.insert(slice.index, empty);
            }
        }
        if freeable.is_empty()
            && !slices.iter().any(|s| s.node.is_empty())
            && let Some((index, empty)) = self.idlest(&name, &slices, live, assign, seen).await
        {
            freeable.insert(index, empty);
        }
        let gone = |s: &Slice| freeable.contains_key(&s.index);
        let used = if slices.iter().any(|s| s.node.is_empty()) { self.in_use(&name, &slices).await } else { None };
        // a free slice whose pools are all one node's goes back to that node (a NodeSlicePool lost and re-created
        // by a node's ADD lists only that node's slices; another controller may have freed it under its entries)
        let returned: Vec<(Slice, String)> = used
            .iter()
            .flatten()
            .filter_map(|(index, holders)| {
                let node = &holders.first()?.node;
                let slice = slices.iter().find(|s| s.index == *index)?;
                // a pool of another size inside or around the slice (adaptive slices) is not the slice's
                holders.iter().all(|h| &h.node == node && h.of(slice.cidr)).then(|| (slice.clone(), node.clone()))
            })
            .collect();
        // the pools cannot be read: give nothing away this pass
        let in_use = |s: &Slice| used.as_ref().is_none_or(|used| used.contains_key(&s.index));
        let moves = plan::leader_moves(&slices, assign, gone, in_use);
        for (slice, to) in returned.into_iter().chain(moves) {
            if let Some(empty) = freeable.get(&slice.index)
                && !self.delete_empty(&name, &slice, empty).await
            {
                kept.deferred += 1;
                continue;
            }
            match self.store.move_slice(&name, slice.index, &slice.stored(), &to).await {
                Ok(Patched::Applied) => {
                    tracing::info!(node_slices = %name, slice = %slice.cidr, from = %slice.node, to = %to, "slice moved");
                    let returned = used.as_ref().is_some_and(|u| u.contains_key(&slice.index));
                    kept.returned += usize::from(returned);
                    kept.assigned += usize::from(!to.is_empty() && !returned);
                    kept.freed += usize::from(!slice.node.is_empty());
                }
                Ok(other) => {
                    tracing::debug!(node_slices = %name, slice = %slice.cidr, ?other, "changed meanwhile");
                    kept.deferred += 1;
                }
                Err(e) => {
                    tracing::warn!(node_slices = %name, slice = %slice.cidr, error = %e, "moving the slice failed");
                    kept.deferred += 1;
                }
            }
        }
    }

    /// The live node's slice whose pools have stayed empty and unchanged the longest, if for [`Keeper::idle`] at
    /// least, with its pools as read; nodes the leader gives a slice to ([`Keeper::pass`]'s `assign`) keep theirs.
    async fn idlest(
        &mut self,
        name: &str,
        slices: &[Slice],
        live: &BTreeSet<String>,
        assign: &BTreeSet<String>,
        seen: &mut BTreeSet<SliceKey>,
    ) -> Option<(usize, EmptyPools)> {
        let mut idlest: Option<(Instant, usize, EmptyPools)> = None;
        for slice in slices.iter().filter(|s| live.contains(&s.node) && !assign.contains(&s.node)) {
            let Some(empty) = self.empty_pools(name, slice).await else { continue };
            let key = (name.to_string(), slice.cidr.to_string(), slice.node.clone());
            seen.insert(key.clone());
            let versions: Vec<Version> = empty.iter().map(|(_, v)| v.clone()).collect();
            let since = self.idle_since.entry(key).or_insert_with(|| (Instant::now(), versions.clone()));
            if since.1 != versions {
                *since = (Instant::now(), versions);
            }
            let since = since.0;
            if since.elapsed() >= self.idle && idlest.as_ref().is_none_or(|(at, ..)| since < *at) {
                idlest = Some((since, slice.index, empty));
            }
        }
        idlest.map(|(_, index, empty)| (index, empty))
    }

    /// Joins free cut slices back into larger ones, pair by pair, each on a fresh list ([`growth::joinable`]); up to
    /// [`MAX_JOINS`] a pass. Only when the listing as read had a pair (a slice freed this pass is joined at the next).
    async fn join(&self, listing: &NodeSlicePool, kept: &mut Kept) {
        let name = listing.metadata.name.clone().unwrap_or_default();
        let Some(largest) = plan::parse_slice_size(&listing.spec.slice_size) else { return };
        if growth::joinable(&plan::slices_of(listing), largest, |_| false).is_none() {
            return;
        }
        let pools = match self.store.list_pools().await {
            Ok(pools) => pools,
            Err(e) => {
                tracing::warn!(node_slices = %name, error = %e, "cannot list the pools; no slices joined this pass");
                kept.deferred += 1;
                return;
            }
        };
        let now = crate::clock::now();
        let in_use = |s: &Slice| {
            !plan::holders(&pools, &name, s.cidr, now).is_empty() || !plan::holders(&pools, "", s.cidr, now).is_empty()
        };
        for _ in 0..MAX_JOINS {
            // a LIST, which the leader may do, where a GET would need a right of its own: joins are rare
            let listed = self.store.list_node_slices().await;
            let slices = match listed.map(|l| l.into_iter().find(|n| n.metadata.name.as_deref() == Some(name.as_str())))
            {
                Ok(Some(now)) => plan::slices_of(&now),
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(node_slices = %name, error = %e, "cannot read the slices to join");
                    kept.deferred += 1;
                    return;
                }
            };
            let Some((a, b, parent)) = growth::joinable(&slices, largest, in_use) else { return };
            let joined = names::range_string(parent);
            match self.store.join_slices(&name, a.index, &a.stored(), b.index, &b.stored(), &joined).await {
                Ok(Patched::Applied) => {
                    tracing::info!(node_slices = %name, a = %a.cidr, b = %b.cidr, slice = %joined, "free slices joined");
                    kept.joined += 1;
                }
                Ok(other) => {
                    tracing::debug!(node_slices = %name, ?other, "changed meanwhile; next pass");
                    kept.deferred += 1;
                    return;
                }
                Err(e) => {
                    tracing::warn!(node_slices = %name, error = %e, "joining free slices failed");
                    kept.deferred += 1;
                    return;
                }
            }
        }
    }

    /// The free slices of `slices` that a pool still uses (listed free in a NodeSlicePool re-created after it was
    /// lost, or freed under its entries by another controller), by index, with the pools that use each; `None` when
    /// the pools cannot be read.
    async fn in_use(&self, node_slices: &str, slices: &[Slice]) -> Option<BTreeMap<usize, Vec<plan::Holder>>> {
        let pools = match self.store.list_pools().await {
            Ok(pools) => pools,
            Err(e) => {
                tracing::warn!(node_slices, error = %e, "cannot list the pools; no slice given this pass");
                return None;
            }
        };
        let now = crate::clock::now();
        let mut used = BTreeMap::new();
        for slice in slices.iter().filter(|s| s.node.is_empty()) {
            // a pool named for the network, else one of an unnamed network (its NodeSlicePool named after its
            // config): each pool read one way
            let mut holders = plan::holders(&pools, node_slices, slice.cidr, now);
            let unnamed = plan::holders(&pools, "", slice.cidr, now);
            holders
                .extend(unnamed.into_iter().filter(|u| !holders.iter().any(|h| h.pool == u.pool)).collect::<Vec<_>>());
            if !holders.is_empty() {
                let nodes: BTreeSet<&str> = holders.iter().map(|h| h.node.as_str()).collect();
                tracing::warn!(node_slices, slice = %slice.cidr, nodes = ?nodes, "a free slice whose pools hold entries");
                used.insert(slice.index, holders);
            }
        }
        Some(used)
    }

    /// The pools a gone node's `slice` may have (named for a named network, and for an unnamed one: the
    /// NodeSlicePool's name is one or the other), with the version each was read at, if every one that exists is
    /// empty; `None` when one holds entries, keeps an address cooling, or cannot be read. A pool's release
    /// records go with it: freed while an address cools, the slice's next owner would hand that address out at once.
    async fn empty_pools(&self, node_slices: &str, slice: &Slice) -> Option<Vec<(String, Version)>> {
        let mut empty = Vec::new();
        for network in [node_slices, ""] {
            let pool_name = names::slice_pool_name(network, &slice.node, slice.cidr);
            match self.store.get_pool(&pool_name).await {
                Ok(None) => {}
                Ok(Some(p))
                    if p.spec.allocations.is_empty() && cooldown::cooling(&p, crate::clock::now()).is_empty() =>
                {
                    empty.push((pool_name, Version::of_meta(&p.metadata)))
                }
                Ok(Some(_)) => return None,
                Err(e) => {
                    tracing::warn!(pool = %pool_name, error = %e, "cannot read a gone node's slice pool");
                    return None;
                }
            }
        }
        Some(empty)
    }

    /// Deletes the empty pools of a slice about to be freed, each only if unchanged since it was read.
    async fn delete_empty(&self, node_slices: &str, slice: &Slice, pools: &[(String, Version)]) -> bool {
        for (pool, version) in pools {
            match self.store.delete_pool(pool, version).await {
                Ok(Deleted::Deleted | Deleted::Missing) => {}
                Ok(Deleted::Changed) => {
                    tracing::info!(node_slices, slice = %slice.cidr, pool = %pool, "an entry arrived: slice kept");
                    return false;
                }
                Err(e) => {
                    tracing::warn!(node_slices, slice = %slice.cidr, pool = %pool, error = %e,
                        "deleting the empty slice pool failed");
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{IpAllocation, IpPool, IpPoolSpec, NodeSliceAllocation, NodeSlicePoolSpec};
    use crate::store::MemoryStore;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn listing(owners: &[&str]) -> NodeSlicePool {
        let spec = NodeSlicePoolSpec { range: "198.18.0.0/24".into(), slice_size: "26".into() };
        let slices: Vec<NodeSliceAllocation> = ["0", "64", "128", "192"]
            .iter()
            .zip(owners)
            .map(|(o, n)| NodeSliceAllocation { node_name: n.to_string(), slice_range: format!("198.18.0.{o}/26") })
            .collect();
        crate::store::node_slices_object("net", &spec, &slices)
    }

    fn owners(store: &MemoryStore) -> Vec<String> {
        store.node_slices()[0].status.clone().unwrap().allocations.into_iter().map(|a| a.node_name).collect()
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[tokio::test]
    async fn slices_go_only_to_the_nodes_named_and_a_slice_in_use_back_to_its_pools_node() {
        let store = MemoryStore::new("ns");
        store.put_node_slices(listing(&["a", "", "", ""]));
        // a Whereabouts pool of the free second slice holds an entry (its slice was freed under it)
        let entry = IpAllocation { id: "c".into(), podref: "ns/p".into(), ..IpAllocation::default() };
        let spec = IpPoolSpec {
            range: "198.18.0.64/26".into(),
            allocations: [("1".into(), entry)].into(),
            ..Default::default()
        };
        store.put_pool(IpPool::new("net-x-198.18.0.64-26", spec));
        let mut keeper = Keeper::new(store.clone(), Duration::ZERO);
        let live = set(&["a", "b", "c", "x"]);
        let kept = keeper.pass(&live, &BTreeSet::new()).await.unwrap();
        assert_eq!(owners(&store), ["a", "x", "", ""], "nobody asked; the slice in use goes back to x");
        assert_eq!((kept.returned, kept.assigned), (1, 0));
        let kept = keeper.pass(&live, &set(&["b", "c"])).await.unwrap();
        assert_eq!(owners(&store), ["a", "x", "b", "c"]);
        assert_eq!(kept.assigned, 2);
    }

    #[tokio::test]
    async fn a_move_refused_because_a_node_claimed_meanwhile_is_deferred_to_a_pass_soon() {
        use crate::store::memory::{Fault, FaultPlan, Op};
        let store = MemoryStore::new("ns");
        store.put_node_slices(listing(&["a", "", "", ""]));
        let racing = store.handle("leader", FaultPlan::quiet(1).at(Op::MoveSlice, 2, Fault::Conflict));
        let mut keeper = Keeper::new(racing, Duration::ZERO);
        let kept = keeper.pass(&set(&["a", "b", "c", "d"]), &set(&["b", "c", "d"])).await.unwrap();
        assert_eq!((kept.assigned, kept.deferred), (2, 1), "{kept:?}");
        let again = keeper.pass(&set(&["a", "b", "c", "d"]), &set(&["b", "c", "d"])).await.unwrap();
        assert_eq!((again.assigned, again.deferred), (1, 0), "{again:?}");
    }

    /// A gone node's cut slice, freed, is joined with its free buddy, and that with its own, back to the
    /// NodeSlicePool's slice size; a part a pool still uses is not joined; an entry moved by a concurrent claim (the
    /// joins shift the list) refuses that claim rather than give it another slice.
    #[tokio::test]
    async fn free_cut_slices_are_joined_back_to_the_slice_size() {
        let store = MemoryStore::new("ns");
        let spec = NodeSlicePoolSpec { range: "198.18.0.0/25".into(), slice_size: "26".into() };
        let listed = |list: &[(&str, &str)]| -> Vec<NodeSliceAllocation> {
            list.iter()
                .map(|(r, n)| NodeSliceAllocation { node_name: n.to_string(), slice_range: r.to_string() })
                .collect()
        };
        let cut = listed(&[
            ("198.18.0.0/28", "gone"),
            ("198.18.0.64/26", ""),
            ("198.18.0.32/27", ""),
            ("198.18.0.16/28", ""),
        ]);
        store.put_node_slices(crate::store::node_slices_object("net", &spec, &cut));
        let mut keeper = Keeper::new(store.clone(), Duration::ZERO);
        let kept = keeper.pass(&set(&["a"]), &BTreeSet::new()).await.unwrap();
        assert_eq!(kept.freed, 1, "{kept:?}");
        // freed this pass, joined at the next
        let kept = keeper.pass(&set(&["a"]), &BTreeSet::new()).await.unwrap();
        assert_eq!(kept.joined, 2, "{kept:?}");
        let now = store.node_slices()[0].status.clone().unwrap().allocations;
        assert_eq!(now, listed(&[("198.18.0.0/26", ""), ("198.18.0.64/26", "")]));
        assert_eq!(keeper.pass(&set(&["a"]), &BTreeSet::new()).await.unwrap(), Kept::default(), "nothing left");

        // a claim read the list before a join moved its entry: refused, not applied elsewhere
        store.put_node_slices(crate::store::node_slices_object("net2", &spec, &cut[1..]));
        let kept = keeper.pass(&set(&["a"]), &BTreeSet::new()).await.unwrap();
        assert_eq!(kept.joined, 0, "no buddies: .16/28's buddy .0/28 is not listed");
        let stale = Slice { index: 3, cidr: "198.18.0.16/28".parse().unwrap(), node: String::new() };
        store.put_node_slices(crate::store::node_slices_object(
            "net2",
            &spec,
            &listed(&[("198.18.0.64/26", ""), ("198.18.0.0/28", ""), ("198.18.0.32/27", ""), ("198.18.0.16/28", "")]),
        ));
        assert_eq!(keeper.pass(&set(&["a"]), &BTreeSet::new()).await.unwrap().joined, 2);
        let claim = store.move_slice("net2", stale.index, &stale.stored(), "b").await.unwrap();
        assert!(matches!(claim, Patched::Refused(_)), "{claim:?}");
        assert!(
            store.node_slices().iter().all(|n| n
                .status
                .as_ref()
                .unwrap()
                .allocations
                .iter()
                .all(|a| a.node_name.is_empty()))
        );

        // a free part a pool still holds entries in stays as it is
        store.put_node_slices(crate::store::node_slices_object(
            "net3",
            &spec,
            &listed(&[("198.18.0.0/28", ""), ("198.18.0.16/28", ""), ("198.18.0.32/27", "")]),
        ));
        let entry = IpAllocation { id: "c".into(), podref: "ns/p".into(), ..IpAllocation::default() };
        let pool = IpPoolSpec {
            range: "198.18.0.16/28".into(),
            allocations: [("1".into(), entry)].into(),
            ..Default::default()
        };
        store.put_pool(IpPool::new("net3-y-198.18.0.16-28", pool));
        keeper.pass(&set(&["a", "y"]), &BTreeSet::new()).await.unwrap();
        let net3 = store.node_slices().into_iter().find(|n| n.metadata.name.as_deref() == Some("net3")).unwrap();
        let ranges: Vec<String> = net3.status.unwrap().allocations.into_iter().map(|a| a.slice_range).collect();
        assert!(ranges.contains(&"198.18.0.16/28".to_string()), "{ranges:?}");
    }

    /// S11 of the fourth review: claims ahead gave every node a slice; while none is free, the live node's slice
    /// whose pool stayed empty and unchanged longest is freed, one a pass, for a busy node to claim. A slice whose
    /// pool changed meanwhile starts its wait again; a node the leader gives slices to keeps its own; with a slice
    /// free, nothing more is freed (and idleness is timed again once none is).
    #[tokio::test(start_paused = true)]
    async fn while_no_slice_is_free_a_live_nodes_slice_idle_for_long_is_freed_one_a_pass() {
        let store = MemoryStore::new("ns");
        store.put_node_slices(listing(&["busy", "idle-1", "idle-2", "assigned"]));
        let entry = IpAllocation { id: "c".into(), podref: "ns/p".into(), ..IpAllocation::default() };
        let pool = |cidr: &str, allocations: BTreeMap<String, IpAllocation>| IpPoolSpec {
            range: cidr.into(),
            allocations,
            ..Default::default()
        };
        store.put_pool(IpPool::new("net-busy-198.18.0.0-26", pool("198.18.0.0/26", [("1".into(), entry)].into())));
        store.put_pool(IpPool::new("net-idle-1-198.18.0.64-26", pool("198.18.0.64/26", BTreeMap::new())));
        store.put_pool(IpPool::new("net-idle-2-198.18.0.128-26", pool("198.18.0.128/26", BTreeMap::new())));
        store.put_pool(IpPool::new("net-assigned-198.18.0.192-26", pool("198.18.0.192/26", BTreeMap::new())));
        let live = set(&["busy", "idle-1", "idle-2", "assigned"]);
        let mut keeper = Keeper::new(store.clone(), Duration::ZERO);
        assert_eq!(keeper.idle, IDLE);
        let pass = async |keeper: &mut Keeper<MemoryStore>| keeper.pass(&live, &set(&["assigned"])).await.unwrap();
        assert_eq!(pass(&mut keeper).await, Kept::default(), "nothing idle for long yet");
        tokio::time::advance(IDLE / 2).await;
        // idle-1's pool took an entry and gave it back: used lately
        let used = store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some("net-idle-1-198.18.0.64-26"));
        store.put_pool(used.unwrap());
        assert_eq!(pass(&mut keeper).await, Kept::default());
        tokio::time::advance(IDLE / 2).await;
        let kept = pass(&mut keeper).await;
        assert_eq!(kept.freed, 1, "{kept:?}");
        assert_eq!(owners(&store), ["busy", "idle-1", "", "assigned"], "idle-2's, empty longest, is freed");
        assert!(
            store.pools().iter().all(|p| p.metadata.name.as_deref() != Some("net-idle-2-198.18.0.128-26")),
            "its empty pool was deleted first"
        );
        tokio::time::advance(IDLE).await;
        assert_eq!(pass(&mut keeper).await, Kept::default(), "a slice is free: nothing more is freed");
        let free = NodeSliceAllocation { node_name: String::new(), slice_range: "198.18.0.128/26".into() };
        assert_eq!(
            store.move_slice("net", 2, &free, "busy").await.unwrap(),
            Patched::Applied,
            "the busy node claims it"
        );
        // idleness is timed only while no slice is free: the wait starts again
        assert_eq!(pass(&mut keeper).await, Kept::default());
        tokio::time::advance(IDLE).await;
        let kept = pass(&mut keeper).await;
        assert_eq!(kept.freed, 1, "{kept:?}");
        assert_eq!(owners(&store), ["busy", "", "busy", "assigned"], "then idle-1's; the assigned node keeps its own");
    }

    #[tokio::test]
    async fn owner_references_to_network_attachment_definitions_are_dropped() {
        let store = MemoryStore::new("ns");
        let mut owned = listing(&["a", "", "", ""]);
        let reference = |kind: &str, name: &str| OwnerReference {
            api_version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("{name}-uid"),
            ..OwnerReference::default()
        };
        owned.metadata.owner_references =
            Some(vec![reference("NetworkAttachmentDefinition", "net-in-other-ns"), reference("ConfigMap", "keep")]);
        store.put_node_slices(owned);
        let kept = Keeper::new(store.clone(), Duration::ZERO).pass(&set(&["a"]), &BTreeSet::new()).await.unwrap();
        assert_eq!(kept.unowned, 1);
        let left = store.node_slices()[0].metadata.owner_references.clone().unwrap();
        assert_eq!(left.iter().map(|o| o.kind.as_str()).collect::<Vec<_>>(), ["ConfigMap"]);
    }
}
