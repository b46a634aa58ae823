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

/// The variable that makes this process's own clock run ahead (negative: behind) by that many seconds: how the
/// tests give a process the wrong clock a machine can have. Nothing else sets it.
pub const SKEW_FOR_TESTS: &str = "HEREABOUTS_CLOCK_SKEW_FOR_TESTS";

/// Now.
pub fn now() -> Timestamp {
    let local = local();
    local.saturating_add(SignedDuration::from_millis(OFFSET_MS.load(Ordering::Relaxed))).unwrap_or(local)
}

/// This machine's clock, without [`set_offset`]'s offset.
fn local() -> Timestamp {
    static SKEW: OnceLock<SignedDuration> = OnceLock::new();
    let skew = *SKEW.get_or_init(|| {
        let seconds = std::env::var(SKEW_FOR_TESTS).ok().and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        SignedDuration::from_secs(seconds)
    });
    let local = match TOKIO_BASE.get() {
        None => Timestamp::now(),
        Some((at, instant)) => {
            let elapsed = tokio::time::Instant::now().into_std().saturating_duration_since(*instant);
            *at + SignedDuration::try_from(elapsed).unwrap_or(SignedDuration::MAX)
        }
    };
    local.saturating_add(skew).unwrap_or(local)
}

/// From now on, for the whole process, [`now`] is this machine's clock moved by `offset`: set to the API server's
/// time less this machine's ([`server_skew`]), the ages judged are the ones the cluster sees.
pub fn set_offset(offset: SignedDuration) {
    OFFSET_MS.store(i64::try_from(offset.as_millis()).unwrap_or(0), Ordering::Relaxed);
}

/// Why the API server's time could not be told.
#[derive(Debug, thiserror::Error)]
pub enum SkewError {
    /// The request failed.
    #[error("GET /version (for the API server's time): {0}")]
    Request(#[source] kube::Error),
    /// The answer carried no usable `Date`.
    #[error("the API server's answer has no usable Date header ({0}): its time cannot be told")]
    Date(String),
}

/// The API server's time less this machine's (without [`set_offset`]'s offset), from the `Date` of an answer
/// (one-second resolution, taken at its start), measured at the middle of the request.
pub async fn server_skew(client: &kube::Client) -> Result<SignedDuration, SkewError> {
    let request = http::Request::get("/version").body(Vec::new()).expect("a GET of a fixed path builds");
    let sent = local();
    let answer = client.send(request.map(Into::into)).await.map_err(SkewError::Request)?;
    let received = local();
    let date = answer.headers().get(http::header::DATE).and_then(|d| d.to_str().ok());
    let date = date.ok_or_else(|| SkewError::Date("none".into()))?;
    let server = k8s_openapi::jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(date)
        .map_err(|e| SkewError::Date(format!("{date:?}: {e}")))?;
    let middle =
        sent + SignedDuration::from_nanos(i64::try_from(received.duration_since(sent).as_nanos() / 2).unwrap_or(0));
    // the Date is the second the answer was made in, truncated: its start judges every age up to a second younger
    // than it is, never older, so a grace or an orphan age is never cut short by the header's resolution
    Ok(server.duration_since(middle))
}

/// From now on, for the whole process, [`now`] advances with tokio's clock (paused or not) instead of the system
/// clock. For tests only.
pub fn follow_tokio_time() {
    TOKIO_BASE.get_or_init(|| (Timestamp::now(), std::time::Instant::now()));
}
