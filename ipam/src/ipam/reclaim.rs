//! Giving back one allocation found by the reconciler: the pool object alone says which range and network it
//! belongs to, so no network config is needed.

use super::IpamError;
use crate::budget::Budget;
use crate::crd::{IpAllocation, IpPool};
use crate::names;
use crate::range::IpRange;
use crate::store::{RemoveOutcome, Store, StoreError};

/// What reclaiming one entry did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaimed {
    /// The entry was still the one judged stale, and is gone (with its reservation).
    Released,
    /// The entry changed or vanished in between (a new ADD took it over, or a DEL got there first): left alone.
    Changed,
}

/// Removes the entry `held` at `offset` of `pool` (only if it is still exactly that holder) and then its
/// reservation.
pub async fn reclaim(
    store: &Store,
    pool: &IpPool,
    offset: u128,
    held: &IpAllocation,
    budget: &Budget,
) -> Result<Reclaimed, IpamError> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let outcome = budget
        .retry(StoreError::is_transient, || store.remove_allocation(&name, offset, held))
        .await
        .map_err(|e| IpamError::from_retry(&format!("pool {name}: remove allocation {offset}"), e))?;
    if outcome != RemoveOutcome::Removed {
        return Ok(Reclaimed::Changed);
    }
    let reservation = IpRange::parse(&pool.spec.range, None, None, &[]).ok().and_then(|range| {
        let network = names::network_of_pool(&name, range.cidr())?;
        Some(names::reservation_name(&network, range.checked_addr_at(offset)?))
    });
    if let Some(reservation) = reservation {
        budget
            .retry(StoreError::is_transient, || store.release_reservation(&reservation, &held.podref, &held.id))
            .await
            .map_err(|e| IpamError::from_retry(&format!("reservation {reservation}: delete"), e))?;
    }
    Ok(Reclaimed::Released)
}

/// The address at `offset` of `pool`, if its range parses and the offset lies in it.
pub fn address_of(pool: &IpPool, offset: u128) -> Option<std::net::IpAddr> {
    IpRange::parse(&pool.spec.range, None, None, &[]).ok()?.checked_addr_at(offset)
}
