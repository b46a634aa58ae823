//! The cluster loop: on every tick of the schedule, the instance holding the Lease reconciles every pool and
//! reservation of the namespace — entries whose pod is gone (re-read from the API server right before), live
//! entries whose reservation is missing (put back) or held by another pod (reported), and reservations no entry
//! accounts for once older than any ADD runs (released).

use std::collections::HashMap;
use std::time::Instant;

use hereabouts_ipam::ipam::reservation_of;
use hereabouts_ipam::store::{Store, StoreError};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::decide::{EntryClaim, Index, Keep, entry_claim};
use crate::leader::Leadership;
use crate::release::{Considered, Releaser, ReservationOutcome, Views, entries};
use crate::schedule::Schedule;

/// What one run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub released: usize,
    pub reservations_released: usize,
    pub restored: usize,
    pub conflicts: usize,
    pub kept: usize,
}

/// Runs until `shutdown`, reconciling on each tick while this instance is the leader.
pub async fn run<S: Store, C: Cluster>(
    releaser: std::sync::Arc<Releaser<S, C>>,
    mut schedule: watch::Receiver<Schedule>,
    leadership: Leadership,
    shutdown: CancellationToken,
) {
    loop {
        let current = schedule.borrow().clone();
        let Some(next) = current.next_after(Timestamp::now()) else {
            tracing::error!(expression = %current.expression, "the schedule has no next tick");
            tokio::select! { () = shutdown.cancelled() => return, _ = schedule.changed() => continue }
        };
        let wait = Timestamp::now().duration_until(next).unsigned_abs();
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = schedule.changed() => if changed.is_err() { return } else { continue },
            () = tokio::time::sleep(wait) => {}
        }
        if !leadership.is_leader() {
            tracing::debug!(tick = %next, "not the leader; skipping the cluster reconcile");
            continue;
        }
        let started = Instant::now();
        match reconcile_once(&releaser).await {
            Ok(s) => tracing::info!(
                tick = %next,
                released = s.released,
                reservations_released = s.reservations_released,
                restored = s.restored,
                conflicts = s.conflicts,
                kept = s.kept,
                "cluster reconcile done"
            ),
            Err(e) => tracing::error!(tick = %next, error = %e, "cluster reconcile failed"),
        }
        let metrics = &releaser.health.metrics;
        metrics.reconcile_runs.inc();
        metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    }
}

/// One full pass over every pool and reservation of the namespace.
pub async fn reconcile_once<S: Store, C: Cluster>(releaser: &Releaser<S, C>) -> Result<Summary, StoreError> {
    // Reservations first, pools after: an orphan candidate is then one that no entry written up to the pool read
    // accounts for (and it is read again before it goes).
    let reservations = releaser.store.list_reservations(None).await?;
    let pools = releaser.store.list_pools().await?;
    let listed: HashMap<&str, _> =
        reservations.iter().map(|r| (r.metadata.name.as_deref().unwrap_or_default(), &r.spec)).collect();
    let mut views = Views::new();
    let mut summary = Summary::default();
    for (pool, offset, held) in entries(&pools, |_| true) {
        match releaser.consider(pool, offset, held, None, &mut views).await {
            Considered::Released(_) => summary.released += 1,
            // a sticky entry keeps its reservation too: the address stays claimed for the pod's next incarnation
            Considered::Kept(Keep::Live | Keep::Sticky) => {
                summary.kept += 1;
                let name = reservation_of(pool, offset);
                let claim = entry_claim(held, name.as_deref().and_then(|n| listed.get(n).copied()));
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
    let index = Index::new(&pools);
    let doubly = index.doubly_held();
    for (name, pods) in &doubly {
        releaser.conflict(name, &pods.iter().copied().collect::<Vec<_>>()).await;
    }
    summary.conflicts += doubly.len();
    releaser.health.metrics.conflicts.set(summary.conflicts as i64);
    for reservation in &reservations {
        if releaser.consider_reservation(reservation, &index).await == ReservationOutcome::Released {
            summary.reservations_released += 1;
        }
    }
    Ok(summary)
}
