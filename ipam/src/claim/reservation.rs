//! The cluster-wide claim on one address: claiming it for an attachment (create, or take over the claim of an
//! earlier sandbox of the same attachment) and giving it back (only when it is the releaser's own).
//!
//! Every outcome that is not a clear answer is resolved by reading the reservation again: a create whose answer
//! was lost finds the reservation ours on the read, a take-over that raced another writer finds it changed.

use super::decide::{Holder, Me, holder, is_releasable_by};
use crate::budget::Budget;
use crate::crd::{OverlappingRangeIpReservation, OverlappingRangeIpReservationSpec};
use crate::error::IpamError;
use crate::store::{Claim, Created, Deleted, Patched, ReservationStore, StoreError, Version};

/// The outcome of claiming an address cluster-wide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Claimed {
    /// The reservation is this sandbox's now.
    Ours,
    /// Another attachment holds it.
    Other(String),
}

async fn read(
    store: &impl ReservationStore,
    name: &str,
    budget: &Budget,
) -> Result<Option<OverlappingRangeIpReservation>, IpamError> {
    budget
        .retry(StoreError::is_transient, || store.get_reservation(name))
        .await
        .map_err(|e| IpamError::from_retry(&format!("reservation {name}: get"), e))
}

/// Makes the reservation of an address this sandbox's: creates the first of `names` (upstream Whereabouts' name,
/// the one hereabouts writes), or takes over the claim of an earlier sandbox of the same attachment; then makes
/// sure no other attachment holds the address under another of its `names` (the maintained fork's IPv6 form),
/// giving the claim back if one does. Returns who holds it when that is another attachment; the caller must then
/// not use the address.
pub(super) async fn claim(
    store: &impl ReservationStore,
    names: &[String],
    me: &Me<'_>,
    node: &str,
    budget: &Budget,
) -> Result<Claimed, IpamError> {
    let Some((name, others)) = names.split_first() else { return Ok(Claimed::Ours) };
    if let Claimed::Other(holder) = claim_one(store, name, me, node, budget).await? {
        return Ok(Claimed::Other(holder));
    }
    // Another tool's name is checked after ours is made: of two claims made at once, at worst both give way.
    for other in others {
        let Some(current) = read(store, other, budget).await? else { continue };
        if let Holder::Other(who) = holder(&current.spec, me) {
            tracing::info!(reservation = %other, holder = %who, "address held under another tool's name");
            release_if_ours(store, name, me.podref, me.container, budget).await?;
            return Ok(Claimed::Other(who));
        }
    }
    Ok(Claimed::Ours)
}

/// [`claim`] of the one reservation `name`.
async fn claim_one(
    store: &impl ReservationStore,
    name: &str,
    me: &Me<'_>,
    node: &str,
    budget: &Budget,
) -> Result<Claimed, IpamError> {
    let claim = Claim {
        spec: OverlappingRangeIpReservationSpec {
            containerid: me.container.to_string(),
            ifname: me.ifname.to_string(),
            podref: me.podref.to_string(),
            ipamclaim: me.claim.map(str::to_string),
        },
        node: node.to_string(),
        at: crate::clock::now(),
    };
    let mut attempt = 0;
    loop {
        budget.pause(attempt).await.map_err(|_| IpamError::Expired(format!("reservation {name}: claim")))?;
        attempt += 1;
        let created = budget
            .retry(StoreError::is_transient, || store.create_reservation(name, &claim))
            .await
            .map_err(|e| IpamError::from_retry(&format!("reservation {name}: create"), e))?;
        if let Created::Created(_) = created {
            return Ok(Claimed::Ours);
        }
        // It exists: ours (a create whose answer was lost, a retried ADD), an earlier sandbox's, or another's.
        let Some(current) = read(store, name, budget).await? else { continue };
        match holder(&current.spec, me) {
            Holder::Me => return Ok(Claimed::Ours),
            Holder::Other(who) => return Ok(Claimed::Other(who)),
            Holder::MyEarlierSandbox => {
                let outcome = budget
                    .retry(StoreError::is_transient, || store.take_over_reservation(&current, &claim))
                    .await
                    .map_err(|e| IpamError::from_retry(&format!("reservation {name}: take over"), e))?;
                if outcome == Patched::Applied {
                    tracing::info!(reservation = name, from = %current.spec.containerid, "took over the reservation of an earlier sandbox");
                    return Ok(Claimed::Ours);
                }
                // changed in between (or its answer was lost): read it again
            }
        }
    }
}

/// Deletes the reservation `name` if it is still the claim of container `container` of pod `podref` (or records
/// no container). Returns whether it deleted it; a reservation that is gone, another pod's or a later sandbox's
/// is left alone.
pub async fn release_if_ours(
    store: &impl ReservationStore,
    name: &str,
    podref: &str,
    container: &str,
    budget: &Budget,
) -> Result<bool, IpamError> {
    let mut attempt = 0;
    loop {
        budget.pause(attempt).await.map_err(|_| IpamError::Expired(format!("reservation {name}: delete")))?;
        attempt += 1;
        let Some(current) = read(store, name, budget).await? else { return Ok(false) };
        if !is_releasable_by(&current.spec, podref, container) {
            return Ok(false);
        }
        // The version read above makes the check and the delete one step: a take-over in between wins.
        let version = Version::of(&current);
        let deleted = budget
            .retry(StoreError::is_transient, || store.delete_reservation(name, &version))
            .await
            .map_err(|e| IpamError::from_retry(&format!("reservation {name}: delete"), e))?;
        match deleted {
            Deleted::Deleted => return Ok(true),
            // an earlier attempt whose answer was lost may have deleted it: the next read tells
            Deleted::Missing | Deleted::Changed => {}
        }
    }
}
