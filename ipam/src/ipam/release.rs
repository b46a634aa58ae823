//! DEL, CHECK and GC: find an attachment's entries in each pool and release them with guarded removals.
//! Release keeps going after a failure and reports the first one, so one bad pool does not leak the others.

use std::collections::HashSet;

use super::{IpamError, Request};
use crate::budget::Budget;
use crate::config::IpamConfig;
use crate::crd::{IpAllocation, IpPool};
use crate::names;
use crate::range::IpRange;
use crate::store::{RemoveOutcome, Store, StoreError};

/// One attachment the runtime still holds, as listed in `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Deserialize)]
pub struct Attachment {
    /// The container id.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name.
    pub ifname: String,
}

async fn read_pool(store: &Store, name: &str, budget: &Budget) -> Result<Option<IpPool>, IpamError> {
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

/// Removes one entry and its reservation. Returns whether the entry was ours to remove.
async fn release_entry(
    store: &Store,
    cfg: &IpamConfig,
    range: &IpRange,
    pool: &str,
    offset: u128,
    held: &IpAllocation,
    budget: &Budget,
) -> Result<bool, IpamError> {
    let outcome = budget
        .retry(StoreError::is_transient, || store.remove_allocation(pool, offset, held))
        .await
        .map_err(|e| IpamError::from_retry(&format!("pool {pool}: remove allocation {offset}"), e))?;
    // an offset outside the CIDR (written by another tool) has no address, hence no reservation
    let ip = range.checked_addr_at(offset);
    // Only what was ours: an entry re-assigned in between keeps its reservation.
    let removed = outcome == RemoveOutcome::Removed;
    if let Some(ip) = ip.filter(|_| cfg.overlapping_ranges && removed) {
        let name = names::reservation_name(&cfg.network_name, ip);
        budget
            .retry(StoreError::is_transient, || store.release_reservation(&name, &held.podref, &held.id))
            .await
            .map_err(|e| IpamError::from_retry(&format!("reservation {name}: delete"), e))?;
    }
    if removed {
        tracing::info!(pool, ip = ?ip, podref = %held.podref, "released");
    }
    Ok(removed)
}

/// Releases, in every range of `cfg`, the entries `wanted` selects. Keeps going after a failure and returns the
/// first one, so one bad pool does not leak the others. Returns how many were released.
async fn release_where(
    store: &Store,
    cfg: &IpamConfig,
    budget: &Budget,
    what: &str,
    wanted: impl Fn(&IpAllocation) -> bool,
) -> Result<usize, IpamError> {
    let mut released = 0;
    let mut first_error = None;
    for range in &cfg.ranges {
        let name = names::pool_name(&cfg.network_name, range.cidr());
        let result = async {
            let Some(pool) = read_pool(store, &name, budget).await? else { return Ok(0) };
            let mut n = 0;
            for (offset, held) in entries(&pool, &wanted) {
                n += usize::from(release_entry(store, cfg, range, &name, offset, held, budget).await?);
            }
            Ok::<_, IpamError>(n)
        }
        .await;
        match result {
            Ok(n) => released += n,
            Err(e) => {
                tracing::error!(pool = %name, error = %e, "{what} failed");
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(released), Err)
}

/// Releases every address the attachment `req` holds in the ranges of `cfg` (matched on container id and
/// interface, as Whereabouts does). Releasing what is not there succeeds. Returns how many were released.
pub async fn release(store: &Store, cfg: &IpamConfig, req: &Request, budget: &Budget) -> Result<usize, IpamError> {
    release_where(store, cfg, budget, "release", |a| a.id == req.container_id && a.ifname == req.ifname).await
}

/// Verifies that the attachment `req` holds an address in every range of `cfg`.
pub async fn check(store: &Store, cfg: &IpamConfig, req: &Request, budget: &Budget) -> Result<(), IpamError> {
    for range in &cfg.ranges {
        let name = names::pool_name(&cfg.network_name, range.cidr());
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
/// reconciler: a CNI GC sees one node's runtime only, and a pool may be shared by several networks.
pub async fn gc(
    store: &Store,
    cfg: &IpamConfig,
    node: &str,
    valid: &[Attachment],
    budget: &Budget,
) -> Result<usize, IpamError> {
    let valid: HashSet<(&str, &str)> = valid.iter().map(|a| (a.container_id.as_str(), a.ifname.as_str())).collect();
    release_where(store, cfg, budget, "gc", |a| {
        a.node.as_deref() == Some(node)
            && a.network.as_deref() == Some(cfg.name.as_str())
            && !valid.contains(&(a.id.as_str(), a.ifname.as_str()))
    })
    .await
}
