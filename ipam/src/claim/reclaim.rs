//! What the reconciler does to the store: give back an entry it judged stale, put back the reservation of a live
//! entry that lost it, and delete a reservation no entry accounts for. The pool object alone says which range and
//! network an entry belongs to, so no network config is needed. The judging is the reconciler's; these only
//! write, guarded so that nothing changed since the judgement is touched.

use super::journal::{Removed, remove_entry};
use super::reservation::release_if_ours;
use crate::budget::Budget;
use crate::crd::{
    IpAllocation, IpPool, NodeSlicePool, OverlappingRangeIpReservation, OverlappingRangeIpReservationSpec,
};
use crate::error::IpamError;
use crate::names;
use crate::range::IpRange;
use crate::store::{Claim, Created, Deleted, PoolStore, ReservationStore, StoreError, Version};

/// What reclaiming one entry did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaimed {
    /// The entry was still the one judged stale, and is gone (with its reservation).
    Released,
    /// The entry changed or vanished in between (a new ADD took it over, or a DEL got there first): left alone.
    Changed,
}

/// The range of `pool` and the network its name says it belongs to, if both can be read.
pub fn pool_scope(pool: &IpPool) -> Option<(IpRange, String)> {
    // every address of it: a pool of a range with `enable_l3` (a /31, a /32) holds its network address too
    let range = IpRange::parse_as(&pool.spec.range, None, None, &[], crate::range::Hosts::All).ok()?;
    let name = pool.metadata.name.as_deref()?;
    // what hereabouts wrote when it made the pool, if its name agrees; else what the name says
    let annotated = pool.metadata.annotations.as_ref().and_then(|a| a.get(crate::store::NETWORK_ANNOTATION));
    if let Some(network) = annotated.filter(|n| n.is_empty() || name.starts_with(&format!("{n}-"))) {
        return Some((range, network.clone()));
    }
    let network = names::network_of_pool(name, range.cidr())?;
    Some((range, network))
}

/// Fills in, on the copies read, the network of each slice pool that does not carry hereabouts' network annotation
/// (Whereabouts' CNI made it), as the NodeSlicePools `node_slices` say. By its name alone, the slice pool
/// `<network>-<node>-<slice>` reads as the whole-range pool of a network `<network>-<node>`: its entries' releases
/// would look for reservations that do not exist, and leave the real ones for good.
///
/// A NodeSlicePool is named after the network (or, for an unnamed network, after its config), and lists the slice:
/// a pool of that slice named `<that name>-<node>-<slice>` is the named network's; one named `<owner>-<slice>`,
/// for the slice's owner, the unnamed network's.
pub fn understand(pools: &mut [IpPool], node_slices: &[NodeSlicePool]) {
    for pool in pools {
        let annotations = pool.metadata.annotations.get_or_insert_with(Default::default);
        if annotations.contains_key(crate::store::NETWORK_ANNOTATION) {
            continue;
        }
        let (Some(name), Ok(cidr)) = (pool.metadata.name.as_deref(), pool.spec.range.parse::<ipnet::IpNet>()) else {
            continue;
        };
        let cidr = cidr.trunc();
        let network = node_slices.iter().find_map(|listing| {
            let slice = crate::slices::slices_of(listing).into_iter().find(|s| s.cidr == cidr)?;
            let listing_name = listing.metadata.name.as_deref()?;
            if names::node_of_slice_pool(name, listing_name, cidr).is_some() {
                return Some(listing_name.to_string());
            }
            (names::node_of_slice_pool(name, "", cidr) == Some(slice.node.as_str())).then(String::new)
        });
        if let Some(network) = network {
            annotations.insert(crate::store::NETWORK_ANNOTATION.to_string(), network);
        }
    }
}

/// The name of the reservation that guards the entry at `offset` of `pool`, if the pool's name and range say.
pub fn reservation_of(pool: &IpPool, offset: u128) -> Option<String> {
    reservations_of(pool, offset).into_iter().next()
}

/// Every name the reservation guarding the entry at `offset` of `pool` may have ([`names::reservation_names`]),
/// hereabouts' first; empty when the pool's name and range do not say.
pub fn reservations_of(pool: &IpPool, offset: u128) -> Vec<String> {
    let Some((range, network)) = pool_scope(pool) else { return Vec::new() };
    range.checked_addr_at(offset).map(|ip| names::reservation_names(&network, ip)).unwrap_or_default()
}

/// Removes the entry `held` at `offset` of `pool` (only if it is still exactly that holder) and then its
/// reservation, if that is still the entry's.
pub async fn reclaim(
    store: &(impl PoolStore + ReservationStore),
    pool: &IpPool,
    offset: u128,
    held: &IpAllocation,
    budget: &Budget,
) -> Result<Reclaimed, IpamError> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    if remove_entry(store, &name, offset, held, Some(pool), budget).await? == Removed::NotThere {
        return Ok(Reclaimed::Changed);
    }
    for reservation in reservations_of(pool, offset) {
        release_if_ours(store, &reservation, &held.podref, &held.id, budget).await?;
    }
    Ok(Reclaimed::Released)
}

/// The address at `offset` of `pool`, if its range parses and the offset lies in it.
pub fn address_of(pool: &IpPool, offset: u128) -> Option<std::net::IpAddr> {
    IpRange::parse(&pool.spec.range, None, None, &[]).ok()?.checked_addr_at(offset)
}

/// What putting back a live entry's reservation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restored {
    /// The reservation was missing and is back.
    Created,
    /// The entry's pod holds it already.
    Present,
    /// Another pod holds it: the address is held by two attachments.
    Conflict(OverlappingRangeIpReservationSpec),
}

/// Makes sure the reservation `name` exists for the entry `held`: re-creates it when it is missing (Whereabouts'
/// DEL deletes reservations by name, a fault may have lost it), and reports who holds it otherwise.
pub async fn restore_reservation(
    store: &impl ReservationStore,
    name: &str,
    held: &IpAllocation,
    budget: &Budget,
) -> Result<Restored, IpamError> {
    let claim = Claim {
        spec: OverlappingRangeIpReservationSpec {
            containerid: held.id.clone(),
            ifname: held.ifname.clone(),
            podref: held.podref.clone(),
            ipamclaim: held.ipamclaim.clone(),
        },
        node: held.node.clone().unwrap_or_default(),
        at: crate::clock::now(),
    };
    let mut attempt = 0;
    loop {
        budget.pause(attempt).await.map_err(|_| IpamError::Expired(format!("reservation {name}: restore")))?;
        attempt += 1;
        let current = budget
            .retry(StoreError::is_transient, || store.get_reservation(name))
            .await
            .map_err(|e| IpamError::from_retry(&format!("reservation {name}: get"), e))?;
        if let Some(current) = current {
            return Ok(if current.spec.podref == held.podref {
                Restored::Present
            } else {
                Restored::Conflict(current.spec)
            });
        }
        let created = budget
            .retry(StoreError::is_transient, || store.create_reservation(name, &claim))
            .await
            .map_err(|e| IpamError::from_retry(&format!("reservation {name}: create"), e))?;
        if let Created::Created(_) = created {
            return Ok(Restored::Created);
        }
    }
}

/// Deletes `reservation` if it is still exactly as read (its resourceVersion): the caller read it, then read the
/// pools and found no entry accounting for it. An ADD that takes it over in between changes its version, so the
/// delete fails and the claim stays.
pub async fn release_orphan(
    store: &impl ReservationStore,
    reservation: &OverlappingRangeIpReservation,
    budget: &Budget,
) -> Result<bool, IpamError> {
    let name = reservation.metadata.name.clone().unwrap_or_default();
    let version = Version::of(reservation);
    let deleted = budget
        .retry(StoreError::is_transient, || store.delete_reservation(&name, &version))
        .await
        .map_err(|e| IpamError::from_retry(&format!("reservation {name}: delete"), e))?;
    Ok(deleted == Deleted::Deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{IpPoolSpec, NodeSliceAllocation, NodeSlicePoolSpec};

    fn whereabouts_pool(name: &str, range: &str) -> IpPool {
        IpPool::new(name, IpPoolSpec { range: range.into(), ..IpPoolSpec::default() })
    }

    fn listing(name: &str, range: &str, slices: &[(&str, &str)]) -> NodeSlicePool {
        let spec = NodeSlicePoolSpec { range: range.into(), slice_size: "27".into() };
        let slices: Vec<NodeSliceAllocation> = slices
            .iter()
            .map(|(node, slice)| NodeSliceAllocation { node_name: node.to_string(), slice_range: slice.to_string() })
            .collect();
        crate::store::node_slices_object(name, &spec, &slices)
    }

    #[test]
    fn a_slice_pool_whereabouts_made_is_read_as_its_node_slice_pools_network() {
        let listings = [
            listing("slnet", "198.18.32.0/23", &[("node-5", "198.18.32.64/27"), ("node-6", "198.18.32.96/27")]),
            listing("unnamed-conf", "198.18.40.0/24", &[("node-1", "198.18.40.0/27")]),
        ];
        let mut pools = [
            whereabouts_pool("slnet-node-6-198.18.32.96-27", "198.18.32.96/27"),
            whereabouts_pool("node-1-198.18.40.0-27", "198.18.40.0/27"),
            // a whole-range pool of another network: no NodeSlicePool lists its range as a slice
            whereabouts_pool("other-198.18.50.0-27", "198.18.50.0/27"),
        ];
        assert_eq!(reservation_of(&pools[0], 1).as_deref(), Some("slnet-node-6-198.18.32.97"), "misread by name");
        understand(&mut pools, &listings);
        assert_eq!(reservation_of(&pools[0], 1).as_deref(), Some("slnet-198.18.32.97"));
        assert_eq!(reservation_of(&pools[1], 1).as_deref(), Some("198.18.40.1"), "the unnamed network's");
        assert_eq!(reservation_of(&pools[2], 1).as_deref(), Some("other-198.18.50.1"));
        // hereabouts' annotation is never overridden
        let mut ours = whereabouts_pool("slnet-node-6-198.18.32.96-27", "198.18.32.96/27");
        ours.metadata.annotations = Some([(crate::store::NETWORK_ANNOTATION.to_string(), "slnet".into())].into());
        understand(std::slice::from_mut(&mut ours), &[]);
        assert_eq!(reservation_of(&ours, 1).as_deref(), Some("slnet-198.18.32.97"));
    }
}
