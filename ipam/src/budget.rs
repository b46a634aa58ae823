//! One bounded time budget per invocation (docs/design.md, "Budgets"): every API call and every retry fits inside it.

use std::future::Future;
use std::time::Duration;

// tokio's clock, so that tests on a paused clock see budgets run out as they would in production
use tokio::time::Instant;

use backon::{ExponentialBuilder, Retryable as _};

/// The deadline of one CNI invocation or reconcile step.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    deadline: Instant,
}

/// The budget ran out before the work was done.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("time budget of the invocation ran out")]
pub struct Expired;

impl Budget {
    /// A budget that ends `total` from now.
    pub fn new(total: Duration) -> Self {
        Self { deadline: Instant::now() + total }
    }

    /// When the budget runs out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// What is left of the budget (zero once it has run out).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether the budget has run out.
    pub fn expired(&self) -> bool {
        self.remaining().is_zero()
    }

    /// Waits before attempt `attempt` (from 0) of a loop that reads again and retries: nothing before the
    /// first, then exponentially longer with jitter, 20 ms up to 2 s, never past the deadline. Errs once the budget
    /// has run out, so that no such loop spins.
    pub async fn pause(&self, attempt: u32) -> Result<(), Expired> {
        if self.expired() {
            return Err(Expired);
        }
        if attempt == 0 {
            return Ok(());
        }
        let ceiling = Duration::from_millis(20).saturating_mul(1 << attempt.min(7)).min(Duration::from_secs(2));
        let wait = ceiling.mul_f64(0.5 + jitter() / 2.0).min(self.remaining());
        tokio::time::sleep(wait).await;
        if self.expired() { Err(Expired) } else { Ok(()) }
    }

    /// Runs `fut`, giving up when the budget runs out.
    pub async fn run<T>(&self, fut: impl Future<Output = T>) -> Result<T, Expired> {
        tokio::time::timeout(self.remaining(), fut).await.map_err(|_| Expired)
    }

    /// Calls `op` until it succeeds, fails with an error `transient` does not accept, or the budget runs out;
    /// retries back off exponentially with jitter so that writers that collided spread out.
    pub async fn retry<T, E, F, Fut>(&self, transient: impl Fn(&E) -> bool, op: F) -> Result<T, RetryError<E>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(20))
            .with_max_delay(Duration::from_secs(2))
            .with_jitter()
            .with_jitter_seed(crate::entropy::random(b"backoff"))
            .without_max_times();
        let budget = *self;
        let attempt = op.retry(backoff).when(|e| transient(e) && !budget.expired());
        match self.run(attempt).await {
            Ok(result) => result.map_err(RetryError::Failed),
            Err(Expired) => Err(RetryError::Expired),
        }
    }
}

/// A number in `0.0..1.0`, different in every call.
fn jitter() -> f64 {
    (crate::entropy::random(b"jitter") >> 11) as f64 / (1u64 << 53) as f64
}

/// Why [`Budget::retry`] gave up.
#[derive(Debug, thiserror::Error)]
pub enum RetryError<E> {
    /// The last attempt failed with an error not worth retrying (or the budget ran out right after it).
    #[error(transparent)]
    Failed(E),
    /// The budget ran out while an attempt was under way.
    #[error("time budget of the invocation ran out")]
    Expired,
}
