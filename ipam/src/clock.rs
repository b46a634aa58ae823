//! The wall clock the protocol stamps and judges times by (`allocated`, a reservation's claim time, ages).
//!
//! In production it is the system clock. Property tests run on tokio's paused clock, which jumps over every
//! backoff; [`follow_tokio_time`] makes this clock follow it, so that ages measured in those tests are the ages
//! the protocol would see.

use std::sync::OnceLock;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

static TOKIO_BASE: OnceLock<(Timestamp, std::time::Instant)> = OnceLock::new();

/// Now.
pub fn now() -> Timestamp {
    match TOKIO_BASE.get() {
        None => Timestamp::now(),
        Some((at, instant)) => {
            let elapsed = tokio::time::Instant::now().into_std().saturating_duration_since(*instant);
            *at + SignedDuration::try_from(elapsed).unwrap_or(SignedDuration::MAX)
        }
    }
}

/// From now on, for the whole process, [`now`] advances with tokio's clock (paused or not) instead of the system
/// clock. For tests only.
pub fn follow_tokio_time() {
    TOKIO_BASE.get_or_init(|| (Timestamp::now(), std::time::Instant::now()));
}
