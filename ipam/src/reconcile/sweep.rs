//! One full pass over the namespace — what the leader reconciler runs on its schedule and `kubectl hereabouts
//! ipam check --repair` runs once: entries whose pod is gone (re-read from the API server right before), live
//! entries whose reservation is missing (put back) or held by another pod (reported), and reservations no entry
//! accounts for once older than any ADD runs (released); then the live entries of pools a changed config replaced
//! move into the pool that replaced them, and the empty replaced pools go.

use std::collections::HashMap;

use super::cluster::Cluster;
use super::releaser::{Considered, Releaser, ReservationOutcome, Tally, Views, entries};
use super::rules::{EntryClaim, Index, Keep, entry_claim};
use crate::claim::{reservations_of, understand};
use crate::store::{PoolStore, ReservationStore, SliceStore, StoreError};

/// What one run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub released: usize,
    pub reservations_released: usize,
    pub restored: usize,
    pub conflicts: usize,
    pub kept: usize,
    /// Entries of pools a changed config replaced, moved into the pool that replaced them.
    pub entries_moved: usize,
    /// Empty pools a changed range left behind, deleted.
    pub pools_retired: usize,
}

/// One full pass over every pool and reservation of the namespace.
pub async fn reconcile_once<S, C, T>(releaser: &Releaser<S, C, T>) -> Result<Summary, StoreError>
where
    S: PoolStore + ReservationStore + SliceStore,
    C: Cluster,
    T: Tally,
{
    // Reservations first, pools after: an orphan candidate is then one that no entry written up to the pool read
    // accounts for (and it is read again before it goes).
    let reservations = releaser.store.list_reservations(None).await?;
    let mut pools = releaser.store.list_pools().await?;
    // after the pools: a slice pool Whereabouts made is read with the NodeSlicePool that lists its slice
    let listings = releaser.store.list_node_slices().await?;
    understand(&mut pools, &listings);
    let listed: HashMap<&str, _> =
        reservations.iter().map(|r| (r.metadata.name.as_deref().unwrap_or_default(), &r.spec)).collect();
    let mut views = Views::new();
    let mut summary = Summary::default();
    for (pool, offset, held) in entries(&pools, |_| true) {
        match releaser.consider(pool, offset, held, None, &mut views).await {
            Considered::Released(_) => summary.released += 1,
            // a sticky or IPAMClaim entry keeps its reservation too: the address stays claimed for the next pod
            Considered::Kept(Keep::Live | Keep::Sticky | Keep::Claimed) => {
                summary.kept += 1;
                // under any of its names: an entry the fork wrote has the fork's reservation
                let listed_claim =
                    reservations_of(pool, offset).into_iter().find_map(|n| listed.get(n.as_str()).copied());
                let claim = entry_claim(held, listed_claim);
                match claim {
                    EntryClaim::Fine => {}
                    EntryClaim::Missing | EntryClaim::Conflict(_) => {
                        // restore re-reads, so a reservation created since the list is found, not duplicated
                        if releaser.restore(pool, offset, held).await {
                            summary.restored += usize::from(claim == EntryClaim::Missing);
                        } else {
                            summary.conflicts += 1;
                        }
                    }
                }
            }
            Considered::Kept(_) | Considered::Changed | Considered::Failed => summary.kept += 1,
        }
    }
    let index = Index::new(&pools).with_node_slices(&listings);
    let doubly = index.doubly_held();
    for (name, pods) in &doubly {
        releaser.conflict(name, &pods.iter().copied().collect::<Vec<_>>()).await;
    }
    summary.conflicts += doubly.len();
    releaser.tally.conflicts_now(summary.conflicts);
    for reservation in &reservations {
        if releaser.consider_reservation(reservation, &index).await == ReservationOutcome::Released {
            summary.reservations_released += 1;
        }
    }
    // entries of replaced pools move on a fresh list: this pass may have released some of them
    let now = crate::clock::now();
    // older than any ADD runs, as an orphaned reservation must be: no ADD under the config it replaced is left
    let settle = releaser.orphan_age;
    if !super::relayout::plan(&pools, now, settle).moves.is_empty() {
        match releaser.store.list_pools().await {
            Ok(fresh) => {
                summary.entries_moved = super::relayout::move_replaced(&releaser.store, &fresh, now, settle).await.moved
            }
            Err(e) => tracing::warn!(error = %e, "replaced pools' entries not moved this pass"),
        }
    }
    // on the pools as listed: one emptied by this pass goes on the next
    summary.pools_retired =
        super::retire::retire_replaced(&releaser.store, &pools, now, settle).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "replaced pools not retired this pass");
            0
        });
    Ok(summary)
}
