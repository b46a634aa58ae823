//! The cluster loop: on every tick of the schedule, the instance holding the Lease reconciles every pool and
//! reservation of the namespace — entries whose pod is gone (re-read from the API server right before), live
//! entries whose reservation is missing (put back) or held by another pod (reported), and reservations no entry
//! accounts for once older than any ADD runs (released).

use std::time::Instant;

use hereabouts_ipam::reconcile::{Cluster, Releaser, reconcile_once};
use hereabouts_ipam::store::Store;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::http::Health;
use crate::leader::Leadership;
use crate::schedule::Schedule;

/// Runs until `shutdown`, reconciling on each tick while this instance is the leader.
pub async fn run<S: Store, C: Cluster>(
    releaser: std::sync::Arc<Releaser<S, C, std::sync::Arc<Health>>>,
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
                entries_moved = s.entries_moved,
                pools_retired = s.pools_retired,
                "cluster reconcile done"
            ),
            Err(e) => tracing::error!(tick = %next, error = %e, "cluster reconcile failed"),
        }
        let metrics = &releaser.tally.metrics;
        metrics.reconcile_runs.inc();
        metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    }
}
