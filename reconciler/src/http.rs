//! `/healthz`, `/readyz` and `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use hereabouts_ipam::reconcile::Tally;
use hereabouts_ipam::reconcile::rules::Reason;

use crate::metrics::Metrics;

/// What the endpoints report.
#[derive(Debug)]
pub struct Health {
    /// Set once the caches have synced and the start-up resync ran.
    pub ready: AtomicBool,
    pub metrics: Metrics,
}

/// The releases and repairs the rules make, counted in the metrics.
impl Tally for Health {
    fn released(&self, reason: Reason) {
        self.metrics.count_release(reason.as_str());
    }
    fn changed(&self) {
        self.metrics.patch_conflicts.inc();
    }
    fn failed(&self) {
        self.metrics.release_failures.inc();
    }
    fn restored(&self) {
        self.metrics.reservations_restored.inc();
    }
    fn conflict(&self) {
        self.metrics.conflicts_seen.inc();
    }
    fn orphan_released(&self) {
        self.metrics.reservations_released.inc();
    }
    fn conflicts_now(&self, count: usize) {
        self.metrics.conflicts.set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(health): State<Arc<Health>>) -> (StatusCode, &'static str) {
    if health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

async fn metrics(State(health): State<Arc<Health>>) -> ([(&'static str, &'static str); 1], String) {
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], health.metrics.render())
}

/// Binds `addr` (so a taken port fails start-up, not later) and serves until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> anyhow::Result<impl Future<Output = std::io::Result<()>>> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("listen on {addr}: {e}"))?;
    tracing::info!(%addr, "serving /healthz, /readyz, /metrics");
    Ok(axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).into_future())
}
