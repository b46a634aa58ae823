//! The leader as the node-slice controller: every Node gets a slice of each NodeSlicePool (so that
//! Whereabouts' CNI in fast-IPAM mode, which never claims one, finds its slice without Whereabouts' controller),
//! and the slices of Nodes that are gone are freed once their pools have stayed empty for a grace period.
//!
//! A gone node's slice pool is deleted (only if it is still the empty object that was read) before its slice is
//! freed: a borrower that read the pool earlier then fails its guarded patch, and the CNI never re-creates another
//! node's slice pool, so no entry can land where the slice's next owner would not see it.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use hereabouts_ipam::cooldown;
use hereabouts_ipam::crd::NodeSlicePool;
use hereabouts_ipam::names;
use hereabouts_ipam::slices::{self, Slice};
use hereabouts_ipam::store::{Deleted, Patched, Store, StoreError, Version};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use tokio_util::sync::CancellationToken;

use crate::leader::Leadership;

/// Why a pass could not be made.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    #[error("node list failed")]
    Nodes(#[source] kube::Error),
    #[error("node slice pool list failed")]
    List(#[source] StoreError),
}

/// What one pass changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    /// Slices given to a node that had none.
    pub assigned: usize,
    /// Slices of gone nodes freed.
    pub freed: usize,
}

/// The controller's state: when each gone node's slice was first seen empty.
#[derive(Debug)]
pub struct SliceKeeper<S> {
    pub store: S,
    pub nodes: Api<Node>,
    /// How long a gone node's slice pool must stay empty before the slice is freed.
    pub grace: Duration,
    empty_since: HashMap<(String, String, String), Instant>,
}

impl<S: Store> SliceKeeper<S> {
    pub fn new(store: S, nodes: Api<Node>, grace: Duration) -> Self {
        Self { store, nodes, grace, empty_since: HashMap::new() }
    }

    /// One pass over every NodeSlicePool of the namespace. A failure on one slice is logged and left to the next
    /// pass.
    pub async fn pass(&mut self) -> Result<Kept, KeepError> {
        let listed = self.nodes.list_metadata(&ListParams::default()).await.map_err(KeepError::Nodes)?;
        let nodes: BTreeSet<String> = listed.items.into_iter().filter_map(|n| n.metadata.name).collect();
        let pools = self.store.list_node_slices().await.map_err(KeepError::List)?;
        let mut kept = Kept::default();
        let mut seen = BTreeSet::new();
        for pool in &pools {
            self.keep(pool, &nodes, &mut kept, &mut seen).await;
        }
        self.empty_since.retain(|key, _| seen.contains(key));
        Ok(kept)
    }

    async fn keep(
        &mut self,
        pool: &NodeSlicePool,
        nodes: &BTreeSet<String>,
        kept: &mut Kept,
        seen: &mut BTreeSet<(String, String, String)>,
    ) {
        let name = pool.metadata.name.clone().unwrap_or_default();
        let slices = slices::slices_of(pool);
        let mut freeable: HashMap<usize, Vec<(String, Version)>> = HashMap::new();
        for slice in slices.iter().filter(|s| !s.node.is_empty() && !nodes.contains(&s.node)) {
            let Some(empty) = self.empty_pools(&name, slice).await else { continue };
            let key = (name.clone(), slice.cidr.to_string(), slice.node.clone());
            seen.insert(key.clone());
            let since = *self.empty_since.entry(key).or_insert_with(Instant::now);
            if since.elapsed() >= self.grace {
                freeable.insert(slice.index, empty);
            }
        }
        for (slice, to) in slices::leader_moves(&slices, nodes, |s| freeable.contains_key(&s.index)) {
            if let Some(empty) = freeable.get(&slice.index)
                && !self.delete_empty(&name, &slice, empty).await
            {
                continue;
            }
            match self.store.move_slice(&name, slice.index, &slice.stored(), &to).await {
                Ok(Patched::Applied) => {
                    tracing::info!(node_slices = %name, slice = %slice.cidr, from = %slice.node, to = %to, "slice moved");
                    kept.assigned += usize::from(!to.is_empty());
                    kept.freed += usize::from(!slice.node.is_empty());
                }
                Ok(other) => tracing::debug!(node_slices = %name, slice = %slice.cidr, ?other, "changed meanwhile"),
                Err(e) => {
                    tracing::warn!(node_slices = %name, slice = %slice.cidr, error = %e, "moving the slice failed")
                }
            }
        }
    }

    /// The pools a gone node's `slice` may have (named for a named network, and for an unnamed one: the
    /// NodeSlicePool's name is one or the other), with the version each was read at, if every one that exists is
    /// empty; `None` when one holds entries, keeps an address cooling, or cannot be read. A pool's release
    /// records go with it: freed while an address cools, the slice's next owner would hand that address out at once.
    async fn empty_pools(&self, node_slices: &str, slice: &Slice) -> Option<Vec<(String, Version)>> {
        let mut empty = Vec::new();
        for network in [node_slices, ""] {
            let pool_name = names::slice_pool_name(network, &slice.node, slice.cidr);
            match self.store.get_pool(&pool_name).await {
                Ok(None) => {}
                Ok(Some(p))
                    if p.spec.allocations.is_empty()
                        && cooldown::cooling(&p, hereabouts_ipam::clock::now()).is_empty() =>
                {
                    empty.push((pool_name, Version::of_meta(&p.metadata)))
                }
                Ok(Some(_)) => return None,
                Err(e) => {
                    tracing::warn!(pool = %pool_name, error = %e, "cannot read a gone node's slice pool");
                    return None;
                }
            }
        }
        Some(empty)
    }

    /// Deletes the empty pools of a slice about to be freed, each only if unchanged since it was read.
    async fn delete_empty(&self, node_slices: &str, slice: &Slice, pools: &[(String, Version)]) -> bool {
        for (pool, version) in pools {
            match self.store.delete_pool(pool, version).await {
                Ok(Deleted::Deleted | Deleted::Missing) => {}
                Ok(Deleted::Changed) => {
                    tracing::info!(node_slices, slice = %slice.cidr, pool = %pool, "an entry arrived: slice kept");
                    return false;
                }
                Err(e) => {
                    tracing::warn!(node_slices, slice = %slice.cidr, pool = %pool, error = %e,
                        "deleting the empty slice pool failed");
                    return false;
                }
            }
        }
        true
    }
}

/// Makes a pass every `every` while this instance leads, until `shutdown`. A failing pass is logged when it first
/// fails (or fails differently), not on every try.
pub async fn run<S: Store>(
    mut keeper: SliceKeeper<S>,
    leadership: Leadership,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut failing: Option<String> = None;
    while leadership.next_turn(every, &shutdown).await {
        match keeper.pass().await {
            Ok(kept) => {
                failing = None;
                if kept != Kept::default() {
                    tracing::info!(assigned = kept.assigned, freed = kept.freed, "node slices kept");
                }
            }
            Err(e) => {
                let message = crate::error_chain(&e);
                if failing.as_deref() != Some(message.as_str()) {
                    tracing::warn!(error = %message, "node slice pass failed; retrying");
                    failing = Some(message);
                }
            }
        }
    }
}
