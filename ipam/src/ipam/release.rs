//! DEL, CHECK and GC: find an attachment's entries in each pool and release them with guarded removals, the
//! entry first and its reservation after it (a reservation never goes while the entry it guards stays).
//! Release keeps going after a failure and returns every failure, so one bad pool does not leak the others.

use std::collections::HashSet;

use super::journal::remove_entry;
use super::reservation::release_if_ours;
use super::{IpamError, Request, Scope};
use crate::budget::Budget;
use crate::crd::{IpAllocation, IpPool};
use crate::names;
use crate::range::IpRange;
use crate::store::{Store, StoreError};

/// One attachment the runtime still holds, as listed in `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Deserialize)]
pub struct Attachment {
    /// The container id.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name.
    pub ifname: String,
}

async fn read_pool(store: &impl Store, name: &str, budget: &Budget) -> Result<Option<IpPool>, IpamError> {
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

/// Removes one entry, then its reservation if the entry is no longer ours and the reservation still is.
async fn release_entry(
    store: &impl Store,
    scope: &Scope<'_>,
    range: &IpRange,
    pool: &str,
    offset: u128,
    held: &IpAllocation,
    budget: &Budget,
) -> Result<(), IpamError> {
    remove_entry(store, pool, offset, held, budget).await?;
    // an offset outside the CIDR (written by another tool) has no address, hence no reservation
    let ip = range.checked_addr_at(offset);
    if let Some(ip) = ip.filter(|_| scope.overlapping_ranges || held.reserved) {
        let name = names::reservation_name(scope.network_name, ip);
        release_if_ours(store, &name, &held.podref, &held.id, budget).await?;
    }
    tracing::info!(pool, ip = ?ip, podref = %held.podref, "released");
    Ok(())
}

/// Releases, in every range of `scope`, the entries `wanted` selects. Keeps going after a failure and returns
/// them all. Returns how many entries were released.
async fn release_where(
    store: &impl Store,
    scope: &Scope<'_>,
    budget: &Budget,
    wanted: impl Fn(&IpAllocation) -> bool,
) -> Result<usize, IpamError> {
    let mut released = 0;
    let mut errors = Vec::new();
    for range in scope.ranges {
        let name = names::pool_name(scope.network_name, range.cidr());
        let pool = match read_pool(store, &name, budget).await {
            Ok(Some(pool)) => pool,
            Ok(None) => continue,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        for (offset, held) in entries(&pool, &wanted) {
            match release_entry(store, scope, range, &name, offset, held, budget).await {
                Ok(()) => released += 1,
                Err(e) => {
                    tracing::error!(pool = %name, offset, error = %e, "release failed");
                    errors.push(e);
                }
            }
        }
    }
    IpamError::all(errors).map_or(Ok(released), Err)
}

/// Releases every address the attachment `req` holds in the ranges of `scope` (matched on container id and
/// interface, as Whereabouts does). Releasing what is not there succeeds. Returns how many were released.
pub async fn release(
    store: &impl Store,
    scope: &Scope<'_>,
    req: &Request,
    budget: &Budget,
) -> Result<usize, IpamError> {
    release_where(store, scope, budget, |a| a.id == req.container_id && a.ifname == req.ifname).await
}

/// Verifies that the attachment `req` holds an address in every range of `scope`.
pub async fn check(store: &impl Store, scope: &Scope<'_>, req: &Request, budget: &Budget) -> Result<(), IpamError> {
    for range in scope.ranges {
        let name = names::pool_name(scope.network_name, range.cidr());
        let pool = read_pool(store, &name, budget).await?;
        let found = pool.as_ref().is_some_and(|p| {
            entries(p, &|a: &IpAllocation| a.id == req.container_id && a.ifname == req.ifname).next().is_some()
        });
        if !found {
            return Err(IpamError::Missing {
                pool: name,
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
/// entries younger than [`SETTLE_TIME`](super::SETTLE_TIME): the runtime took its list before this GC started,
/// and an ADD that was under way then, or started since, is in no list yet.
pub async fn gc(
    store: &impl Store,
    scope: &Scope<'_>,
    node: &str,
    valid: &[Attachment],
    budget: &Budget,
) -> Result<usize, IpamError> {
    let valid: HashSet<(&str, &str)> = valid.iter().map(|a| (a.container_id.as_str(), a.ifname.as_str())).collect();
    let now = crate::clock::now();
    let settled = |a: &IpAllocation| {
        let allocated = a.allocated.as_deref().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
        allocated.is_some_and(|at| now.duration_since(at).unsigned_abs() >= super::SETTLE_TIME && at <= now)
    };
    release_where(store, scope, budget, |a| {
        settled(a)
            && a.node.as_deref() == Some(node)
            && a.network.as_deref() == Some(scope.network)
            && !valid.contains(&(a.id.as_str(), a.ifname.as_str()))
    })
    .await
}
