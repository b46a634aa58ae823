//! What one ADD set out to write, so that a failure half-way can take it back.
//!
//! A write is recorded *before* it is sent: a write whose answer never came may have been applied, so the
//! roll-back must consider it. Every undo is guarded (an entry is removed only if it still holds our container, a
//! reservation deleted only if it is still our claim), so undoing a write that never happened, or one that
//! someone else has since replaced, changes nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use super::reservation::release_if_ours;
use crate::budget::Budget;
use crate::crd::{IpAllocation, IpPool};
use crate::error::IpamError;
use crate::store::{Patched, PoolStore, ReservationStore, StoreError};
use crate::{clock, cooldown};

/// Extra time a roll-back may take when the invocation's own budget has run out: leaving an address claimed by a
/// failed ADD would block it until the reconciler notices.
pub const ROLLBACK_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub(crate) enum Written {
    Allocation { pool: String, offset: u128, entry: Box<IpAllocation>, reservation: Option<String> },
    Reservation { name: String, podref: String, container: String },
}

#[derive(Debug, Default)]
pub(crate) struct Journal(Vec<Written>);

impl Journal {
    pub(crate) fn record(&mut self, written: Written) {
        self.0.push(written);
    }

    /// Takes over what `other` wrote (a candidate range that gave its address).
    pub(crate) fn extend(&mut self, other: Journal) {
        self.0.extend(other.0);
    }

    /// Forgets a reservation that turned out not to be ours to undo (another attachment's).
    pub(crate) fn forget_reservation(&mut self, forgotten: &str) {
        self.0.retain(|w| !matches!(w, Written::Reservation { name, .. } if name == forgotten));
    }

    /// Forgets the entry at `offset` of `pool`: it turned out to be another writer's.
    pub(crate) fn forget_allocation(&mut self, of_pool: &str, at: u128) {
        self.0.retain(|w| !matches!(w, Written::Allocation { pool, offset, .. } if pool == of_pool && *offset == at));
    }

    /// Where this journal's writes put entries of `container`, newest first: candidates, not facts (a write whose
    /// answer was lost may not have been applied, and a claim that lost its offset moved on).
    pub(crate) fn entries_of<'a>(&'a self, container: &'a str) -> impl Iterator<Item = (&'a str, u128)> + 'a {
        self.0.iter().rev().filter_map(move |w| match w {
            Written::Allocation { pool, offset, entry, .. } if entry.id == container => Some((pool.as_str(), *offset)),
            _ => None,
        })
    }

    /// The reservation this journal's write at `offset` of `pool` went with, if any.
    pub(crate) fn reservation_of(&self, of_pool: &str, at: u128) -> Option<String> {
        self.0.iter().rev().find_map(|w| match w {
            Written::Allocation { pool, offset, reservation, .. } if pool == of_pool && *offset == at => {
                reservation.clone()
            }
            _ => None,
        })
    }

    /// Undoes every write, newest first. A reservation is never given back while an entry it guards could not
    /// be removed: an entry without its reservation is how an address ends up held twice. Keeps going after an
    /// error and returns them all.
    pub(crate) async fn roll_back(
        self,
        store: &(impl PoolStore + ReservationStore),
        budget: &Budget,
    ) -> Vec<IpamError> {
        let budget = if budget.remaining() < ROLLBACK_GRACE { Budget::new(ROLLBACK_GRACE) } else { *budget };
        let mut errors = Vec::new();
        let mut pinned = BTreeSet::new();
        for written in self.0.into_iter().rev() {
            let result = match &written {
                Written::Allocation { pool, offset, entry, reservation } => {
                    let removed = remove_entry(store, pool, *offset, entry, None, &budget).await.map(drop);
                    if removed.is_err()
                        && let Some(name) = reservation
                    {
                        pinned.insert(name.clone());
                    }
                    removed
                }
                Written::Reservation { name, .. } if pinned.contains(name) => {
                    tracing::warn!(reservation = %name, "kept: the entry it guards could not be rolled back");
                    Ok(())
                }
                Written::Reservation { name, podref, container } => {
                    release_if_ours(store, name, podref, container, &budget).await.map(drop)
                }
            };
            match result {
                Ok(()) => tracing::debug!(?written, "rolled back"),
                Err(e) => errors.push(e),
            }
        }
        errors
    }
}

/// What removing an entry came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removed {
    /// It was ours and is gone.
    Removed,
    /// It is gone, or another holder's now: nothing of ours is left there (a removal of ours whose answer was
    /// lost looks like this too).
    NotThere,
}

/// Removes the entry at `offset` of `pool` if it still holds `entry`'s container. An entry that is gone or that
/// another writer holds now is not ours to remove: done. A refusal with our entry still there is an error.
///
/// `read` is the pool as the caller read it, for a release that keeps a reuse cooldown's books (the record is
/// written in the same patch); `None` for a roll-back, whose address no pod was ever told. A patch refused only
/// because another releaser pruned or renewed a record first is made again from the pool as read then.
pub(crate) async fn remove_entry(
    store: &impl PoolStore,
    pool: &str,
    offset: u128,
    entry: &IpAllocation,
    read: Option<&IpPool>,
    budget: &Budget,
) -> Result<Removed, IpamError> {
    let mut record = read.and_then(|p| cooldown::release_record(p, offset, clock::now()));
    let mut attempt = 0;
    loop {
        let outcome = budget
            .retry(StoreError::is_transient, || store.remove_allocation(pool, offset, entry, record.as_ref()))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {pool}: remove allocation {offset}"), e))?;
        let message = match outcome {
            Patched::Applied => return Ok(Removed::Removed),
            Patched::Missing => return Ok(Removed::NotThere),
            Patched::Refused(message) => message,
        };
        let current = budget
            .retry(StoreError::is_transient, || store.get_pool(pool))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {pool}: get"), e))?;
        let still_ours = current.as_ref().is_some_and(|p| crate::store::guard::still_holds(p, offset, entry));
        if !still_ours {
            return Ok(Removed::NotThere);
        }
        if record.is_some() && current.as_ref().is_some_and(|p| p.spec.released.is_none()) {
            // the map was made (or read) and is gone: the schema prunes it, and a record can never be written.
            // The entry is not kept hostage to it: released without, the cooldown not kept.
            tracing::warn!(
                pool,
                offset,
                crd = crate::crd::drift::IPPOOLS_CRD,
                "the installed schema prunes spec.released: released without its cooldown record; apply hereabouts' \
                 CRDs (kubectl apply -f crds/)"
            );
            record = None;
            continue;
        }
        attempt += 1;
        if record.is_none() || attempt > RECORD_RETRIES {
            return Err(IpamError::Refused { what: format!("pool {pool}: remove allocation {offset}"), message });
        }
        record = current.as_ref().and_then(|p| cooldown::release_record(p, offset, clock::now()));
    }
}

/// How many times a release is made again after a cooldown record it pruned changed under it.
const RECORD_RETRIES: u32 = 4;

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    use super::*;
    use crate::store::{MemoryStore, NewPool};

    /// A release refused only because another releaser renewed a record it meant to prune (the entry still ours) is
    /// made again and removes the entry: not taken for "gone", which would leave it behind while the DEL says done.
    #[tokio::test]
    async fn a_release_refused_over_a_renewed_record_is_made_again() {
        let store = MemoryStore::new("ns");
        let mut pool = NewPool::new("p", "198.18.0.0/29", 6).object();
        pool.metadata.annotations.get_or_insert_default().insert(cooldown::COOLDOWN_ANNOTATION.into(), "60".into());
        let entry =
            IpAllocation { id: "c1".into(), podref: "ns/a".into(), ifname: "net1".into(), ..Default::default() };
        pool.spec.allocations.insert("1".into(), entry.clone());
        let ago = |secs: i64| (Timestamp::now() - SignedDuration::from_secs(secs)).to_string();
        pool.spec.released = Some([("3".to_string(), ago(600))].into());
        store.put_pool(pool.clone());
        let read = pool.clone();
        // offset 3 released again after the read: its record is new, and this release's prune of it is refused
        pool.spec.released = Some([("3".to_string(), ago(1))].into());
        store.put_pool(pool);
        let budget = Budget::new(Duration::from_secs(5));
        assert_eq!(remove_entry(&store, "p", 1, &entry, Some(&read), &budget).await.unwrap(), Removed::Removed);
        let after = store.pools().remove(0);
        assert!(after.spec.allocations.is_empty(), "{after:?}");
        assert!(after.spec.released.unwrap().contains_key("3"), "the renewed record stays");
    }
}
