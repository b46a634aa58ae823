//! The cluster loop: on every tick of the schedule, the instance holding the Lease reconciles every pool of the
//! namespace — entries whose pod is gone (re-read from the API server right before), and reservations no pool
//! records whose pod is gone. Nothing younger than the grace period is touched.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use hereabouts_ipam::crd::IpPool;
use hereabouts_ipam::names;
use hereabouts_ipam::range::IpRange;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::decide::PodView;
use crate::leader::Leadership;
use crate::metrics::PoolLabels;
use crate::release::{Considered, Releaser, entries};
use crate::schedule::Schedule;

/// What one run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub released: usize,
    pub reservations_released: usize,
    pub kept: usize,
}

/// Runs until `shutdown`, reconciling on each tick while this instance is the leader.
pub async fn run(
    releaser: Arc<Releaser>,
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
            Ok(summary) => tracing::info!(
                tick = %next,
                released = summary.released,
                reservations_released = summary.reservations_released,
                kept = summary.kept,
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
pub async fn reconcile_once(releaser: &Releaser) -> Result<Summary, hereabouts_ipam::store::StoreError> {
    let pools: Vec<Arc<IpPool>> = releaser.store.list_pools().await?.into_iter().map(Arc::new).collect();
    let mut views: HashMap<String, PodView> = HashMap::new();
    let mut summary = Summary::default();
    for (pool, offset, held) in entries(&pools, |_| true) {
        match releaser.consider(pool, offset, held, None, &mut views).await {
            Considered::Released(_) => summary.released += 1,
            Considered::Kept(_) | Considered::Changed | Considered::Failed => summary.kept += 1,
        }
    }
    let pools: Vec<Arc<IpPool>> = releaser.store.list_pools().await?.into_iter().map(Arc::new).collect();
    record_pool_gauges(releaser, &pools);
    summary.reservations_released = sweep_reservations(releaser, &pools, &mut views).await?;
    Ok(summary)
}

fn record_pool_gauges(releaser: &Releaser, pools: &[Arc<IpPool>]) {
    let metrics = &releaser.health.metrics;
    for pool in pools {
        let labels = PoolLabels { pool: pool.metadata.name.clone().unwrap_or_default() };
        let size = IpRange::parse(&pool.spec.range, None, None, &[]).map_or(0, |r| r.usable_count());
        metrics.pool_size.get_or_create(&labels).set(i64::try_from(size).unwrap_or(i64::MAX));
        metrics.pool_allocated.get_or_create(&labels).set(pool.spec.allocations.len() as i64);
    }
}

/// The reservation names the pools' entries account for.
fn recorded_reservations(pools: &[Arc<IpPool>]) -> HashSet<String> {
    let mut names = HashSet::new();
    for pool in pools {
        let Ok(range) = IpRange::parse(&pool.spec.range, None, None, &[]) else { continue };
        let Some(network) = names::network_of_pool(pool.metadata.name.as_deref().unwrap_or_default(), range.cidr())
        else {
            continue;
        };
        for key in pool.spec.allocations.keys() {
            if let Some(ip) = key.parse().ok().and_then(|o| range.checked_addr_at(o)) {
                names.insert(names::reservation_name(&network, ip));
            }
        }
    }
    names
}

async fn sweep_reservations(
    releaser: &Releaser,
    pools: &[Arc<IpPool>],
    views: &mut HashMap<String, PodView>,
) -> Result<usize, hereabouts_ipam::store::StoreError> {
    let recorded = recorded_reservations(pools);
    let grace = k8s_openapi::jiff::SignedDuration::try_from(releaser.grace).unwrap_or_default();
    let mut released = 0;
    for reservation in releaser.store.list_reservations().await? {
        let name = reservation.metadata.name.clone().unwrap_or_default();
        let created = reservation.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if recorded.contains(&name) || created.is_none_or(|c| c + grace > Timestamp::now()) {
            continue;
        }
        let spec = &reservation.spec;
        let view = match views.get(&spec.podref) {
            Some(v) => v.clone(),
            None => match releaser.pod_view(&spec.podref).await {
                Ok(v) => {
                    views.insert(spec.podref.clone(), v.clone());
                    v
                }
                Err(e) => {
                    tracing::warn!(reservation = %name, error = %e, "cannot read the pod; keeping the reservation");
                    continue;
                }
            },
        };
        let gone = match view {
            PodView::Missing => true,
            PodView::Present { finished, .. } => finished,
        };
        if gone && releaser.store.release_reservation(&name, &spec.podref, &spec.containerid).await? {
            tracing::info!(reservation = %name, podref = %spec.podref, "released an orphaned reservation");
            releaser.health.metrics.reservations_released.inc();
            released += 1;
        }
    }
    Ok(released)
}
