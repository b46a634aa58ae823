//! What the use cases ask of the storage: IPPools, OverlappingRangeIPReservations and NodeSlicePools in one
//! namespace, read and written with guarded patches and creates (docs/design.md, "The store protocol").
//!
//! The seam is split by concern — [`PoolStore`], [`ReservationStore`], [`SliceStore`], [`SubInterfaceStore`],
//! [`CoreStore`] — so that each use case names what it touches. [`KubeStore`] is the live implementation (one API
//! request per call); [`MemoryStore`] keeps the same objects in memory and injects, per call, the faults a real
//! cluster produces (a response lost after the write was applied, 409, 422, 429, 500, a timeout, the death of the
//! process). Both write with the patch documents of [`guard`], built once, so the protocol's invariants proven by
//! property tests on the one are proven for the documents the other sends.
//!
//! Every call is one request and never retries: retrying, and reading back after an answer that did not come,
//! is the caller's business ([`StoreError::is_ambiguous`]).

mod connect;
pub mod guard;
mod kube;
pub mod memory;
pub mod proxy;
pub mod resolve;
pub mod shared;

use std::collections::BTreeSet;
use std::future::Future;

pub use self::kube::KubeStore;
pub use crate::cooldown::ReleaseRecord;
pub use connect::{ConnectError, DEFAULT_NAMESPACE, connect, namespace_of};
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
pub use memory::MemoryStore;
pub use proxy::{Proxies, ProxyError, RouteError};
pub use resolve::{ResolveError, pin_server_address};
pub use shared::{Shared, SharedStats, Turn};

use crate::crd::{
    IpAllocation, IpPool, NodeSliceAllocation, NodeSlicePool, NodeSlicePoolSpec, OverlappingRangeIpReservation,
    OverlappingRangeIpReservationSpec, SubInterfaceRecord,
};

/// The label that names the node an ADD ran on, on the reservations hereabouts creates, so that a node's
/// reconciler can watch just its own node's claims. Left off when the node name is not a valid label value.
pub const NODE_LABEL: &str = "hereabouts.cni.cncf.io/node";

/// The annotation holding when an ADD last claimed a reservation (RFC 3339): created it, or took it over from an
/// earlier sandbox of the same attachment. A reservation no pool entry accounts for is an orphan only once this
/// time is older than any ADD can run.
pub const CLAIMED_ANNOTATION: &str = "hereabouts.cni.cncf.io/claimed";

/// The annotation naming the `network_name` of the pools hereabouts creates. A slice pool's name
/// (`<network>-<node>-<slice>`) cannot tell its network from its node, and the reservations of its entries are
/// named after the network.
pub const NETWORK_ANNOTATION: &str = "hereabouts.cni.cncf.io/network-name";

/// The annotation holding how many addresses of a pool its creator's config may hand out (range_start, range_end,
/// exclude and gateway applied): the capacity the pool gauges report. A pool without it (Whereabouts made it) is
/// counted by its range.
pub const USABLE_ANNOTATION: &str = "hereabouts.cni.cncf.io/usable-addresses";

/// The annotation in which the leader reconciler keeps a pool's entry count, for `kubectl get ippools` (beside
/// [`USABLE_ANNOTATION`]): never read by an allocation, so never more than a few seconds stale matters to no one.
pub const ALLOCATED_ANNOTATION: &str = "hereabouts.cni.cncf.io/allocated";

/// How many addresses `pool` may hand out: what its creator's config said ([`USABLE_ANNOTATION`]), else its
/// range's usable count.
pub fn capacity(pool: &IpPool) -> u128 {
    let annotated = pool.metadata.annotations.as_ref().and_then(|a| a.get(USABLE_ANNOTATION)?.parse().ok());
    annotated.unwrap_or_else(|| {
        crate::range::IpRange::parse(&pool.spec.range, None, None, &[]).map_or(0, |r| r.usable_count())
    })
}

/// The annotation of a pool listing the pools of the same network whose ranges overlap its own, as they were when it
/// was created (comma-separated names): the layouts it replaces (a range grown, shrunk or moved). Its ADDs never
/// hand out an address one of them still holds, reservations or not.
pub const OVERLAPS_ANNOTATION: &str = "hereabouts.cni.cncf.io/overlaps";

/// The annotation of a pool naming, comma-separated, the pools of the same network whose ranges overlapped its own
/// when it was created and that no hereabouts config made (Whereabouts wrote them, or a hereabouts from before the
/// config was recorded): its ADDs never hand out an address one of them holds, and its DELs look there too, but
/// the leader neither moves their entries nor retires them, as it cannot tell which config still uses them.
pub const KEEPS_OFF_ANNOTATION: &str = "hereabouts.cni.cncf.io/keeps-off";

/// The annotation of a pool naming the config (its netconf `name`) whose ADD made it: what tells a layout of the
/// same network (the pools a changed config replaces) from another config's pools that share the network name.
pub const CONFIG_ANNOTATION: &str = "hereabouts.cni.cncf.io/config-name";

/// The config that made `pool` ([`CONFIG_ANNOTATION`]), if recorded.
pub fn config_of(pool: &IpPool) -> Option<&str> {
    pool.metadata.annotations.as_ref()?.get(CONFIG_ANNOTATION).map(String::as_str)
}

/// On a pool that another pool replaces (a range changed: it is named in that pool's [`OVERLAPS_ANNOTATION`] or
/// [`KEEPS_OFF_ANNOTATION`]), when the first claim of the replacing pool marked it (RFC 3339): an ADD begun under
/// the old config may not claim a new address in it for [`REPLACED_WINDOW`] after, since claims of the new pool no
/// longer read this one; and an entry is added to it only while the mark is as its claim read it.
pub const REPLACED_ANNOTATION: &str = "hereabouts.cni.cncf.io/replaced";

/// On a pool just made for a config whose layouts may change ([`crate::claim::replaces`]): which overlapping pools it
/// replaces is not yet decided. No address is claimed in it until a step that lists the pools again has decided,
/// by a rule that two pools made at once both reach, and removed this ([`crate::claim::replaces::settle`]).
pub const PENDING_ANNOTATION: &str = "hereabouts.cni.cncf.io/replaces-pending";

/// Whether what `pool` replaces is still to be decided ([`PENDING_ANNOTATION`]).
pub fn replaces_pending(pool: &IpPool) -> bool {
    pool.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(PENDING_ANNOTATION))
}

/// How long after a pool was marked replaced ([`REPLACED_ANNOTATION`]) an ADD of the old config may be under way:
/// the longest budget (`timeout_seconds`) with the node agent's turn and a roll-back, and room for a runtime's
/// retry. Past it, a claim in the pool is taken for one of a config that names it again (the NAD changed back).
pub const REPLACED_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// When `pool` was marked replaced, if it was ([`REPLACED_ANNOTATION`]).
pub fn replaced_at(pool: &IpPool) -> Option<k8s_openapi::jiff::Timestamp> {
    pool.metadata.annotations.as_ref()?.get(REPLACED_ANNOTATION)?.parse().ok()
}

/// The pools an [`OVERLAPS_ANNOTATION`] names.
pub fn overlaps_of(pool: &IpPool) -> Vec<String> {
    names_in(pool, OVERLAPS_ANNOTATION)
}

/// The pools a [`KEEPS_OFF_ANNOTATION`] names.
pub fn keeps_off_of(pool: &IpPool) -> Vec<String> {
    names_in(pool, KEEPS_OFF_ANNOTATION)
}

fn names_in(pool: &IpPool, annotation: &str) -> Vec<String> {
    let listed = pool.metadata.annotations.as_ref().and_then(|a| a.get(annotation));
    listed.map(|l| l.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect()).unwrap_or_default()
}

/// The pool `create_pool` makes, with no allocations: `name`, for `range` of the network `network_name`
/// ([`NETWORK_ANNOTATION`]), `usable` of whose addresses the config may hand out ([`USABLE_ANNOTATION`]); bound to
/// `node_name` when it is a node-warm pool (IaaS provider mode); naming the pools whose layout it replaces
/// ([`OVERLAPS_ANNOTATION`]).
#[derive(Debug, Clone, Copy)]
pub struct NewPool<'a> {
    pub name: &'a str,
    pub range: &'a str,
    pub network_name: &'a str,
    pub usable: u128,
    pub node_name: Option<&'a str>,
    pub overlaps: &'a [String],
    /// Pools of the network no hereabouts config made whose ranges overlap ([`KEEPS_OFF_ANNOTATION`]).
    pub keeps_off: &'a [String],
    /// The netconf `name` of the config whose ADD makes it ([`CONFIG_ANNOTATION`]); `""`, none recorded.
    pub config_name: &'a str,
    /// Born with what it replaces still to be decided ([`PENDING_ANNOTATION`]).
    pub pending: bool,
}

impl<'a> NewPool<'a> {
    /// The pool `name` of `range` with `usable` addresses, of the unnamed network, bound to no node, replacing none.
    pub fn new(name: &'a str, range: &'a str, usable: u128) -> Self {
        Self {
            name,
            range,
            network_name: "",
            usable,
            node_name: None,
            overlaps: &[],
            keeps_off: &[],
            config_name: "",
            pending: false,
        }
    }

    /// The object `create_pool` writes.
    pub fn object(&self) -> IpPool {
        let spec = crate::crd::IpPoolSpec {
            range: self.range.to_string(),
            node_name: self.node_name.map(str::to_string),
            ..Default::default()
        };
        let mut pool = IpPool::new(self.name, spec);
        let overlaps = (!self.overlaps.is_empty()).then(|| (OVERLAPS_ANNOTATION.to_string(), self.overlaps.join(",")));
        let keeps_off =
            (!self.keeps_off.is_empty()).then(|| (KEEPS_OFF_ANNOTATION.to_string(), self.keeps_off.join(",")));
        let config =
            (!self.config_name.is_empty()).then(|| (CONFIG_ANNOTATION.to_string(), self.config_name.to_string()));
        let pending = self.pending.then(|| (PENDING_ANNOTATION.to_string(), "true".to_string()));
        pool.metadata.annotations = Some(
            [
                (NETWORK_ANNOTATION.to_string(), self.network_name.to_string()),
                (USABLE_ANNOTATION.to_string(), self.usable.to_string()),
            ]
            .into_iter()
            .chain(overlaps)
            .chain(keeps_off)
            .chain(config)
            .chain(pending)
            .collect(),
        );
        pool
    }
}

/// The NodeSlicePool object `create_node_slices` writes: `slices` as its status.
pub fn node_slices_object(name: &str, spec: &NodeSlicePoolSpec, slices: &[NodeSliceAllocation]) -> NodeSlicePool {
    let mut object = NodeSlicePool::new(name, spec.clone());
    object.status = Some(crate::crd::NodeSlicePoolStatus { allocations: slices.to_vec() });
    object
}

/// What a claim of a free offset decided on, besides the offset being free: the add is guarded on each part still
/// being as read ([`guard::add_entry`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AsRead {
    /// In a pool that keeps a reuse cooldown's books (`spec.released`): the offset's release record as read, `None`
    /// when it had none. A release since the read makes the address cool again, so the claim must fail.
    pub released: Option<Option<String>>,
    /// In IaaS provider mode: the offset's sub-interface record as read.
    pub sub_interface: Option<SubInterfaceRecord>,
    /// In slice mode: an entry of the pool as read (its offset and id), which must still be there. A slice whose
    /// pools are all empty may change hands (a NodeSlicePool lost and rebuilt lists it free), so a claim that
    /// planned on a pool in use must not land in one emptied since; one that planned on an empty pool reads the
    /// slice's owner after writing instead.
    pub in_use: Option<(u128, String)>,
    /// The pool's replacement mark as read ([`REPLACED_ANNOTATION`]): `None`, no test (a write that is not a new
    /// claim of the pool's own config).
    pub replaced: Option<MarkAsRead>,
}

/// What a pool as read showed of its [`REPLACED_ANNOTATION`]: the entry is added only while it still shows that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkAsRead {
    /// The pool had no annotations at all.
    NoAnnotations,
    /// It had annotations, and no mark.
    Unmarked,
    /// It had this mark.
    Marked(String),
}

impl MarkAsRead {
    /// What `pool` shows.
    pub fn of(pool: &IpPool) -> Self {
        match &pool.metadata.annotations {
            None => MarkAsRead::NoAnnotations,
            Some(annotations) => match annotations.get(REPLACED_ANNOTATION) {
                None => MarkAsRead::Unmarked,
                Some(mark) => MarkAsRead::Marked(mark.clone()),
            },
        }
    }
}

/// What a create did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created<T> {
    /// The object is new, as returned by the server.
    Created(T),
    /// An object of that name already exists; nothing was written.
    Exists,
}

/// What a guarded patch (one that tests the current content before it changes it) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Patched {
    /// Every test held and the change is applied.
    Applied,
    /// The server refused the patch (422): a test failed, or something else (a schema, an admission policy)
    /// refused it. Nothing was written; read the object to tell which.
    Refused(String),
    /// The object does not exist.
    Missing,
}

/// What a delete with preconditions did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The object, as read, is gone.
    Deleted,
    /// It was already gone.
    Missing,
    /// It changed since it was read (another resourceVersion or UID): nothing was deleted.
    Changed,
}

/// Which object an optimistic delete expects: the resourceVersion and UID it was read with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// `metadata.uid`.
    pub uid: Option<String>,
}

impl Version {
    /// The version `reservation` was read at.
    pub fn of(reservation: &OverlappingRangeIpReservation) -> Self {
        Self::of_meta(&reservation.metadata)
    }

    /// The version of the object whose metadata is `meta`.
    pub fn of_meta(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        Self { resource_version: meta.resource_version.clone(), uid: meta.uid.clone() }
    }

    /// Whether the object whose metadata is `meta` is still at this version (what is not given is not tested).
    pub fn matches(&self, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
        (self.resource_version.is_none() || self.resource_version == meta.resource_version)
            && (self.uid.is_none() || self.uid == meta.uid)
    }
}

/// A claim on one address, as an ADD writes it into a reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Who holds the address.
    pub spec: OverlappingRangeIpReservationSpec,
    /// The node the ADD runs on ([`NODE_LABEL`]).
    pub node: String,
    /// When the ADD claimed it ([`CLAIMED_ANNOTATION`]).
    pub at: k8s_openapi::jiff::Timestamp,
}

/// How a request failed, which decides what the caller may do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The server did not apply the request and asks to come back (429, a 409 conflict of its own internal
    /// retries): safe to send again.
    Unavailable,
    /// No answer, or an answer that does not say whether the request was applied (a reset, a timeout, GOAWAY, a
    /// 5xx): a write may or may not have happened. Read back before deciding; never guess.
    Ambiguous,
    /// The object would exceed the storage's size limit (etcd's request limit): nothing was written, and trying
    /// again cannot help.
    TooLarge,
    /// The server refused the request (forbidden, invalid, not found where that is unexpected); the HTTP code.
    Refused(u16),
    /// The answer could not be read as the object it should be.
    Malformed,
}

/// A failed request, with the operation and the object it was about.
#[derive(Debug, thiserror::Error)]
#[error("{kind} {name}: {op}: {message}")]
pub struct StoreError {
    /// `pool` or `reservation`.
    pub kind: &'static str,
    /// The object's name (`*` for a list).
    pub name: String,
    /// What was attempted, e.g. `patch allocation 5`.
    pub op: String,
    /// How it failed.
    pub failure: Failure,
    /// What the client or the server said.
    pub message: String,
    /// The client's error, when there is one.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// A failure of `op` on `kind` `name`.
    pub fn new(kind: &'static str, name: &str, op: impl Into<String>, failure: Failure, message: String) -> Self {
        Self { kind, name: name.to_string(), op: op.into(), failure, message, source: None }
    }

    /// Whether the request may succeed if sent again (after a read-back, for an [`Failure::Ambiguous`] write).
    pub fn is_transient(&self) -> bool {
        matches!(self.failure, Failure::Unavailable | Failure::Ambiguous)
    }

    /// Whether a write may have been applied although it failed.
    pub fn is_ambiguous(&self) -> bool {
        self.failure == Failure::Ambiguous
    }

    /// The HTTP status the server refused the request with, if it did.
    pub fn status_code(&self) -> Option<u16> {
        match self.failure {
            Failure::Refused(code) => Some(code),
            _ => None,
        }
    }
}

/// The IPPools of the namespace: one per range, or per node slice. Each call is one request; none retries.
///
/// Pool entries are keyed by the decimal offset of the address from the range's network address
/// (`spec.allocations["<offset>"]`). Guarded writes apply to the latest object and test what they change
/// ([`guard`]), so writers of different entries never conflict and a write can never undo another writer's.
pub trait PoolStore: Send + Sync {
    /// The namespace the objects live in.
    fn namespace(&self) -> &str;

    /// Reads the pool `name`, or `None` when it does not exist.
    fn get_pool(&self, name: &str) -> impl Future<Output = Result<Option<IpPool>, StoreError>> + Send;

    /// Creates the pool `new` describes.
    fn create_pool(&self, new: &NewPool<'_>) -> impl Future<Output = Result<Created<IpPool>, StoreError>> + Send;

    /// Every pool of the namespace.
    fn list_pools(&self) -> impl Future<Output = Result<Vec<IpPool>, StoreError>> + Send;

    /// One cheap read that shows the server is reachable and lets us read pools (CNI STATUS).
    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Adds `entry` at `offset` if, and only if, no entry is there and what the claim decided on is as it `read`
    /// it ([`guard::add_entry`]).
    fn add_allocation(
        &self,
        pool: &str,
        offset: u128,
        entry: &IpAllocation,
        read: &AsRead,
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;

    /// Replaces the entry at `offset` with `entry` if it still holds `expected`'s container, pod and interface
    /// ([`guard::replace_entry`]).
    fn replace_allocation(
        &self,
        pool: &str,
        offset: u128,
        expected: &IpAllocation,
        entry: &IpAllocation,
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;

    /// Removes the entry at `offset` if it still holds `held`'s container, pod and interface (the interface only
    /// when `held` records one). With `record` (a pool with a reuse cooldown), the same guarded patch writes the
    /// release time and prunes the expired records, each only if it still has the value read
    /// ([`guard::remove_entry`]).
    fn remove_allocation(
        &self,
        pool: &str,
        offset: u128,
        held: &IpAllocation,
        record: Option<&ReleaseRecord>,
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;

    /// Sets the pool's reuse cooldown ([`crate::cooldown::COOLDOWN_ANNOTATION`]) to `seconds`, `0` removing it;
    /// with a cooldown, makes `spec.released` when the pool has none. Returns the pool as stored after, `None` when
    /// it does not exist: with a cooldown and still no `spec.released`, the installed schema prunes it.
    fn set_pool_cooldown(
        &self,
        name: &str,
        seconds: u64,
    ) -> impl Future<Output = Result<Option<IpPool>, StoreError>> + Send;

    /// Deletes the pool `name` if it is still at `version` (the leader, before it frees an empty slice).
    fn delete_pool(&self, name: &str, version: &Version) -> impl Future<Output = Result<Deleted, StoreError>> + Send;

    /// Rewrites the release record at `offset` of pool `name` from `read` to `now` if it still has the value read
    /// ([`guard::retime_release`]).
    fn retime_release(
        &self,
        name: &str,
        offset: u128,
        read: &str,
        now: &str,
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;

    /// Applies `patch` — the documents of one or more guards end to end, applied all or nothing — to the pool
    /// `name` in one request; `Applied` comes with the pool as stored after. The node agent's group commit
    /// ([`Shared`]) sends its batches through this.
    fn apply_pool_patch(
        &self,
        name: &str,
        op: &str,
        patch: &json_patch::Patch,
    ) -> impl Future<Output = Result<(Patched, Option<IpPool>), StoreError>> + Send;

    /// The pool `name` as this process last saw it, without a request: a hint for a plan, never evidence — what a
    /// plan on it decides is written with guards, and what it cannot find (a free address, the pool itself) is
    /// read fresh before anyone is told. `None`: nothing is kept.
    fn cached_pool(&self, _name: &str) -> Option<IpPool> {
        None
    }

    /// Offsets of pool `pool` that claims of this process are writing right now: not to be planned by another.
    fn in_flight(&self, _pool: &str) -> BTreeSet<u128> {
        BTreeSet::new()
    }

    /// Marks `offset` of `pool` as being written by one claim of this process until [`PoolStore::unhold`]:
    /// `false` when another claim of this process already holds it.
    fn hold(&self, _pool: &str, _offset: u128) -> bool {
        true
    }

    /// Ends what [`PoolStore::hold`] began.
    fn unhold(&self, _pool: &str, _offset: u128) {}

    /// Waits for this process's turn to create the missing pool `name`, so that concurrent ADDs that find it
    /// missing create it once: the one after takes what the one before created ([`PoolStore::cached_pool`]).
    /// `None`: the store has no turns.
    fn create_turn(&self, _name: &str) -> impl Future<Output = Option<Turn>> + Send {
        async { None }
    }
}

/// The OverlappingRangeIPReservations of the namespace: the cluster-wide claim on each address.
pub trait ReservationStore: Send + Sync {
    /// Reads the reservation `name`, or `None` when it does not exist.
    fn get_reservation(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<OverlappingRangeIpReservation>, StoreError>> + Send;

    /// Creates the reservation `name` for `claim`.
    fn create_reservation(
        &self,
        name: &str,
        claim: &Claim,
    ) -> impl Future<Output = Result<Created<OverlappingRangeIpReservation>, StoreError>> + Send;

    /// Rewrites the reservation `current` (as read) to `claim` if it has not changed since it was read: a new
    /// sandbox of the same attachment takes its own claim over, so the earlier sandbox's guarded delete (which
    /// expects the version it read) can no longer remove it ([`guard::take_over`]).
    fn take_over_reservation(
        &self,
        current: &OverlappingRangeIpReservation,
        claim: &Claim,
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;

    /// Deletes the reservation `name` if it is still at `version`.
    fn delete_reservation(
        &self,
        name: &str,
        version: &Version,
    ) -> impl Future<Output = Result<Deleted, StoreError>> + Send;

    /// Every reservation of the namespace, or only those labelled with `node` ([`NODE_LABEL`]).
    fn list_reservations(
        &self,
        node: Option<&str>,
    ) -> impl Future<Output = Result<Vec<OverlappingRangeIpReservation>, StoreError>> + Send;
}

/// The NodeSlicePools of the namespace (node slices mode).
pub trait SliceStore: Send + Sync {
    /// Reads the NodeSlicePool `name`, or `None` when it does not exist.
    fn get_node_slices(&self, name: &str) -> impl Future<Output = Result<Option<NodeSlicePool>, StoreError>> + Send;

    /// Creates the NodeSlicePool `name` with `slices` as its status (no status subresource: Whereabouts' CRD has
    /// none, and its controller writes the status with the object).
    fn create_node_slices(
        &self,
        name: &str,
        spec: &NodeSlicePoolSpec,
        slices: &[NodeSliceAllocation],
    ) -> impl Future<Output = Result<Created<NodeSlicePool>, StoreError>> + Send;

    /// Gives the slice at `index` of the NodeSlicePool `name` to node `to` if it is still `slice` held by `from`
    /// (`""`: free). Of two nodes claiming one free slice, exactly one succeeds; a slice is freed the same way
    /// ([`guard::move_slice`]).
    fn move_slice(
        &self,
        name: &str,
        index: usize,
        slice: &NodeSliceAllocation,
        to: &str,
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;

    /// Cuts the slice at `index` of the NodeSlicePool `name` if it is still `slice` (adaptive slices): node `to` gets
    /// its part `kept`, the other parts `rest` are listed free ([`guard::split_slice`]).
    fn split_slice(
        &self,
        name: &str,
        index: usize,
        slice: &NodeSliceAllocation,
        to: &str,
        kept: &str,
        rest: &[String],
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;

    /// Joins the free slices `a` at `i` and `b` at `j` of the NodeSlicePool `name` into `parent` if both are still as
    /// read ([`guard::join_slices`]).
    fn join_slices(
        &self,
        name: &str,
        i: usize,
        a: &NodeSliceAllocation,
        j: usize,
        b: &NodeSliceAllocation,
        parent: &str,
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;

    /// Every NodeSlicePool of the namespace.
    fn list_node_slices(&self) -> impl Future<Output = Result<Vec<NodeSlicePool>, StoreError>> + Send;

    /// Sets the owner references of the NodeSlicePool `name` to `kept` if it is still at `version`
    /// ([`guard::keep_owners`]).
    fn keep_node_slices_owners(
        &self,
        name: &str,
        version: &str,
        kept: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;

    /// The NodeSlicePool `name` as this process last saw it, without a request: a hint, as
    /// [`PoolStore::cached_pool`]. `None`: nothing is kept.
    fn cached_node_slices(&self, _name: &str) -> Option<NodeSlicePool> {
        None
    }

    /// Waits for this process's turn to claim a slice of the NodeSlicePool `name`, so that concurrent ADDs of one
    /// node that all find its slices full claim one slice, not one each. `None`: the store has no turns (each
    /// process does one invocation, and the host lock makes them take turns).
    fn slice_turn(&self, _name: &str) -> impl Future<Output = Option<Turn>> + Send {
        async { None }
    }
}

/// The cloud sub-interface records of provider-backed pools (IaaS provider mode).
pub trait SubInterfaceStore: Send + Sync {
    /// Records the cloud sub-interface of the address at `offset` of pool `name`, creating the pool's map when it
    /// has none. Only that offset's record is written: the caller holds its entry, and the provider writes back
    /// only idle ones.
    fn set_sub_interface(
        &self,
        name: &str,
        offset: u128,
        record: &SubInterfaceRecord,
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;

    /// Removes the sub-interface record at `offset` of pool `name` if it still names `node` (the leader, once the
    /// provider accepted its release; [`guard::remove_sub_interface`]).
    fn remove_sub_interface(
        &self,
        name: &str,
        offset: u128,
        node: &str,
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;
}

/// What an ADD reads and tells of the core API group: pods', namespaces' and nodes' metadata, Events on pods.
pub trait CoreStore: Send + Sync {
    /// Puts a Warning Event with `reason` and `message` on `pod`, from the CNI plugin on `node` (e.g. candidate
    /// ranges a config gave and this ADD left out). Best effort for the caller: an Event is news, not state.
    fn warn_pod(
        &self,
        pod: &PodEvent<'_>,
        reason: &str,
        message: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The metadata of the `kind` object `name` (in `namespace` for a pod), or `None` when it does not exist: the
    /// annotations and labels a range choice reads. Only configs that choose ranges per pod or node call this.
    fn core_metadata(
        &self,
        kind: CoreObject,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ObjectMeta>, StoreError>> + Send;
}

/// IPAMClaims (`ipamclaims.k8s.cni.cncf.io`): read by an ADD whose pod names one, and their status written.
pub trait IpamClaimStore: Send + Sync {
    /// The claim `name` in `namespace`, or `None` when it does not exist.
    fn get_ipamclaim(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<crate::crd::IpamClaim>, StoreError>> + Send;

    /// Writes `status` on the claim `current` if it is still at the version read ([`guard::claim_status`]).
    fn set_ipamclaim_status(
        &self,
        current: &crate::crd::IpamClaim,
        status: &crate::crd::IpamClaimStatus,
    ) -> impl Future<Output = Result<Patched, StoreError>> + Send;
}

/// Every concern at once: what a store that talks to the API server (or stands in for it) offers. Use cases take
/// only the parts they use.
pub trait Store: PoolStore + ReservationStore + SliceStore + SubInterfaceStore + CoreStore + IpamClaimStore {}

impl<T: PoolStore + ReservationStore + SliceStore + SubInterfaceStore + CoreStore + IpamClaimStore> Store for T {}

/// An object of the core API group whose metadata a range choice reads (ranges chosen per pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CoreObject {
    /// A Pod, for its annotations.
    Pod,
    /// A Namespace, for the default of its pods.
    Namespace,
    /// A Node, for its labels.
    Node,
}

impl CoreObject {
    /// The kind as messages name it.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Pod => "pod",
            Self::Namespace => "namespace",
            Self::Node => "node",
        }
    }
}

/// The pod an Event is about, and where it comes from.
#[derive(Debug, Clone, Copy)]
pub struct PodEvent<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: Option<&'a str>,
    /// The node the reporting plugin runs on.
    pub node: &'a str,
}

/// `node` as a label value, if it is one: at most 63 characters, alphanumerics, `-`, `_` and `.`, starting and
/// ending with an alphanumeric. Node names are DNS subdomains of up to 253 characters, so some are not.
pub fn node_label_value(node: &str) -> Option<&str> {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let valid = !node.is_empty()
        && node.len() <= 63
        && node.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && alnum(node.chars().next())
        && alnum(node.chars().last());
    valid.then_some(node)
}

/// When the reservation was last claimed: its [`CLAIMED_ANNOTATION`], else its creation time.
pub fn claimed_at(reservation: &OverlappingRangeIpReservation) -> Option<k8s_openapi::jiff::Timestamp> {
    let annotated: Option<k8s_openapi::jiff::Timestamp> =
        reservation.metadata.annotations.as_ref().and_then(|a| a.get(CLAIMED_ANNOTATION)?.parse().ok());
    let created = reservation.metadata.creation_timestamp.as_ref().map(|t| t.0);
    match (annotated, created) {
        (Some(a), Some(c)) => Some(a.max(c)),
        (a, c) => a.or(c),
    }
}

/// The reservation object a claim is written as.
pub fn reservation_object(name: &str, claim: &Claim) -> OverlappingRangeIpReservation {
    let mut reservation = OverlappingRangeIpReservation::new(name, claim.spec.clone());
    if let Some(node) = node_label_value(&claim.node) {
        reservation.metadata.labels = Some([(NODE_LABEL.to_string(), node.to_string())].into());
    }
    reservation.metadata.annotations = Some([(CLAIMED_ANNOTATION.to_string(), claim.at.to_string())].into());
    reservation
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(range: &str, usable: Option<&str>) -> IpPool {
        let mut pool = IpPool::new("p", crate::crd::IpPoolSpec { range: range.into(), ..Default::default() });
        if let Some(u) = usable {
            pool.metadata.annotations = Some([(USABLE_ANNOTATION.to_string(), u.to_string())].into());
        }
        pool
    }

    #[test]
    fn capacity_is_the_configs_else_the_ranges() {
        assert_eq!(capacity(&pool("198.18.0.0/24", Some("100"))), 100);
        assert_eq!(
            capacity(&pool("198.18.0.0/24", None)),
            254,
            "Whereabouts' pool: the range less network and broadcast"
        );
        assert_eq!(capacity(&pool("198.18.0.0/24", Some("many"))), 254, "an unreadable annotation is passed over");
    }

    #[test]
    fn node_names_as_label_values() {
        assert_eq!(node_label_value("node-1.example.com"), Some("node-1.example.com"));
        assert_eq!(node_label_value(""), None);
        assert_eq!(node_label_value(&"a".repeat(64)), None);
        assert_eq!(node_label_value(&"a".repeat(63)), Some("a".repeat(63).as_str()));
        assert_eq!(node_label_value("-node"), None);
        assert_eq!(node_label_value("node."), None);
    }
}
