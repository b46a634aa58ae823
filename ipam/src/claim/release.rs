//! DEL, CHECK and GC: find an attachment's entries in each pool and release them with guarded removals, the
//! entry first and its reservation after it (a reservation never goes while the entry it guards stays).
//! Release keeps going after a failure and returns every failure, so one bad pool does not leak the others.

use std::collections::HashSet;
use std::future::Future;

use super::Scope;
use super::journal::remove_entry;
use super::reservation::release_if_ours;
use crate::budget::Budget;
use crate::crd::{IpAllocation, IpPool};
use crate::error::IpamError;
use crate::names;
use crate::range::IpRange;
use crate::request::{Attachment, Request};
use crate::store::{PoolStore, ReservationStore, StoreError};

/// One pool that may hold entries of a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Place {
    /// The pool's name.
    pub pool: String,
    /// The part of the range it holds (all of it, or one slice).
    pub range: IpRange,
    /// Whether it is the asking node's own (always, but for another node's slice).
    pub own: bool,
}

/// Where a mode keeps a range's entries: the pools DEL, CHECK and GC search.
pub(crate) trait Layout<S>: Sync {
    /// The pools that may hold entries of `range` of `scope`, `node`'s own first. Reading what lists them (a
    /// NodeSlicePool) can fail like any read.
    fn places(
        &self,
        store: &S,
        scope: &Scope<'_>,
        range: &IpRange,
        node: &str,
        budget: &Budget,
    ) -> impl Future<Output = Result<Vec<Place>, IpamError>> + Send;

    /// The object a CHECK that finds no entry for `range` names.
    fn missing_in(&self, scope: &Scope<'_>, range: &IpRange) -> String;

    /// For GC: `node`'s pools of `range` that `listed` ([`Layout::places`]) leaves out, where an entry of one of its
    /// gone sandboxes may still be. None but in slice mode.
    fn strays(
        &self,
        _store: &S,
        _scope: &Scope<'_>,
        _range: &IpRange,
        _node: &str,
        _listed: &[Place],
        _budget: &Budget,
    ) -> impl Future<Output = Result<Vec<Place>, IpamError>> + Send
    where
        S: PoolStore,
    {
        async { Ok(Vec::new()) }
    }
}

/// The pool `name`, or `None` when it does not exist.
pub(crate) async fn read_pool(
    store: &impl PoolStore,
    name: &str,
    budget: &Budget,
) -> Result<Option<IpPool>, IpamError> {
    budget
        .retry(StoreError::is_transient, || store.get_pool(name))
        .await
        .map_err(|e| IpamError::from_retry(&format!("pool {name}: get"), e))
}

fn entries<'a>(
    pool: &'a IpPool,
    wanted: &'a impl Fn(&IpAllocation) -> bool,
) -> impl Iterator<Item = (u128, &'a IpAllocation)> + 'a {
    pool.spec.allocations.iter().filter_map(move |(k, a)| if wanted(a) { Some((k.parse().ok()?, a)) } else { None })
}

/// Removes one entry (recording its release when `read`, the pool as read, keeps a reuse cooldown), then its
/// reservation if the entry is no longer ours and the reservation still is.
#[allow(clippy::too_many_arguments)]
async fn release_entry(
    store: &(impl PoolStore + ReservationStore),
    scope: &Scope<'_>,
    range: &IpRange,
    pool: &str,
    read: &IpPool,
    offset: u128,
    held: &IpAllocation,
    budget: &Budget,
) -> Result<(), IpamError> {
    remove_entry(store, pool, offset, held, Some(read), budget).await?;
    // an offset outside the CIDR (written by another tool) has no address, hence no reservation
    let ip = range.checked_addr_at(offset);
    if let Some(ip) = ip.filter(|_| scope.overlapping_ranges || held.reserved) {
        // under each name another tool may have given it (an entry the fork wrote has the fork's reservation)
        for name in names::reservation_names(scope.network_name, ip) {
            release_if_ours(store, &name, &held.podref, &held.id, budget).await?;
        }
    }
    tracing::info!(pool, ip = ?ip, podref = %held.podref, "released");
    Ok(())
}

/// Releases the entries of `pool` (as read, named `name`, of range `range`) that `wanted` selects, each failure
/// into `errors`: whether there were any, and how many were released.
#[allow(clippy::too_many_arguments)]
async fn release_in(
    store: &(impl PoolStore + ReservationStore),
    scope: &Scope<'_>,
    range: &IpRange,
    name: &str,
    pool: &IpPool,
    wanted: &impl Fn(&IpAllocation) -> bool,
    budget: &Budget,
    errors: &mut Vec<IpamError>,
) -> (bool, usize) {
    let (mut found, mut released) = (false, 0);
    for (offset, held) in entries(pool, wanted) {
        found = true;
        match release_entry(store, scope, range, name, pool, offset, held, budget).await {
            Ok(()) => released += 1,
            Err(e) => {
                tracing::error!(pool = %name, offset, error = %e, "release failed");
                errors.push(e);
            }
        }
    }
    (found, released)
}

/// Which pools of a range to search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Search {
    /// Every pool that may hold an entry of the range, and the node's own pools the layout does not list
    /// ([`Layout::strays`]): GC.
    All,
    /// The node's own pools first, and the others only if nothing was found there (DEL in slice mode: a pod's
    /// address is in its node's slice unless it was borrowed).
    OwnFirst,
}

/// Releases, in every range of `scope`, the entries `wanted` selects. Keeps going after a failure and returns
/// them all. Returns how many entries were released.
async fn release_where<S: PoolStore + ReservationStore>(
    store: &S,
    layout: &impl Layout<S>,
    scope: &Scope<'_>,
    node: &str,
    search: Search,
    budget: &Budget,
    wanted: impl Fn(&IpAllocation) -> bool,
) -> Result<usize, IpamError> {
    let mut released = 0;
    let mut errors = Vec::new();
    for range in scope.ranges {
        let mut places = match layout.places(store, scope, range, node, budget).await {
            Ok(pools) => pools,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        if search == Search::All {
            match layout.strays(store, scope, range, node, &places, budget).await {
                Ok(strays) => places.extend(strays),
                Err(e) => errors.push(e),
            }
        }
        let mut found_own = false;
        let mut borrowed: Option<Vec<String>> = None;
        for Place { pool: name, range: sub, own } in &places {
            if !own && search == Search::OwnFirst {
                if found_own {
                    break;
                }
                // An address borrowed from another node's slice is reserved under this node's label: one list
                // says which other pools to read, instead of reading every slice's.
                if scope.overlapping_ranges && borrowed.is_none() {
                    borrowed = Some(borrowed_reservations(store, node, budget, &wanted).await.unwrap_or_else(|e| {
                        errors.push(e);
                        Vec::new()
                    }));
                }
                if let Some(names) = &borrowed
                    && !names.iter().any(|n| names::reservation_address(n, scope.network_name, sub).is_some())
                {
                    continue;
                }
            }
            let pool = match read_pool(store, name, budget).await {
                Ok(Some(pool)) => pool,
                Ok(None) => continue,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let mut read = vec![(name.clone(), sub.clone(), pool)];
            // the pools this one replaced (a range changed under running pods) hold the entries of the pods that
            // were there before: theirs are released where they are, by the same rule
            let kept_off = crate::store::keeps_off_of(&read[0].2);
            for replaced in crate::store::overlaps_of(&read[0].2).into_iter().chain(kept_off) {
                match read_pool(store, &replaced, budget).await {
                    Ok(Some(old)) => {
                        if let Some((old_range, _)) = super::pool_scope(&old) {
                            read.push((replaced, old_range, old));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => errors.push(e),
                }
            }
            // the replaced pools first, this one after: the leader moves a replaced pool's entries into this one,
            // copy first, so an entry it moved after this pool was read is found here on a read after theirs
            if read.len() > 1 {
                let own = read.remove(0);
                match read_pool(store, name, budget).await {
                    Ok(Some(again)) => read.push((own.0, own.1, again)),
                    Ok(None) => {}
                    Err(e) => errors.push(e),
                }
            }
            let last = read.len() - 1;
            let mut in_replaced = false;
            for (at, (name, sub, pool)) in read.iter().enumerate() {
                let (found, done) = release_in(store, scope, sub, name, pool, &wanted, budget, &mut errors).await;
                found_own |= *own && found;
                in_replaced |= found && at < last;
                released += done;
            }
            // An entry released in a replaced pool may have been moved meanwhile: the leader copied it into this
            // pool after the read above and removed it there before this removal came (which then found it gone).
            // The copy precedes that removal, so a read of this pool now shows it.
            if in_replaced {
                let (name, sub, _) = &read[last];
                match read_pool(store, name, budget).await {
                    Ok(Some(again)) => {
                        released += release_in(store, scope, sub, name, &again, &wanted, budget, &mut errors).await.1
                    }
                    Ok(None) => {}
                    Err(e) => errors.push(e),
                }
            }
        }
    }
    IpamError::all(errors).map_or(Ok(released), Err)
}

/// The reservations labelled with `node` of the attachments `wanted` selects.
async fn borrowed_reservations(
    store: &impl ReservationStore,
    node: &str,
    budget: &Budget,
    wanted: &impl Fn(&IpAllocation) -> bool,
) -> Result<Vec<String>, IpamError> {
    let Some(label) = crate::store::node_label_value(node) else { return Ok(Vec::new()) };
    let listed = budget
        .retry(StoreError::is_transient, || store.list_reservations(Some(label)))
        .await
        .map_err(|e| IpamError::from_retry(&format!("reservations of node {node}: list"), e))?;
    Ok(listed
        .iter()
        .filter(|r| {
            let spec = &r.spec;
            let held = IpAllocation {
                id: spec.containerid.clone(),
                podref: spec.podref.clone(),
                ifname: spec.ifname.clone(),
                ..IpAllocation::default()
            };
            wanted(&held)
        })
        .filter_map(|r| r.metadata.name.clone())
        .collect())
}

/// Releases every address the attachment `req` holds in the ranges of `scope` (matched on container id and
/// interface, as Whereabouts does). Releasing what is not there succeeds. Returns how many were released.
pub(crate) async fn release<S: PoolStore + ReservationStore>(
    store: &S,
    layout: &impl Layout<S>,
    scope: &Scope<'_>,
    req: &Request,
    budget: &Budget,
) -> Result<usize, IpamError> {
    // a sticky StatefulSet entry waits for the pod's next incarnation; the reconciler releases it once the
    // StatefulSet no longer wants the ordinal (DEL cannot tell a scale-down from a pod being replaced); an
    // IPAMClaim's entry is the claim's, not the pod's, and is released once the claim is gone
    let wanted = |a: &IpAllocation| {
        a.id == req.container_id && a.ifname == req.ifname && a.statefulset.is_none() && a.ipamclaim.is_none()
    };
    release_where(store, layout, scope, &req.node, Search::OwnFirst, budget, wanted).await
}

/// Verifies that the attachment `req` holds an address in every range of `scope`.
pub(crate) async fn check<S: PoolStore>(
    store: &S,
    layout: &impl Layout<S>,
    scope: &Scope<'_>,
    req: &Request,
    budget: &Budget,
) -> Result<(), IpamError> {
    let mine = |a: &IpAllocation| a.id == req.container_id && a.ifname == req.ifname;
    for range in scope.ranges {
        let mut found = false;
        for place in layout.places(store, scope, range, &req.node, budget).await? {
            if read_pool(store, &place.pool, budget).await?.is_some_and(|p| entries(&p, &mine).next().is_some()) {
                found = true;
                break;
            }
        }
        if !found {
            return Err(IpamError::Missing {
                pool: layout.missing_in(scope, range),
                container_id: req.container_id.clone(),
                ifname: req.ifname.clone(),
            });
        }
    }
    Ok(())
}

/// Releases the entries of this network on this node whose attachment is not in `valid`. Entries that do not
/// record their node and network (written by Whereabouts, or before hereabouts recorded them) are left to the
/// reconciler: a CNI GC sees one node's runtime only, and a pool may be shared by several networks. So are
/// entries younger than [`SETTLE_TIME`](crate::request::SETTLE_TIME): the runtime took its list before this GC started,
/// and an ADD that was under way then, or started since, is in no list yet. So are entries another tool took over
/// for a new sandbox ([`IpAllocation::is_recorded`]): their node and network are an earlier sandbox's.
pub(crate) async fn gc<S: PoolStore + ReservationStore>(
    store: &S,
    layout: &impl Layout<S>,
    scope: &Scope<'_>,
    node: &str,
    valid: &[Attachment],
    budget: &Budget,
) -> Result<usize, IpamError> {
    let valid: HashSet<(&str, &str)> = valid.iter().map(|a| (a.container_id.as_str(), a.ifname.as_str())).collect();
    let now = crate::clock::now();
    let settled = |a: &IpAllocation| {
        let allocated = a.allocated.as_deref().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
        allocated.is_some_and(|at| now.duration_since(at).unsigned_abs() >= crate::request::SETTLE_TIME && at <= now)
    };
    release_where(store, layout, scope, node, Search::All, budget, |a| {
        settled(a)
            && a.is_recorded()
            && a.node.as_deref() == Some(node)
            && a.network.as_deref() == Some(scope.network)
            && !valid.contains(&(a.id.as_str(), a.ifname.as_str()))
            && a.statefulset.is_none()
            && a.ipamclaim.is_none()
            // the node's warm reserve: no sandbox holds it yet, and the reserve is not the runtime's to list
            && crate::warm::node_of(&a.podref).is_none()
    })
    .await
}
