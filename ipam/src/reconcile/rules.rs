//! Pure decisions: is an allocation still held by a live pod, is a reservation an orphan, does a live entry lack
//! its reservation, is an address held twice. Every release and repair the reconciler makes goes through these,
//! so the rules that keep a live pod's address safe are all here, and property-tested.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crate::claim::pool_scope;
use crate::crd::{IpAllocation, IpPool, OverlappingRangeIpReservationSpec};
use crate::names;
use crate::range::IpRange;
use k8s_openapi::jiff::Timestamp;

/// What the API server says of the pod an allocation names, read right before deciding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodView {
    /// No pod of that namespace and name exists.
    Missing,
    /// A pod of that name exists.
    Present {
        /// Its UID.
        uid: String,
        /// Phase Succeeded or Failed: its sandbox is gone for good.
        finished: bool,
        /// A mirror pod (of a static pod): the kubelet's UID, which the CNI records, is not this one.
        mirror: bool,
    },
}

/// Why an allocation or a reservation is given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The pod was deleted.
    Deleted,
    /// The pod reached phase Succeeded or Failed.
    Finished,
    /// A pod of the same name exists, but it is a new one (another UID): the entry is the old pod's.
    Replaced,
    /// A reservation no pool entry accounts for, older than any ADD can run.
    Orphaned,
    /// A warm entry whose Node no longer exists: nobody is left to take it ([`judge_warm`]).
    NodeGone,
}

impl Reason {
    /// The label value in metrics and the word in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Deleted => "pod_deleted",
            Reason::Finished => "pod_finished",
            Reason::Replaced => "pod_replaced",
            Reason::Orphaned => "orphaned",
            Reason::NodeGone => "node_gone",
        }
    }
}

/// Why an allocation is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Its pod is alive (Pending counts: the CNI allocates before the pod runs).
    Live,
    /// It is younger than the grace period and nothing ties it to a pod known to be gone: an ADD may be in flight.
    Fresh,
    /// It names no pod that can be looked up (`podref` not `namespace/name`), nor a node's warm reserve: never
    /// guess.
    Unjudgeable,
    /// A warm entry (a node's reserve, [`crate::warm`]) whose Node exists: the node's agent may hand it to a pod
    /// at any moment.
    Warm,
    /// Its pod is gone or being replaced, but the StatefulSet that owns it still wants the pod's ordinal: the pod
    /// recreated under the same name takes it over (sticky StatefulSet addresses).
    Sticky,
    /// Its pod is gone or being replaced, but the IPAMClaim it belongs to exists: the claim's next pod (a VM's,
    /// after a migration or a restart) takes it over.
    Claimed,
}

/// The verdict on one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Release(Reason),
    Keep(Keep),
}

/// What the API server says of the Node a warm entry names, read right before deciding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeView {
    /// No Node of that name exists.
    Missing,
    /// A Node of that name exists (being deleted or not: until it is gone, its agent may still run).
    Present,
}

/// What is known when judging one allocation.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The pod, as read from the API server.
    pub pod: &'a PodView,
    /// The UID of a pod the caller saw deleted or finish under this name, if any (a watch event).
    pub gone_uid: Option<&'a str>,
    /// Now.
    pub now: Timestamp,
    /// How long a fresh allocation is left alone.
    pub grace: Duration,
    /// Whether the entry is sticky and its StatefulSet still wants the pod's ordinal ([`sticky_wanted`]).
    pub sticky: bool,
    /// Whether the entry belongs to an IPAMClaim that exists.
    pub claimed: bool,
}

/// What the API server says of the StatefulSet a sticky entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatefulSetView {
    /// `spec.replicas` (1 when unset).
    pub replicas: i32,
    /// `spec.ordinals.start` (0 when unset): the ordinals are `start..start + replicas`.
    pub start: i32,
    /// Whether it has a deletion timestamp (a foreground deletion deletes its pods while it still exists).
    pub deleting: bool,
}

/// The ordinal of the pod `podref` names as a pod of StatefulSet `statefulset` (`<statefulset>-<ordinal>`).
pub fn ordinal_of(podref: &str, statefulset: &str) -> Option<i32> {
    let (_, pod) = podref_parts(podref)?;
    crate::claim::statefulset_ordinal(pod, statefulset)
}

/// Whether `entry` is sticky and `statefulset` (as read now; `None`: it does not exist) still wants its pod's
/// ordinal: it exists, is not being deleted, and the ordinal is below its replicas (from its start ordinal).
pub fn sticky_wanted(entry: &IpAllocation, statefulset: Option<&StatefulSetView>) -> bool {
    let (Some(name), Some(set)) = (entry.statefulset.as_deref(), statefulset) else { return false };
    let Some(ordinal) = ordinal_of(&entry.podref, name) else { return false };
    !set.deleting && ordinal >= set.start && i64::from(ordinal) < i64::from(set.start) + i64::from(set.replicas)
}

/// Whether an IPAMClaim that records `ips` (`None`: the claim is gone) still wants its entry at `ip`: it exists,
/// and records this address or none yet (the ADD that holds it has not recorded it). An entry of the claim at
/// another address is one an ADD that lost the claim to another pod could not give back.
pub fn claim_wants(ips: Option<&[String]>, ip: Option<std::net::IpAddr>) -> bool {
    let Some(ips) = ips else { return false };
    let address =
        |s: &String| s.parse::<ipnet::IpNet>().map(|n| n.addr()).ok().or_else(|| s.parse::<std::net::IpAddr>().ok());
    ips.is_empty() || ip.is_some_and(|ip| ips.iter().any(|s| address(s) == Some(ip)))
}

/// `namespace/name`, if `podref` is of that form.
pub fn podref_parts(podref: &str) -> Option<(&str, &str)> {
    podref.split_once('/').filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
}

fn younger_than(at: Option<Timestamp>, now: Timestamp, age: Duration) -> bool {
    let Some(at) = at else { return false };
    let elapsed = now.duration_since(at);
    elapsed.is_negative() || elapsed.unsigned_abs() < age
}

/// When the entry was allocated, if hereabouts wrote that for its sandbox.
fn allocated_at(allocation: &IpAllocation) -> Option<Timestamp> {
    allocation.allocated.as_deref().filter(|_| allocation.is_recorded()).and_then(|t| t.parse().ok())
}

/// Decides whether `allocation` may be given back.
///
/// The rules, in order:
/// 1. An entry whose pod reference cannot be looked up is kept. A warm entry is one of these here: no pod rule may
///    give a node's reserve back; its Node decides ([`judge_warm`]).
/// 2. An entry that records the UID of a pod seen gone (`gone_uid`) is that pod's: released at once, whatever its
///    age, unless the API server shows that same pod alive again (a stale event).
/// 3. An entry recording another UID than the pod that exists now is an earlier pod's: released — except for a
///    mirror pod, whose UID is never the one the CNI recorded (static pods are matched by name).
/// 4. A live pod keeps its entry (Pending included); a finished one gives it back.
/// 5. An entry whose pod is missing is released, unless it is younger than the grace period (entries Whereabouts
///    wrote carry no time and are judged by their pod alone).
/// 6. Whatever rules 2 to 5 release (or keep only as fresh), a sticky entry whose StatefulSet still wants its
///    ordinal keeps ([`Facts::sticky`]), and so does an entry of an IPAMClaim that exists ([`Facts::claimed`]).
pub fn judge(allocation: &IpAllocation, facts: &Facts<'_>) -> Verdict {
    match judge_pod(allocation, facts) {
        // a fresh entry is kept anyway; saying why it outlives its pod tells more
        Verdict::Release(_) | Verdict::Keep(Keep::Fresh) if facts.sticky && allocation.statefulset.is_some() => {
            Verdict::Keep(Keep::Sticky)
        }
        Verdict::Release(_) | Verdict::Keep(Keep::Fresh) if facts.claimed && allocation.ipamclaim.is_some() => {
            Verdict::Keep(Keep::Claimed)
        }
        verdict => verdict,
    }
}

fn judge_pod(allocation: &IpAllocation, facts: &Facts<'_>) -> Verdict {
    if podref_parts(&allocation.podref).is_none() {
        return Verdict::Keep(Keep::Unjudgeable);
    }
    // a UID written for another sandbox than the entry's (Whereabouts reused the entry for a recreated pod) is not
    // this pod's: judged by name alone
    let recorded = allocation.recorded_uid();
    let fresh = younger_than(allocated_at(allocation), facts.now, facts.grace);
    match facts.pod {
        PodView::Present { uid, finished, mirror } => {
            if !mirror && recorded.is_some_and(|r| r != uid) {
                let seen_gone = recorded == facts.gone_uid;
                return if !seen_gone && fresh {
                    Verdict::Keep(Keep::Fresh)
                } else {
                    Verdict::Release(Reason::Replaced)
                };
            }
            if *finished { Verdict::Release(Reason::Finished) } else { Verdict::Keep(Keep::Live) }
        }
        PodView::Missing => {
            let seen_gone = recorded.is_some() && recorded == facts.gone_uid;
            if !seen_gone && fresh { Verdict::Keep(Keep::Fresh) } else { Verdict::Release(Reason::Deleted) }
        }
    }
}

/// The least time a Node must have been missing before its warm entries are freed: six of its agent's Node reads
/// (every 10 s), so that the agent has stopped taking from the reserve well before.
pub const WARM_GRACE_FLOOR: Duration = Duration::from_secs(60);

/// The node whose warm reserve `allocation` belongs to ([`crate::warm`]), if it is a warm entry.
pub fn warm_node(allocation: &IpAllocation) -> Option<&str> {
    crate::warm::node_of(&allocation.podref)
}

/// Decides on a warm entry, given its Node as read right before and how long this process has seen it missing
/// without a break (`missing_for`, zero at the first sight): kept while the Node exists, released once it has
/// been missing for `grace`. No pod names a warm entry, so its Node is the only thing whose end can end it; and
/// while the Node exists, its agent may hand the address to a pod at any moment (from its journal, with no request
/// on the path), so nothing else may give it back. A Node deleted by hand is registered again by its kubelet
/// within seconds, its agent still running: one read in that gap must not free the reserve, so a Node missing for
/// less than `grace` keeps it. A Node that cannot be read is not judged at all.
///
/// The reserve's safety needs the agent to see its Node gone (it reads it every 10 s, then stops taking) before
/// the entries are freed, whatever `grace` the operator chose for pods (its minimum is 0): the wait is never below
/// [`WARM_GRACE_FLOOR`].
pub fn judge_warm(node: NodeView, missing_for: Duration, grace: Duration) -> Verdict {
    match node {
        NodeView::Missing if missing_for >= grace.max(WARM_GRACE_FLOOR) => Verdict::Release(Reason::NodeGone),
        NodeView::Present | NodeView::Missing => Verdict::Keep(Keep::Warm),
    }
}

/// What the node loop remembers of one pod of its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownPod {
    pub uid: String,
    pub finished: bool,
}

/// Whether an entry recorded on `node` deserves a look after the node's pods were (re)listed: its pod is not, or
/// no longer, a live pod of this node, or it is another pod of that name. A warm entry never does: it names no
/// pod, and the node loop runs on a node that exists — its warm entries are the cluster reconcile's, which
/// asks for their Node ([`judge_warm`]).
pub fn suspicious(entry: &IpAllocation, node: &str, on_node: &HashMap<String, KnownPod>) -> bool {
    entry.is_recorded()
        && entry.node.as_deref() == Some(node)
        && warm_node(entry).is_none()
        && match on_node.get(&entry.podref) {
            None => true,
            Some(known) => known.finished || entry.recorded_uid().is_some_and(|u| u != known.uid),
        }
}

/// One pool entry that accounts for a reservation name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The pool's name.
    pub pool: String,
    /// The entry's offset.
    pub offset: u128,
    /// The entry.
    pub entry: IpAllocation,
}

/// A pure index over the pools: which entries account for each reservation name, and which (network, range)
/// pairs exist, to tell a reservation of ours from one of an unknown kind.
#[derive(Debug, Default)]
pub struct Index {
    holders: HashMap<String, Vec<Holder>>,
    scopes: Vec<(String, String, IpRange)>,
    /// The (network, range) pairs NodeSlicePools cut into slices ([`Index::with_node_slices`]).
    sliced: Vec<(String, IpRange)>,
}

impl Index {
    /// Indexes `pools`. Pools whose name or range cannot be read (slice pools, other tools') hold no scope.
    pub fn new<'a>(pools: impl IntoIterator<Item = &'a IpPool>) -> Self {
        let mut index = Index::default();
        for pool in pools {
            let Some((range, network)) = pool_scope(pool) else { continue };
            let pool_name = pool.metadata.name.clone().unwrap_or_default();
            for (key, entry) in &pool.spec.allocations {
                let Some((offset, ip)) = key.parse().ok().and_then(|o| Some((o, range.checked_addr_at(o)?))) else {
                    continue;
                };
                index.holders.entry(names::reservation_name(&network, ip)).or_default().push(Holder {
                    pool: pool_name.clone(),
                    offset,
                    entry: entry.clone(),
                });
            }
            index.scopes.push((pool_name, network, range));
        }
        index
    }

    /// The entries that account for the reservation `name` (under any name a reservation of the address may have).
    pub fn holders(&self, name: &str) -> &[Holder] {
        if let Some(found) = self.holders.get(name) {
            return found;
        }
        let canonical = self.scopes.iter().find_map(|(_, network, range)| {
            reservation_address(name, network, range).map(|ip| names::reservation_name(network, ip))
        });
        canonical.and_then(|c| self.holders.get(&c)).map_or(&[], Vec::as_slice)
    }

    /// `self`, knowing the ranges `listings` cut into slices too: a reservation in a slice that has no pool (freed,
    /// its empty pool deleted) is then one of ours, which no entry accounts for. A NodeSlicePool is named after its
    /// network, or after its config when the network has no name: its range counts for both.
    pub fn with_node_slices(mut self, listings: &[crate::crd::NodeSlicePool]) -> Self {
        for listing in listings {
            let Ok(range) = IpRange::parse_as(&listing.spec.range, None, None, &[], crate::range::Hosts::All) else {
                continue;
            };
            let name = listing.metadata.name.clone().unwrap_or_default();
            self.sliced.push((name, range.clone()));
            self.sliced.push((String::new(), range));
        }
        self
    }

    /// Whether the reservation `name` is of a network and range known here: a pool's ([`Index::pools_for`]), or a
    /// NodeSlicePool's ([`Index::with_node_slices`]).
    pub fn knows(&self, name: &str) -> bool {
        !self.pools_for(name).is_empty()
            || self.sliced.iter().any(|(network, range)| reservation_address(name, network, range).is_some())
    }

    /// The pools whose entries would account for the reservation `name`: those of its network whose range holds
    /// its address. Empty for a reservation of no known network and range.
    pub fn pools_for(&self, name: &str) -> Vec<String> {
        self.scopes
            .iter()
            .filter(|(_, network, range)| reservation_address(name, network, range).is_some())
            .map(|(pool, _, _)| pool.clone())
            .collect()
    }

    /// Reservation names accounted for by entries of more than one pod: an address held by two attachments.
    pub fn doubly_held(&self) -> Vec<(&str, BTreeSet<&str>)> {
        let mut found: Vec<(&str, BTreeSet<&str>)> = self
            .holders
            .iter()
            .map(|(name, holders)| (name.as_str(), holders.iter().map(|h| h.entry.podref.as_str()).collect()))
            .filter(|(_, pods): &(&str, BTreeSet<&str>)| pods.len() > 1)
            .collect();
        found.sort();
        found
    }
}

pub use crate::names::reservation_address;

/// Why a reservation is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepReservation {
    /// An entry of its pod accounts for it.
    Accounted,
    /// Claimed too recently: an ADD may still be on its way to writing the entry.
    Fresh,
    /// It belongs to no network and range any pool here knows: not ours to judge.
    Unknown,
}

/// The verdict on one reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReservationVerdict {
    Keep(KeepReservation),
    /// No entry accounts for it and it is older than any ADD can run.
    Release,
    /// Entries of other pods account for it: the address is held by two attachments.
    Conflict(String),
}

/// Decides on a reservation held by `spec`, last claimed at `claimed_at`.
///
/// An ADD claims the reservation before it writes the entry, and a claim (creation or take-over) is stamped; an
/// ADD cannot run longer than `orphan_age`. So a reservation that no entry accounts for and whose last claim is
/// older than that will never get its entry: it is released, whether or not its pod still exists (a killed ADD
/// whose retry landed on another address leaves such a claim behind for a live pod).
///
/// A warm reservation carries its warm entry's pod reference (the node's token), so it is accounted for while
/// that entry exists, and an orphan like any other once the entry is gone.
pub fn judge_reservation(
    spec: &OverlappingRangeIpReservationSpec,
    claimed_at: Option<Timestamp>,
    holders: &[Holder],
    known: bool,
    now: Timestamp,
    orphan_age: Duration,
) -> ReservationVerdict {
    if holders.iter().any(|h| h.entry.podref == spec.podref) {
        return ReservationVerdict::Keep(KeepReservation::Accounted);
    }
    if let Some(other) = holders.first() {
        return ReservationVerdict::Conflict(other.entry.podref.clone());
    }
    if !known {
        return ReservationVerdict::Keep(KeepReservation::Unknown);
    }
    // no claim time at all: its age is unknown, so it is as old as can be
    if claimed_at.is_some() && younger_than(claimed_at, now, orphan_age) {
        return ReservationVerdict::Keep(KeepReservation::Fresh);
    }
    ReservationVerdict::Release
}

/// What a live entry's reservation says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryClaim {
    /// Held by the entry's pod, or the entry's network reserves nothing.
    Fine,
    /// The entry records a reservation that is gone: put it back.
    Missing,
    /// Another pod holds it: the address is held by two attachments.
    Conflict(String),
}

/// Checks a live entry against its reservation as listed.
pub fn entry_claim(entry: &IpAllocation, reservation: Option<&OverlappingRangeIpReservationSpec>) -> EntryClaim {
    match reservation {
        None if entry.reserved => EntryClaim::Missing,
        None => EntryClaim::Fine,
        Some(spec) if spec.podref == entry.podref => EntryClaim::Fine,
        Some(spec) => EntryClaim::Conflict(spec.podref.clone()),
    }
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
