//! The pool gauges, kept by the leader alone: every `--gauge-interval` it reads the namespace's pools, a few at a
//! time, and sets each pool's capacity and allocated count; a reconciler that does not lead exports none, so one
//! scrape of every node counts each pool once, and a former leader's figures do not linger. The same figures go
//! into each pool's annotations when they changed, for `kubectl get ippools`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hereabouts_ipam::crd::IpPool;

use hereabouts_ipam::store::{ALLOCATED_ANNOTATION, USABLE_ANNOTATION, capacity, guard};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

use crate::http::Health;
use crate::leader::Leadership;
use crate::metrics::{Metrics, PoolLabels};

/// Pools read per page: a page of pools near etcd's object limit is megabytes.
const PAGE: u32 = 4;

/// Sets the gauges of every pool the leader reads every `every`, until `shutdown`; clears them while it does not
/// lead.
pub async fn run(
    pools: Api<IpPool>,
    health: Arc<Health>,
    leadership: Leadership,
    every: Duration,
    shutdown: CancellationToken,
) {
    let metrics = &health.metrics;
    let mut failing = false;
    let mut exported = BTreeSet::new();
    loop {
        if !leadership.is_leader() {
            metrics.pool_size.clear();
            metrics.pool_allocated.clear();
            exported.clear();
        } else {
            match refresh(&pools, metrics).await {
                Ok(seen) => {
                    failing = false;
                    // A pool deleted since the last read stops being exported; the others were overwritten in
                    // place, so a scrape never sees a pool vanish and come back.
                    for gone in exported.difference(&seen) {
                        metrics.pool_size.remove(gone);
                        metrics.pool_allocated.remove(gone);
                    }
                    exported = seen;
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %crate::error_chain(&e), "pool gauges: listing the pools failed; retrying");
                }
                Err(_) => {}
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// Sets the gauges of every pool; the pools seen.
async fn refresh(pools: &Api<IpPool>, metrics: &Metrics) -> Result<BTreeSet<PoolLabels>, kube::Error> {
    let mut seen = BTreeSet::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = pools.list(&params).await?;
        for pool in &page.items {
            let labels = PoolLabels { pool: pool.metadata.name.clone().unwrap_or_default() };
            metrics.pool_size.get_or_create(&labels).set(i64::try_from(capacity(pool)).unwrap_or(i64::MAX));
            metrics.pool_allocated.get_or_create(&labels).set(pool.spec.allocations.len() as i64);
            write_counts(pools, pool).await;
            seen.insert(labels);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(seen),
        }
    }
}

/// Writes `pool`'s entry count and capacity into its annotations when they differ from what it shows. Best effort:
/// the table is news, the next pass writes what this one could not.
async fn write_counts(pools: &Api<IpPool>, pool: &IpPool) {
    let annotations = pool.metadata.annotations.clone().unwrap_or_default();
    let (allocated, usable) = (pool.spec.allocations.len(), capacity(pool));
    let shown = |key: &str| annotations.get(key).cloned();
    if shown(ALLOCATED_ANNOTATION) == Some(allocated.to_string())
        && shown(USABLE_ANNOTATION) == Some(usable.to_string())
    {
        return;
    }
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let patch = Patch::Merge(guard::counted(allocated, usable));
    if let Err(e) = pools.patch(name, &PatchParams::default(), &patch).await {
        tracing::debug!(pool = name, error = %e, "pool counts not written; the next pass tries again");
    }
}
