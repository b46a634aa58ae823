//! One bounded time budget per invocation (DESIGN §5): every API call and every retry fits inside it.

use std::future::Future;
use std::time::{Duration, Instant};

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

    /// What is left of the budget (zero once it has run out).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether the budget has run out.
    pub fn expired(&self) -> bool {
        self.remaining().is_zero()
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
            .without_max_times();
        let budget = *self;
        let attempt = op.retry(backoff).when(|e| transient(e) && !budget.expired());
        match self.run(attempt).await {
            Ok(result) => result.map_err(RetryError::Failed),
            Err(Expired) => Err(RetryError::Expired),
        }
    }
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
