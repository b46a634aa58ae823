//! Node slices ([`Mode::Slices`](crate::config::Mode::Slices)): the range is cut into slices listed in a
//! NodeSlicePool (Whereabouts' fast IPAM shape), each with a pool of its own, and a node allocates in its own
//! slices. The decisions without I/O are in [`plan`] (re-exported here); [`add`] is the ADD, and [`Slices`] where
//! DEL, CHECK and GC look.

mod add;
pub mod growth;
pub mod keep;
pub mod plan;

pub use plan::*;

use std::future::Future;

use crate::budget::Budget;
use std::net::IpAddr;

use crate::claim::{Claimant, Journal, Layout, Place, Scope};
use crate::config::{IpamConfig, Slices as SliceMode};
use crate::error::IpamError;
use crate::names;
use crate::pools::{OneRange, each_range};
use crate::range::IpRange;
use crate::request::{Assigned, Request};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::{CoreStore, PodEvent, PoolStore, ReservationStore, SliceStore, StoreError};

/// Assigns an address of the range of `cfg` to the attachment `req`, in this node's slices (or one it claims, or
/// borrows from). On any failure, what this call wrote is rolled back first.
///
/// When `max_slices_per_node` kept the node from a free slice (it borrowed instead, or found nothing to borrow),
/// the pod is told with a Warning Event `SliceCapReached`, best effort: the CNI's Events right is the chart's
/// `cni.providerEvents`, and without it the warning is only logged.
pub(crate) async fn add<S: PoolStore + ReservationStore + SliceStore + CoreStore>(
    store: &S,
    cfg: &IpamConfig,
    mode: &SliceMode,
    req: &Request,
    budget: &Budget,
    first_add: bool,
) -> Result<Vec<Assigned>, IpamError> {
    let podref = cfg.pod.to_string();
    let who = Claimant::new(cfg, &mode.kube, req, &podref);
    let one = InSlices { store, who: &who, mode, budget, first_add, capped: AtomicU64::new(0) };
    let added = each_range(store, cfg, budget, &one).await;
    let note = match (&added, one.capped.load(Ordering::Relaxed)) {
        (Err(e @ IpamError::SliceCap { .. }), _) => Some(e.to_string()),
        (Ok(_), max) if max > 0 => Some(format!(
            "node {} holds max_slices_per_node ({max}) slices of network {}, all full: this pod's address was borrowed \
             from another node's slice, though slices are free; raise max_slices_per_node or node_slice_size",
            req.node, cfg.name
        )),
        _ => None,
    };
    if let Some(note) = note {
        let pod = PodEvent {
            namespace: &cfg.pod.namespace,
            name: &cfg.pod.name,
            uid: cfg.pod.uid.as_deref(),
            node: &req.node,
        };
        if let Err(e) = store.warn_pod(&pod, SLICE_CAP_REASON, &note).await {
            tracing::debug!(error = %e, "no Event for the slice cap (the CNI's Events right: cni.providerEvents)");
        }
    }
    added
}

/// The reason of the Event that tells a pod `max_slices_per_node` kept its node from a free slice.
pub const SLICE_CAP_REASON: &str = "SliceCapReached";

/// [`add`] for the node itself (the warm reserve): entries under `podref`, which names no pod; with what was
/// written on the way, where the entries are to be found.
pub(crate) async fn add_for_node<S: PoolStore + ReservationStore + SliceStore>(
    store: &S,
    cfg: &IpamConfig,
    mode: &SliceMode,
    req: &Request,
    budget: &Budget,
    podref: &str,
) -> Result<(Vec<Assigned>, Journal), IpamError> {
    let who = Claimant::new(cfg, &mode.kube, req, podref);
    let one = InSlices { store, who: &who, mode, budget, first_add: true, capped: AtomicU64::new(0) };
    crate::pools::each_range_journaled(store, cfg, budget, &one).await
}

/// Claims ahead for `node` (the node agent, when it sees the network): for each range of `cfg`, a slice of the
/// node's with its pool, claimed and created when the node holds none and at least half of the range is in free
/// slices. The slices the node holds afterwards (one per range at most); nothing is written for a pod.
pub(crate) async fn hold<S: PoolStore + ReservationStore + SliceStore>(
    store: &S,
    cfg: &IpamConfig,
    mode: &SliceMode,
    node: &str,
    budget: &Budget,
) -> Result<Vec<ipnet::IpNet>, IpamError> {
    let req = Request { container_id: String::new(), ifname: String::new(), node: node.to_string() };
    let podref = cfg.pod.to_string();
    let who = Claimant::new(cfg, &mode.kube, &req, &podref);
    let capped = AtomicU64::new(0);
    let mut held = Vec::new();
    for range in &cfg.ranges {
        let (size, max_slices, growth) = (&mode.size, mode.max_slices, mode.growth());
        let one = add::SlicedAdd {
            store,
            who: &who,
            range,
            budget,
            size,
            requested: None,
            given: &[],
            first_add: false,
            max_slices,
            growth,
            capped: &capped,
        };
        held.extend(one.hold().await?);
    }
    Ok(held)
}

/// The claim of the range's address in a slice.
struct InSlices<'a, S> {
    store: &'a S,
    who: &'a Claimant<'a>,
    mode: &'a SliceMode,
    budget: &'a Budget,
    /// The attachment's first ADD on this node ([`crate::marks`]): no earlier try's entry to look for.
    first_add: bool,
    /// `max_slices_per_node`, once it made a claim borrow though slices were free (0: it did not).
    capped: AtomicU64,
}

impl<S: PoolStore + ReservationStore + SliceStore> OneRange for InSlices<'_, S> {
    async fn claim(
        &self,
        index: usize,
        range: &IpRange,
        given: &[IpAddr],
        journal: &mut Journal,
    ) -> Result<IpAddr, IpamError> {
        let requested = self.who.cfg.requested_for(index);
        let (store, who, budget, size) = (self.store, self.who, self.budget, &self.mode.size);
        let (first_add, max_slices, growth) = (self.first_add, self.mode.max_slices, self.mode.growth());
        let capped = &self.capped;
        add::SlicedAdd { store, who, range, budget, size, requested, given, first_add, max_slices, growth, capped }
            .run(journal)
            .await
    }
}

/// Where this mode's entries live: the pools of the range's slices that have an owner, the node's own first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sliced;

impl<S: SliceStore> Layout<S> for Sliced {
    fn places(
        &self,
        store: &S,
        scope: &Scope<'_>,
        range: &IpRange,
        node: &str,
        budget: &Budget,
    ) -> impl Future<Output = Result<Vec<Place>, IpamError>> + Send {
        let name = names::node_slice_pool_name(scope.network_name, scope.network);
        let network_name = scope.network_name.to_string();
        let (range, node) = (range.clone(), node.to_string());
        async move {
            let found = budget
                .retry(StoreError::is_transient, || store.get_node_slices(&name))
                .await
                .map_err(|e| IpamError::from_retry(&format!("node slices {name}: get"), e))?;
            let Some(pool) = found else { return Ok(Vec::new()) };
            let mut slices: Vec<_> = slices_of(&pool).into_iter().filter(|s| !s.node.is_empty()).collect();
            slices.sort_by_key(|s| s.node != node);
            Ok(slices
                .into_iter()
                .filter_map(|s| {
                    let sub = range.slice(s.cidr)?;
                    Some(Place { pool: s.pool_name(&network_name), range: sub, own: s.node == node })
                })
                .collect())
        }
    }

    fn missing_in(&self, scope: &Scope<'_>, _range: &IpRange) -> String {
        names::node_slice_pool_name(scope.network_name, scope.network)
    }

    /// The node's pools of the range's slices listed free or as another node's: a failed ADD's entry stays in one
    /// when the slice changes hands under it (the claimant makes no pool of its own there while it holds
    /// entries). One list of the pools, as a retried ADD lists them to find its entry.
    fn strays(
        &self,
        store: &S,
        scope: &Scope<'_>,
        range: &IpRange,
        node: &str,
        listed: &[Place],
        budget: &Budget,
    ) -> impl Future<Output = Result<Vec<Place>, IpamError>> + Send
    where
        S: PoolStore,
    {
        let network_name = scope.network_name.to_string();
        let (range, node) = (range.clone(), node.to_string());
        let known: std::collections::HashSet<String> = listed.iter().map(|p| p.pool.clone()).collect();
        async move {
            let pools = budget
                .retry(StoreError::is_transient, || store.list_pools())
                .await
                .map_err(|e| IpamError::from_retry(&format!("pools of {network_name}: list {node}'s"), e))?;
            Ok(pools
                .iter()
                .filter(|p| plan::of_network(p, &network_name))
                .filter_map(|p| {
                    let name = p.metadata.name.as_deref().filter(|n| !known.contains(*n))?;
                    let cidr = p.spec.range.parse::<ipnet::IpNet>().ok()?.trunc();
                    (names::node_of_slice_pool(name, &network_name, cidr)? == node).then_some(())?;
                    Some(Place { pool: name.to_string(), range: range.slice(cidr)?, own: true })
                })
                .collect())
        }
    }
}

/// The objects an invocation of `cfg` on a node writes, for the host lock: the node's slices of the network, under
/// one lock.
pub(crate) fn locked(cfg: &IpamConfig) -> Vec<String> {
    vec![names::node_slice_pool_name(&cfg.network_name, &cfg.name)]
}
