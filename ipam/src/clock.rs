//! The wall clock the protocol stamps and judges times by (`allocated`, a reservation's claim time, ages).
//!
//! In production it is the system clock. Property tests run on tokio's paused clock, which jumps over every
//! backoff; [`follow_tokio_time`] makes this clock follow it, so that ages measured in those tests are the ages
//! the protocol would see.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

static TOKIO_BASE: OnceLock<(Timestamp, std::time::Instant)> = OnceLock::new();

/// [`set_offset`]'s offset, in milliseconds.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Now.
pub fn now() -> Timestamp {
    let local = match TOKIO_BASE.get() {
        None => Timestamp::now(),
        Some((at, instant)) => {
            let elapsed = tokio::time::Instant::now().into_std().saturating_duration_since(*instant);
            *at + SignedDuration::try_from(elapsed).unwrap_or(SignedDuration::MAX)
        }
    };
    local.saturating_add(SignedDuration::from_millis(OFFSET_MS.load(Ordering::Relaxed))).unwrap_or(local)
}

/// From now on, for the whole process, [`now`] is this machine's clock moved by `offset`: an operator's tool sets
/// it to the API server's time less its own, so that the ages it judges are the ones the cluster sees.
pub fn set_offset(offset: SignedDuration) {
    OFFSET_MS.store(i64::try_from(offset.as_millis()).unwrap_or(0), Ordering::Relaxed);
}

/// From now on, for the whole process, [`now`] advances with tokio's clock (paused or not) instead of the system
/// clock. For tests only.
pub fn follow_tokio_time() {
    TOKIO_BASE.get_or_init(|| (Timestamp::now(), std::time::Instant::now()));
}
