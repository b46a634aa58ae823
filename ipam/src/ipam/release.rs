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

/// Removes one entry (recording its release when `read`, the pool as read, keeps a reuse cooldown), then its
/// reservation if the entry is no longer ours and the reservation still is.
#[allow(clippy::too_many_arguments)]
async fn release_entry(
    store: &impl Store,
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
        let name = names::reservation_name(scope.network_name, ip);
        release_if_ours(store, &name, &held.podref, &held.id, budget).await?;
    }
    tracing::info!(pool, ip = ?ip, podref = %held.podref, "released");
    Ok(())
}

/// Which pools of a range to search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Search {
    /// Every pool that may hold an entry of the range.
    All,
    /// In slice mode, the node's own slices first, and the others only if nothing was found there (DEL: a pod's
    /// address is in its node's slice unless it was borrowed).
    OwnFirst,
}

/// The pools of `range` in `scope`, each with the part of the range it holds: the range's pool, or in slice mode
/// the pools of its slices that have an owner, `node`'s first. Reading the NodeSlicePool can fail like any read.
async fn pools_of(
    store: &impl Store,
    scope: &Scope<'_>,
    range: &IpRange,
    node: &str,
    budget: &Budget,
) -> Result<Vec<(String, IpRange, bool)>, IpamError> {
    if !scope.sliced {
        return Ok(vec![(names::pool_name(scope.network_name, range.cidr()), range.clone(), true)]);
    }
    let name = names::node_slice_pool_name(scope.network_name, scope.network);
    let found = budget
        .retry(StoreError::is_transient, || store.get_node_slices(&name))
        .await
        .map_err(|e| IpamError::from_retry(&format!("node slices {name}: get"), e))?;
    let Some(pool) = found else { return Ok(Vec::new()) };
    let mut slices: Vec<_> = crate::slices::slices_of(&pool).into_iter().filter(|s| !s.node.is_empty()).collect();
    slices.sort_by_key(|s| s.node != node);
    Ok(slices
        .into_iter()
        .filter_map(|s| {
            let sub = range.slice(s.cidr)?;
            Some((s.pool_name(scope.network_name), sub, s.node == node))
        })
        .collect())
}

/// Releases, in every range of `scope`, the entries `wanted` selects. Keeps going after a failure and returns
/// them all. Returns how many entries were released.
async fn release_where(
    store: &impl Store,
    scope: &Scope<'_>,
    node: &str,
    search: Search,
    budget: &Budget,
    wanted: impl Fn(&IpAllocation) -> bool,
) -> Result<usize, IpamError> {
    let mut released = 0;
    let mut errors = Vec::new();
    for range in scope.ranges {
        let pools = match pools_of(store, scope, range, node, budget).await {
            Ok(pools) => pools,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let mut found_own = false;
        let mut borrowed: Option<Vec<String>> = None;
        for (name, sub, own) in &pools {
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
            for (offset, held) in entries(&pool, &wanted) {
                found_own |= *own;
                match release_entry(store, scope, sub, name, &pool, offset, held, budget).await {
                    Ok(()) => released += 1,
                    Err(e) => {
                        tracing::error!(pool = %name, offset, error = %e, "release failed");
                        errors.push(e);
                    }
                }
            }
        }
    }
    IpamError::all(errors).map_or(Ok(released), Err)
}

/// The reservations labelled with `node` of the attachments `wanted` selects.
async fn borrowed_reservations(
    store: &impl Store,
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
pub async fn release(
    store: &impl Store,
    scope: &Scope<'_>,
    req: &Request,
    budget: &Budget,
) -> Result<usize, IpamError> {
    // a sticky StatefulSet entry waits for the pod's next incarnation; the reconciler releases it once the
    // StatefulSet no longer wants the ordinal (DEL cannot tell a scale-down from a pod being replaced)
    let wanted = |a: &IpAllocation| a.id == req.container_id && a.ifname == req.ifname && a.statefulset.is_none();
    release_where(store, scope, &req.node, Search::OwnFirst, budget, wanted).await
}

/// Verifies that the attachment `req` holds an address in every range of `scope`.
pub async fn check(store: &impl Store, scope: &Scope<'_>, req: &Request, budget: &Budget) -> Result<(), IpamError> {
    let mine = |a: &IpAllocation| a.id == req.container_id && a.ifname == req.ifname;
    for range in scope.ranges {
        let mut found = false;
        let pools = pools_of(store, scope, range, &req.node, budget).await?;
        for (name, _, _) in &pools {
            if read_pool(store, name, budget).await?.is_some_and(|p| entries(&p, &mine).next().is_some()) {
                found = true;
                break;
            }
        }
        if !found {
            let pool = match scope.sliced {
                true => names::node_slice_pool_name(scope.network_name, scope.network),
                false => names::pool_name(scope.network_name, range.cidr()),
            };
            return Err(IpamError::Missing {
                pool,
                container_id: req.container_id.clone(),
                ifname: req.ifname.clone(),
            });
        }
    }
    Ok(())
}

/// CHECK of a provider config, whose ranges are candidates: for each IP family among `kept` (the candidates an ADD
/// tries, [`IpamConfig::kept_ranges`](crate::config::IpamConfig::kept_ranges)), one of their pools holds the
/// attachment's entry.
pub async fn check_candidates(
    store: &impl Store,
    scope: &Scope<'_>,
    kept: &[&IpRange],
    req: &Request,
    budget: &Budget,
) -> Result<(), IpamError> {
    let mine = |a: &IpAllocation| a.id == req.container_id && a.ifname == req.ifname;
    for v4 in [true, false] {
        let family: Vec<&IpRange> = kept.iter().copied().filter(|r| r.cidr().addr().is_ipv4() == v4).collect();
        let Some(first) = family.first() else { continue };
        let mut found = false;
        for range in &family {
            let name = names::pool_name(scope.network_name, range.cidr());
            if read_pool(store, &name, budget).await?.is_some_and(|p| entries(&p, &mine).next().is_some()) {
                found = true;
                break;
            }
        }
        if !found {
            return Err(IpamError::Missing {
                pool: names::pool_name(scope.network_name, first.cidr()),
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
    release_where(store, scope, node, Search::All, budget, |a| {
        settled(a)
            && a.node.as_deref() == Some(node)
            && a.network.as_deref() == Some(scope.network)
            && !valid.contains(&(a.id.as_str(), a.ifname.as_str()))
            && a.statefulset.is_none()
    })
    .await
}
