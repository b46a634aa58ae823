//! What one invocation wrote, so that a failure half-way can take it back (DESIGN §5 step 5).

use std::time::Duration;

use crate::budget::Budget;
use crate::crd::IpAllocation;
use crate::store::{Store, StoreError};

/// Extra time a roll-back may take when the invocation's own budget has run out: leaving an address claimed by a
/// failed ADD would leak it until the reconciler notices.
const ROLLBACK_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub(super) enum Written {
    Allocation { pool: String, offset: u128, held: IpAllocation },
    Reservation { name: String, podref: String, containerid: String },
}

#[derive(Debug, Default)]
pub(super) struct Journal(Vec<Written>);

impl Journal {
    pub(super) fn record(&mut self, written: Written) {
        self.0.push(written);
    }

    /// Drops the record of a reservation that was already given back.
    pub(super) fn forget_reservation(&mut self, released: &str) {
        self.0.retain(|w| !matches!(w, Written::Reservation { name, .. } if name == released));
    }

    /// Undoes every write, newest first, with guarded removals so nothing written by others is touched. Keeps
    /// going after an error and returns them all.
    pub(super) async fn roll_back(self, store: &Store, budget: &Budget) -> Vec<StoreError> {
        let budget = if budget.remaining() < ROLLBACK_GRACE { Budget::new(ROLLBACK_GRACE) } else { *budget };
        let mut errors = Vec::new();
        for written in self.0.into_iter().rev() {
            let result = match &written {
                Written::Allocation { pool, offset, held } => budget
                    .retry(StoreError::is_transient, || store.remove_allocation(pool, *offset, held))
                    .await
                    .map(drop),
                Written::Reservation { name, podref, containerid } => budget
                    .retry(StoreError::is_transient, || store.release_reservation(name, podref, containerid))
                    .await
                    .map(drop),
            };
            match result {
                Ok(()) => tracing::debug!(?written, "rolled back"),
                Err(crate::budget::RetryError::Failed(e)) => errors.push(e),
                Err(crate::budget::RetryError::Expired) => {
                    tracing::warn!(?written, "roll-back ran out of time");
                }
            }
        }
        errors
    }
}
