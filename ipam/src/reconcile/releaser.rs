//! What the reconciler does about one entry or one reservation: re-read what the decision needs (the pod, or the
//! Node of a warm entry), decide with the rules of [`super::rules`], write with the guarded operations of
//! [`crate::claim`], then count it and tell the pod's Events. Shared by the reconciler's node loop and cluster
//! reconcile, and by `kubectl hereabouts ipam check --repair`.

use std::collections::HashMap;
use std::time::Duration;

use super::cluster::{Cluster, Notice};
use super::rules::{
    Facts, Index, Keep, KeepReservation, NodeView, PodView, Reason, ReservationVerdict, Verdict, claim_wants, judge,
    judge_reservation, judge_warm, podref_parts, sticky_wanted, warm_node,
};
use crate::budget::Budget;
use crate::claim::{
    Reclaimed, Restored, address_of, reclaim, release_orphan, reservation_of, restore_reservation, understand,
};
use crate::crd::{IpAllocation, IpPool, OverlappingRangeIpReservation};
use crate::store::{PoolStore, ReservationStore, SliceStore, StoreError, claimed_at};

/// Time one release or repair may take, retries included.
const STEP_BUDGET: Duration = Duration::from_secs(30);

/// What a releaser counts, for whoever keeps the numbers: the reconciler's metrics; nothing for a one-off repair.
pub trait Tally: Send + Sync {
    /// An entry was given back, for `reason`.
    fn released(&self, _reason: Reason) {}
    /// An entry changed between the judgement and the guarded write: a race lost safely.
    fn changed(&self) {}
    /// A release failed.
    fn failed(&self) {}
    /// The missing reservation of a live entry was put back.
    fn restored(&self) {}
    /// An address was found held by more than one pod.
    fn conflict(&self) {}
    /// A reservation no entry accounts for was deleted.
    fn orphan_released(&self) {}
    /// How many addresses the last full pass found held by more than one pod.
    fn conflicts_now(&self, _count: usize) {}
}

/// Counts nothing.
impl Tally for () {}

impl<T: Tally + ?Sized> Tally for std::sync::Arc<T> {
    fn released(&self, reason: Reason) {
        (**self).released(reason);
    }
    fn changed(&self) {
        (**self).changed();
    }
    fn failed(&self) {
        (**self).failed();
    }
    fn restored(&self) {
        (**self).restored();
    }
    fn conflict(&self) {
        (**self).conflict();
    }
    fn orphan_released(&self) {
        (**self).orphan_released();
    }
    fn conflicts_now(&self, count: usize) {
        (**self).conflicts_now(count);
    }
}

/// Everything a release needs.
#[derive(Debug)]
pub struct Releaser<S, C, T = ()> {
    pub store: S,
    pub cluster: C,
    /// What counts the outcomes.
    pub tally: T,
    /// Entries younger than this whose pod is missing are left alone (a static pod's mirror may not exist yet).
    pub grace: Duration,
    /// A reservation no entry accounts for is released once its last claim is this old: longer than any ADD runs.
    pub orphan_age: Duration,
    /// Since when this process has seen each Node of warm entries missing, without a read in between that found
    /// it ([`judge_warm`]).
    pub missing_nodes: MissingNodes,
}

/// When a process first saw each Node missing, since the last read that found it.
#[derive(Debug, Default)]
pub struct MissingNodes(std::sync::Mutex<HashMap<String, tokio::time::Instant>>);

impl MissingNodes {
    /// Records what a read of Node `name` found; returns how long it has been missing.
    fn seen(&self, name: &str, view: NodeView) -> Duration {
        let mut missing = self.0.lock().expect("not poisoned");
        match view {
            NodeView::Present => {
                missing.remove(name);
                Duration::ZERO
            }
            NodeView::Missing => missing.entry(name.to_string()).or_insert_with(tokio::time::Instant::now).elapsed(),
        }
    }
}

/// The outcome of considering one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Considered {
    Released(Reason),
    Kept(Keep),
    /// The entry changed under us: someone else released or re-assigned it.
    Changed,
    /// The pod (or a warm entry's Node) could not be read, or the release failed: try again later.
    Failed,
}

/// The outcome of considering one reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReservationOutcome {
    Released,
    Kept,
    /// Too fresh to judge: look again once it is `orphan_age` old.
    Fresh,
    Failed,
}

/// Pod and Node reads made within one pass, so that a pod with many entries, or a node with many warm ones, is
/// read once.
#[derive(Debug, Default)]
pub struct Views {
    pods: HashMap<String, PodView>,
    nodes: HashMap<String, NodeView>,
}

impl Views {
    /// Nothing read yet.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S: PoolStore + ReservationStore + SliceStore, C: Cluster, T: Tally> Releaser<S, C, T> {
    async fn view(&self, podref: &str, views: &mut Views) -> Option<PodView> {
        if let Some(view) = views.pods.get(podref) {
            return Some(view.clone());
        }
        match self.cluster.pod(podref).await {
            Ok(view) => {
                views.pods.insert(podref.to_string(), view.clone());
                Some(view)
            }
            Err(e) => {
                tracing::warn!(%podref, error = %e, "cannot read the pod; keeping its address");
                None
            }
        }
    }

    /// Whether the Node `name` exists; `None` when that cannot be read (its warm entries are then kept: never
    /// guess).
    async fn node(&self, name: &str, views: &mut Views) -> Option<NodeView> {
        if let Some(view) = views.nodes.get(name) {
            return Some(*view);
        }
        match self.cluster.node(name).await {
            Ok(view) => {
                views.nodes.insert(name.to_string(), view);
                Some(view)
            }
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "cannot read the Node; keeping its warm addresses");
                None
            }
        }
    }

    /// Whether `held` is sticky and its StatefulSet still wants it; `None` when that cannot be read (the entry is
    /// then kept: never guess).
    async fn sticky(&self, held: &IpAllocation) -> Option<bool> {
        let Some(name) = held.statefulset.as_deref() else { return Some(false) };
        let (namespace, _) = podref_parts(&held.podref)?;
        match self.cluster.statefulset(namespace, name).await {
            Ok(set) => Some(sticky_wanted(held, set.as_ref())),
            Err(e) => {
                tracing::warn!(podref = %held.podref, statefulset = name, error = %e,
                    "cannot read the StatefulSet; keeping its pod's sticky address");
                None
            }
        }
    }

    /// Whether `held` (at `ip`) belongs to an IPAMClaim that still wants it ([`claim_wants`]); `None` when that
    /// cannot be read (the entry is then kept: never guess).
    async fn claimed(&self, held: &IpAllocation, ip: Option<std::net::IpAddr>) -> Option<bool> {
        let Some(name) = held.ipamclaim.as_deref() else { return Some(false) };
        let (namespace, _) = podref_parts(&held.podref)?;
        match self.cluster.ipamclaim(namespace, name).await {
            Ok(ips) => Some(claim_wants(ips.as_deref(), ip)),
            Err(e) => {
                tracing::warn!(podref = %held.podref, ipamclaim = name, error = %e,
                    "cannot read the IPAMClaim; keeping its address");
                None
            }
        }
    }

    /// The verdict on `held`, from what the API server says now: of its pod, or of its Node for a warm entry.
    /// `None` when that cannot be read.
    async fn verdict(
        &self,
        held: &IpAllocation,
        ip: Option<std::net::IpAddr>,
        gone_uid: Option<&str>,
        views: &mut Views,
    ) -> Option<Verdict> {
        if let Some(node) = warm_node(held) {
            let view = self.node(node, views).await?;
            return Some(judge_warm(view, self.missing_nodes.seen(node, view), self.grace));
        }
        if podref_parts(&held.podref).is_none() {
            return Some(Verdict::Keep(Keep::Unjudgeable));
        }
        let view = self.view(&held.podref, views).await?;
        let sticky = self.sticky(held).await?;
        let claimed = self.claimed(held, ip).await?;
        let facts = Facts { pod: &view, gone_uid, now: crate::clock::now(), grace: self.grace, sticky, claimed };
        Some(judge(held, &facts))
    }

    /// Judges the entry `held` at `offset` of `pool` and gives it back if its pod no longer holds it (or, for a
    /// warm entry, its Node is gone). `gone_uid` is the UID of a pod seen deleted or finished under that name.
    pub async fn consider(
        &self,
        pool: &IpPool,
        offset: u128,
        held: &IpAllocation,
        gone_uid: Option<&str>,
        views: &mut Views,
    ) -> Considered {
        let reason = match self.verdict(held, address_of(pool, offset), gone_uid, views).await {
            None => return Considered::Failed,
            Some(Verdict::Keep(keep)) => return Considered::Kept(keep),
            Some(Verdict::Release(reason)) => reason,
        };
        let pool_name = pool.metadata.name.as_deref().unwrap_or_default();
        let ip = address_of(pool, offset).map_or_else(|| format!("offset {offset}"), |ip| ip.to_string());
        match reclaim(&self.store, pool, offset, held, &Budget::new(STEP_BUDGET)).await {
            Ok(Reclaimed::Released) => {
                self.tally.released(reason);
                tracing::info!(pool = %pool_name, %ip, podref = %held.podref, reason = reason.as_str(), "released");
                let note = format!("released {ip} (pool {pool_name}, interface {}): {}", held.ifname, reason.as_str());
                self.tell(held, false, "AddressReleased", note).await;
                Considered::Released(reason)
            }
            Ok(Reclaimed::Changed) => {
                self.tally.changed();
                tracing::debug!(pool = %pool_name, %ip, podref = %held.podref, "entry changed in between; left alone");
                Considered::Changed
            }
            Err(e) => {
                self.tally.failed();
                tracing::error!(pool = %pool_name, %ip, podref = %held.podref, error = %e, "release failed");
                self.tell(held, true, "AddressReleaseFailed", format!("{ip}: {e}")).await;
                Considered::Failed
            }
        }
    }

    /// Puts back the reservation of the live entry `held` at `offset` of `pool`, which records one but has none
    /// (Whereabouts' DEL deletes reservations by name; a fault may have lost one), or reports the other pod that
    /// holds it. Returns whether it is fine now.
    pub async fn restore(&self, pool: &IpPool, offset: u128, held: &IpAllocation) -> bool {
        let Some(name) = reservation_of(pool, offset) else { return true };
        let budget = Budget::new(STEP_BUDGET);
        match restore_reservation(&self.store, &name, held, &budget).await {
            Ok(Restored::Present) => true,
            Ok(Restored::Created) => {
                // The entry may have gone in between (a DEL): then the restored claim is an orphan, released now.
                if !self.entry_still_there(pool, offset, held).await
                    && let Ok(Some(created)) = self.store.get_reservation(&name).await
                    && created.spec.podref == held.podref
                {
                    let _ = release_orphan(&self.store, &created, &budget).await;
                    return true;
                }
                self.tally.restored();
                tracing::warn!(reservation = %name, podref = %held.podref, "restored the missing reservation of a live entry");
                let note = format!("the reservation {name} of this pod's address was missing and is restored");
                self.tell(held, true, "ReservationRestored", note).await;
                true
            }
            Ok(Restored::Conflict(other)) => {
                self.conflict(&name, &[held.podref.as_str(), other.podref.as_str()]).await;
                false
            }
            Err(e) => {
                tracing::error!(reservation = %name, error = %e, "restoring the reservation failed");
                false
            }
        }
    }

    async fn entry_still_there(&self, pool: &IpPool, offset: u128, held: &IpAllocation) -> bool {
        let name = pool.metadata.name.as_deref().unwrap_or_default();
        match self.store.get_pool(name).await {
            Ok(Some(fresh)) => fresh.spec.allocations.get(&offset.to_string()).is_some_and(|a| a.id == held.id),
            Ok(None) => false,
            // cannot tell: keep the claim, the next pass decides
            Err(_) => true,
        }
    }

    /// Reports an address held by several pods (Event on each, and the metric): the rules cannot tell which is
    /// right, so both are kept and an operator decides.
    pub async fn conflict(&self, reservation: &str, pods: &[&str]) {
        self.tally.conflict();
        tracing::error!(%reservation, pods = ?pods, "address held by more than one pod");
        let note = format!("address {reservation} is held by more than one pod: {}", pods.join(", "));
        for pod in pods {
            self.cluster
                .publish(pod, None, Notice { warning: true, reason: "AddressConflict", note: note.clone() })
                .await;
        }
    }

    /// Judges the reservation `listed` against `index` (the pools as listed after it), and releases it if it is
    /// an orphan — after reading it and the pools that could account for it again, in that order, and deleting
    /// it only at the version just read: an ADD that claims it in between changes that version.
    pub async fn consider_reservation(
        &self,
        listed: &OverlappingRangeIpReservation,
        index: &Index,
    ) -> ReservationOutcome {
        let name = listed.metadata.name.clone().unwrap_or_default();
        let pools = index.pools_for(&name);
        let verdict = |reservation: &OverlappingRangeIpReservation, index: &Index| {
            judge_reservation(
                &reservation.spec,
                claimed_at(reservation),
                index.holders(&name),
                index.knows(&name),
                crate::clock::now(),
                self.orphan_age,
            )
        };
        match verdict(listed, index) {
            ReservationVerdict::Release => {}
            ReservationVerdict::Keep(KeepReservation::Fresh) => return ReservationOutcome::Fresh,
            // conflicts are reported from the entries' side
            kept @ (ReservationVerdict::Keep(_) | ReservationVerdict::Conflict(_)) => {
                tracing::debug!(reservation = %name, verdict = ?kept, "reservation kept");
                return ReservationOutcome::Kept;
            }
        }
        let fresh = match self.reread(&name, &pools).await {
            Ok(Some(fresh)) => fresh,
            Ok(None) => return ReservationOutcome::Kept,
            Err(e) => {
                tracing::warn!(reservation = %name, error = %e, "cannot re-read; keeping the reservation");
                return ReservationOutcome::Failed;
            }
        };
        let (reservation, index) = fresh;
        match verdict(&reservation, &index) {
            ReservationVerdict::Release => {}
            ReservationVerdict::Keep(KeepReservation::Fresh) => return ReservationOutcome::Fresh,
            _ => return ReservationOutcome::Kept,
        }
        match release_orphan(&self.store, &reservation, &Budget::new(STEP_BUDGET)).await {
            Ok(true) => {
                self.tally.orphan_released();
                self.tally.released(Reason::Orphaned);
                tracing::info!(reservation = %name, podref = %reservation.spec.podref, "released an orphaned reservation");
                ReservationOutcome::Released
            }
            Ok(false) => ReservationOutcome::Kept,
            Err(e) => {
                tracing::error!(reservation = %name, error = %e, "releasing the orphaned reservation failed");
                ReservationOutcome::Failed
            }
        }
    }

    /// The reservation `name`, then the pools `pools`, as the API server has them now.
    async fn reread(
        &self,
        name: &str,
        pools: &[String],
    ) -> Result<Option<(OverlappingRangeIpReservation, Index)>, StoreError> {
        let Some(reservation) = self.store.get_reservation(name).await? else { return Ok(None) };
        let mut fresh = Vec::with_capacity(pools.len());
        for pool in pools {
            if let Some(pool) = self.store.get_pool(pool).await? {
                fresh.push(pool);
            }
        }
        let listings = self.store.list_node_slices().await?;
        understand(&mut fresh, &listings);
        Ok(Some((reservation, Index::new(&fresh).with_node_slices(&listings))))
    }

    async fn tell(&self, held: &IpAllocation, warning: bool, reason: &'static str, note: String) {
        self.cluster.publish(&held.podref, held.poduid.as_deref(), Notice { warning, reason, note }).await;
    }
}

/// Every entry of every pool in `pools` that `wanted` selects, with its offset.
pub fn entries<'a>(
    pools: impl IntoIterator<Item = &'a IpPool>,
    wanted: impl Fn(&IpAllocation) -> bool,
) -> Vec<(&'a IpPool, u128, &'a IpAllocation)> {
    let mut found = Vec::new();
    for pool in pools {
        for (key, held) in &pool.spec.allocations {
            if let (true, Ok(offset)) = (wanted(held), key.parse()) {
                found.push((pool, offset, held));
            }
        }
    }
    found
}
