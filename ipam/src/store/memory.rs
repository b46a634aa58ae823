//! [`MemoryStore`]: the [`Store`] in memory, with the faults of a real cluster injected per call. For tests only:
//! it proves the protocol's invariants under faults in property tests; the live server proves it works.
//!
//! Handles made with [`MemoryStore::handle`] share one state, as processes share an API server, and each has its
//! own fault plan, so one "process" can be killed while the others go on. Every call yields to the scheduler a
//! random number of times before and after it is applied, so that concurrent callers on one tokio runtime
//! interleave differently in every case.
//!
//! The semantics are the API server's as far as the protocol relies on them: creates answer `Exists` for a name
//! taken, patches are the documents [`super::guard`] builds for the live store too, applied to the latest object
//! through its JSON and refused (422) when a `test` fails, deletes check their preconditions, every write bumps a
//! resourceVersion. The store has no guard of its own: a guard that is wrong is wrong here too.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{
    Claim, CoreStore, Created, Deleted, Failure, NODE_LABEL, Patched, PoolStore, ReservationStore, SliceStore,
    StoreError, SubInterfaceStore, Version, guard,
};
use crate::crd::{
    IpAllocation, IpPool, NodeSliceAllocation, NodeSlicePool, NodeSlicePoolSpec, OverlappingRangeIpReservation,
    SubInterfaceRecord,
};

/// A fault injected into one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// The write is applied, the answer is lost (a reset, GOAWAY, a budget cut): the caller sees an ambiguous
    /// failure.
    LostResponse,
    /// 409 Conflict from the server's own retries: nothing applied.
    Conflict,
    /// An admission policy refuses the write, as the shipped node policy answers (403 Forbidden): nothing applied.
    Refused,
    /// 429 Too Many Requests: nothing applied.
    TooMany,
    /// 500 Internal Server Error: applied or not, at random; the caller cannot tell.
    ServerError,
    /// No answer for a while, then a timeout: applied or not, at random.
    Timeout,
    /// The process dies at this call (applied or not, at random): this handle never answers again.
    Die,
    /// Applied when the request arrives; its answer comes 5 s later (a slow link). Not among [`Fault::ALL`]: a
    /// test places it where a stale answer on the wire is the point.
    LateAnswer,
    /// The request reaches the server 5 s late (a slow link), then is applied and answered. Not among
    /// [`Fault::ALL`]: a test places it where others' writes must come between the read and the write.
    LateRequest,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 7] = [
        Fault::LostResponse,
        Fault::Conflict,
        Fault::Refused,
        Fault::TooMany,
        Fault::ServerError,
        Fault::Timeout,
        Fault::Die,
    ];
}

/// The operations, to aim scripted faults at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    GetPool,
    CreatePool,
    ListPools,
    Probe,
    AddAllocation,
    ReplaceAllocation,
    RemoveAllocation,
    GetReservation,
    CreateReservation,
    TakeOverReservation,
    DeleteReservation,
    ListReservations,
    GetNodeSlices,
    CreateNodeSlices,
    MoveSlice,
    ListNodeSlices,
    DeletePool,
    SetSubInterface,
    RemoveSubInterface,
    WarnPod,
    CoreMetadata,
    SetPoolCooldown,
    RetimeRelease,
    KeepNodeSlicesOwners,
    GetIpamClaim,
    SetIpamClaimStatus,
}

impl Op {
    fn is_write(self) -> bool {
        !matches!(
            self,
            Op::GetPool
                | Op::ListPools
                | Op::Probe
                | Op::GetReservation
                | Op::ListReservations
                | Op::GetNodeSlices
                | Op::ListNodeSlices
                | Op::CoreMetadata
                | Op::GetIpamClaim
        )
    }
}

/// SplitMix64: small, seedable, good enough to pick faults and interleavings.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// Which faults a handle suffers: random ones at a rate, and scripted ones at the n-th call of an operation.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    rng: Rng,
    /// Probability that a call suffers a random fault.
    pub rate: f64,
    /// The faults random injection picks from.
    pub kinds: Vec<Fault>,
    /// At most this many yields to the scheduler before and after each call.
    pub max_yields: u32,
    /// At most this long (in ms of the runtime's clock) on the way to the server and back: calls that overlap in
    /// time, as a node agent's concurrent writes do on a real network.
    pub max_latency_ms: u64,
    scripted: HashMap<Op, Vec<(u32, Fault)>>,
    calls: HashMap<Op, u32>,
}

impl FaultPlan {
    /// No random faults; interleaving driven by `seed`.
    pub fn quiet(seed: u64) -> Self {
        Self {
            rng: Rng::new(seed),
            rate: 0.0,
            kinds: Vec::new(),
            max_yields: 3,
            max_latency_ms: 0,
            scripted: HashMap::new(),
            calls: HashMap::new(),
        }
    }

    /// Random faults of `kinds` at `rate` per call.
    pub fn random(seed: u64, rate: f64, kinds: &[Fault]) -> Self {
        Self { rate, kinds: kinds.to_vec(), ..Self::quiet(seed) }
    }

    /// The `nth` call (from 1) of `op` suffers `fault`.
    pub fn at(mut self, op: Op, nth: u32, fault: Fault) -> Self {
        self.scripted.entry(op).or_default().push((nth, fault));
        self
    }

    fn next(&mut self, op: Op) -> Option<Fault> {
        let n = self.calls.entry(op).or_default();
        *n += 1;
        let n = *n;
        if let Some(scripted) = self.scripted.get(&op).and_then(|s| s.iter().find(|(at, _)| *at == n)) {
            return Some(scripted.1);
        }
        if self.kinds.is_empty() || !self.rng.chance(self.rate) {
            return None;
        }
        let fault = self.kinds[self.rng.below(self.kinds.len() as u64) as usize];
        // faults that only make sense for writes
        let write_only = matches!(fault, Fault::LostResponse | Fault::Refused | Fault::Conflict);
        (!write_only || op.is_write()).then_some(fault)
    }
}

#[derive(Debug, Default)]
struct State {
    pools: BTreeMap<String, IpPool>,
    reservations: BTreeMap<String, OverlappingRangeIpReservation>,
    node_slices: BTreeMap<String, NodeSlicePool>,
    version: u64,
    writes: u64,
    faults: BTreeMap<Fault, u64>,
    /// Warning Events put on pods: `(namespace/name, reason, message)`.
    events: Vec<(String, String, String)>,
    /// Pods, namespaces and nodes, by kind, namespace (`""` for the cluster-scoped) and name.
    core: BTreeMap<(super::CoreObject, String, String), super::ObjectMeta>,
    /// IPAMClaims, by namespace and name.
    ipamclaims: BTreeMap<(String, String), crate::crd::IpamClaim>,
    /// The API server is down (stopped, restarting): every call of every process is refused unsent.
    away: bool,
}

impl State {
    fn bump(&mut self) -> String {
        self.version += 1;
        self.writes += 1;
        self.version.to_string()
    }
}

#[derive(Debug)]
struct Actor {
    name: String,
    plan: Mutex<FaultPlan>,
    dead: AtomicBool,
}

/// Pools and reservations in memory, with faults. See the module documentation.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    actor: Arc<Actor>,
    namespace: String,
    pool_limit: Option<usize>,
    /// Prunes what upstream Whereabouts' IPPool schema does not declare, as its CRD makes the API server do.
    whereabouts_schema: bool,
}

impl MemoryStore {
    /// An empty store whose first handle suffers no faults.
    pub fn new(namespace: &str) -> Self {
        Self {
            state: Arc::default(),
            actor: Arc::new(Actor { name: "main".into(), plan: Mutex::new(FaultPlan::quiet(0)), dead: false.into() }),
            namespace: namespace.to_string(),
            pool_limit: None,
            whereabouts_schema: false,
        }
    }

    /// Refuses (as etcd does with "request is too large") a pool write that would leave more than `entries`.
    pub fn with_pool_limit(mut self, entries: usize) -> Self {
        self.pool_limit = Some(entries);
        self
    }

    /// Prunes from every pool written what upstream Whereabouts' IPPool schema does not declare (`spec.released`,
    /// `spec.subInterfaces`, and every entry field but `id`, `podref` and `ifname`), as the API server does under
    /// its CRD.
    pub fn with_whereabouts_schema(mut self) -> Self {
        self.whereabouts_schema = true;
        self
    }

    fn prune(&self, pool: &mut IpPool) {
        if !self.whereabouts_schema {
            return;
        }
        pool.spec.released = None;
        pool.spec.sub_interfaces.clear();
        pool.spec.node_name = None;
        for entry in pool.spec.allocations.values_mut() {
            *entry = IpAllocation {
                id: entry.id.clone(),
                podref: entry.podref.clone(),
                ifname: entry.ifname.clone(),
                ..IpAllocation::default()
            };
        }
    }

    /// Another handle on the same state (another process), named `name`, suffering `plan`.
    pub fn handle(&self, name: &str, plan: FaultPlan) -> Self {
        Self {
            actor: Arc::new(Actor { name: name.to_string(), plan: Mutex::new(plan), dead: false.into() }),
            ..self.clone()
        }
    }

    /// Kills this handle's process (a node rebooted under it): it never answers again.
    pub fn kill(&self) {
        self.actor.dead.store(true, Ordering::SeqCst);
    }

    /// Takes the API server away from every process (`true`: each call is refused before it is sent), or brings
    /// it back.
    pub fn set_away(&self, away: bool) {
        self.state.lock().unwrap().away = away;
    }

    /// Whether this handle's process died at a [`Fault::Die`].
    pub fn is_dead(&self) -> bool {
        self.actor.dead.load(Ordering::SeqCst)
    }

    /// The handle's name.
    pub fn name(&self) -> &str {
        &self.actor.name
    }

    /// The Warning Events put on pods so far: `(namespace/name, reason, message)`.
    pub fn events(&self) -> Vec<(String, String, String)> {
        self.state.lock().unwrap().events.clone()
    }

    /// Every pool, as stored now.
    pub fn pools(&self) -> Vec<IpPool> {
        self.state.lock().unwrap().pools.values().cloned().collect()
    }

    /// Every reservation, as stored now.
    pub fn reservations(&self) -> Vec<OverlappingRangeIpReservation> {
        self.state.lock().unwrap().reservations.values().cloned().collect()
    }

    /// Every NodeSlicePool, as stored now.
    pub fn node_slices(&self) -> Vec<NodeSlicePool> {
        self.state.lock().unwrap().node_slices.values().cloned().collect()
    }

    /// Writes `object` as it is (test set-up, e.g. what Whereabouts' node-slice controller wrote).
    pub fn put_node_slices(&self, object: NodeSlicePool) {
        let mut state = self.state.lock().unwrap();
        let mut object = object;
        object.metadata.resource_version = Some(state.bump());
        state.node_slices.insert(object.metadata.name.clone().unwrap_or_default(), object);
    }

    /// Deletes the NodeSlicePool `name` unconditionally, as a manual delete or the garbage collector does (test
    /// set-up).
    pub fn force_delete_node_slices(&self, name: &str) -> bool {
        let mut state = self.state.lock().unwrap();
        let found = state.node_slices.remove(name).is_some();
        if found {
            state.bump();
        }
        found
    }

    /// How many writes were applied so far, by every handle.
    pub fn writes(&self) -> u64 {
        self.state.lock().unwrap().writes
    }

    /// How many faults of each kind were injected so far, over every handle.
    pub fn faults(&self) -> BTreeMap<Fault, u64> {
        self.state.lock().unwrap().faults.clone()
    }

    /// Puts a pod (in `namespace`), namespace or node with `meta`, for range choices to read.
    pub fn put_core(&self, kind: super::CoreObject, namespace: &str, name: &str, meta: super::ObjectMeta) {
        let ns = if kind == super::CoreObject::Pod { namespace } else { "" };
        self.state.lock().unwrap().core.insert((kind, ns.to_string(), name.to_string()), meta);
    }

    /// Creates the IPAMClaim `name` in `namespace` for `network` (test set-up: KubeVirt's part).
    pub fn put_ipamclaim(&self, namespace: &str, name: &str, network: &str, interface: &str) {
        let mut claim = crate::crd::IpamClaim::new(
            name,
            crate::crd::IpamClaimSpec { network: network.into(), interface: interface.into() },
        );
        claim.metadata.namespace = Some(namespace.into());
        let mut state = self.state.lock().unwrap();
        claim.metadata.resource_version = Some(state.bump());
        state.ipamclaims.insert((namespace.into(), name.into()), claim);
    }

    /// The IPAMClaim `name` in `namespace`, as stored now.
    pub fn ipamclaim(&self, namespace: &str, name: &str) -> Option<crate::crd::IpamClaim> {
        self.state.lock().unwrap().ipamclaims.get(&(namespace.into(), name.into())).cloned()
    }

    /// Deletes the IPAMClaim `name` in `namespace` (test set-up: the VM is deleted).
    pub fn delete_ipamclaim(&self, namespace: &str, name: &str) {
        let mut state = self.state.lock().unwrap();
        state.ipamclaims.remove(&(namespace.into(), name.into()));
        state.bump();
    }

    /// Writes `pool` as it is (test set-up, e.g. entries another tool wrote).
    pub fn put_pool(&self, pool: IpPool) {
        let mut pool = pool;
        self.prune(&mut pool);
        let mut state = self.state.lock().unwrap();
        pool.metadata.resource_version = Some(state.bump());
        state.pools.insert(pool.metadata.name.clone().unwrap_or_default(), pool);
    }

    /// Deletes the reservation `name` unconditionally, as Whereabouts' DEL does (test set-up).
    pub fn force_delete_reservation(&self, name: &str) -> bool {
        let mut state = self.state.lock().unwrap();
        let found = state.reservations.remove(name).is_some();
        if found {
            state.bump();
        }
        found
    }

    async fn shuffle(&self) {
        let (yields, latency) = {
            let mut plan = self.actor.plan.lock().unwrap();
            let (max, latency) = (plan.max_yields, plan.max_latency_ms);
            let latency = if latency == 0 { 0 } else { plan.rng.below(latency + 1) };
            (plan.rng.below(u64::from(max) + 1), latency)
        };
        for _ in 0..yields {
            tokio::task::yield_now().await;
        }
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
    }

    /// Runs one call: the interleaving, the fault if any, and `apply` (under the state lock) when the request
    /// reaches the "server".
    async fn call<T>(
        &self,
        op: Op,
        kind: &'static str,
        name: &str,
        apply: impl FnOnce(&mut State) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if self.is_dead() {
            return std::future::pending().await;
        }
        self.shuffle().await;
        if self.state.lock().unwrap().away {
            let message = "injected: connection refused (the API server is away)".to_string();
            return Err(StoreError::new(kind, name, format!("{op:?}"), Failure::Unavailable, message));
        }
        let (fault, coin) = {
            let mut plan = self.actor.plan.lock().unwrap();
            let fault = plan.next(op);
            (fault, plan.rng.chance(0.5))
        };
        let fail = |failure: Failure, message: &str| {
            Err(StoreError::new(kind, name, format!("{op:?}"), failure, format!("injected: {message}")))
        };
        let Some(fault) = fault else {
            let result = apply(&mut self.state.lock().unwrap());
            self.shuffle().await;
            return result;
        };
        self.state.lock().unwrap().faults.entry(fault).and_modify(|n| *n += 1).or_insert(1);
        tracing::debug!(process = %self.actor.name, ?op, object = name, ?fault, applied_if_coin = coin, "fault injected");
        match fault {
            Fault::LostResponse => {
                let _ = apply(&mut self.state.lock().unwrap());
                fail(Failure::Ambiguous, "connection reset after the request was sent")
            }
            Fault::Conflict => fail(Failure::Unavailable, "409 the object has been modified"),
            // a patch caller turns this into `Patched::Refused`, which it cannot tell from a failed test
            Fault::Refused => fail(Failure::Refused(403), "403 denied by an admission policy"),
            Fault::TooMany => fail(Failure::Unavailable, "429 too many requests"),
            Fault::ServerError | Fault::Timeout => {
                if fault == Fault::Timeout {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                if coin {
                    let _ = apply(&mut self.state.lock().unwrap());
                }
                fail(Failure::Ambiguous, "500, or no answer before the timeout")
            }
            Fault::LateRequest => {
                tokio::time::sleep(Duration::from_secs(5)).await;
                apply(&mut self.state.lock().unwrap())
            }
            Fault::LateAnswer => {
                let result = apply(&mut self.state.lock().unwrap());
                tokio::time::sleep(Duration::from_secs(5)).await;
                result
            }
            Fault::Die => {
                if coin {
                    let _ = apply(&mut self.state.lock().unwrap());
                }
                self.actor.dead.store(true, Ordering::SeqCst);
                std::future::pending().await
            }
        }
    }
}

/// A 422 is how the server refuses a patch: the caller of a guarded patch sees it as [`Patched::Refused`].
fn refused_as_patched(result: Result<Patched, StoreError>) -> Result<Patched, StoreError> {
    match result {
        Err(e) if e.status_code() == Some(422) => Ok(Patched::Refused(e.message)),
        other => other,
    }
}

/// What a patch does to a stored object: `Ok(false)` when the server refuses it (422: a `test` failed).
enum Change<'p> {
    Guarded(&'p json_patch::Patch),
    Merge(&'p Value),
}

/// Applies `change` to `object` as the API server would, through the object's JSON: `Err` with the refusal when a
/// guard fails (the object is then untouched).
fn patch_object<K: Serialize + DeserializeOwned>(object: &mut K, change: &Change<'_>) -> Result<(), String> {
    let mut doc = serde_json::to_value(&*object).expect("the CRD types serialise");
    match change {
        Change::Guarded(patch) => guard::apply(&mut doc, patch).map_err(|e| e.to_string())?,
        Change::Merge(patch) => guard::merge(&mut doc, patch),
    }
    // a patch the schema would refuse (a value of the wrong type) is refused too
    *object = serde_json::from_value(doc).map_err(|e| format!("the patched object is invalid: {e}"))?;
    Ok(())
}

impl MemoryStore {
    /// Applies `change` to the pool `name`: what the API server does with a patch of it.
    fn patch_pool(&self, state: &mut State, name: &str, change: &Change<'_>) -> Result<Patched, StoreError> {
        let Some(current) = state.pools.get(name) else { return Ok(Patched::Missing) };
        let mut pool = current.clone();
        if let Err(refusal) = patch_object(&mut pool, change) {
            return Ok(Patched::Refused(refusal));
        }
        if self.pool_limit.is_some_and(|l| pool.spec.allocations.len() > l) {
            return Err(StoreError::new(
                "pool",
                name,
                "patch",
                Failure::TooLarge,
                "500 etcdserver: request is too large".into(),
            ));
        }
        self.prune(&mut pool);
        pool.metadata.resource_version = Some(state.bump());
        state.pools.insert(name.to_string(), pool);
        Ok(Patched::Applied)
    }

    /// One guarded or merge patch of pool `pool`, as one call.
    async fn pool_call(&self, op: Op, pool: &str, change: Change<'_>) -> Result<Patched, StoreError> {
        self.pool_call_with(op, pool, change, |_| {}).await
    }

    /// [`MemoryStore::pool_call`], `seen` shown the state right after the patch (applied or not).
    async fn pool_call_with(
        &self,
        op: Op,
        pool: &str,
        change: Change<'_>,
        seen: impl FnOnce(&State),
    ) -> Result<Patched, StoreError> {
        let result = self
            .call(op, "pool", pool, |s| {
                let patched = self.patch_pool(s, pool, &change);
                seen(s);
                patched
            })
            .await;
        refused_as_patched(result)
    }
}

impl PoolStore for MemoryStore {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn get_pool(&self, name: &str) -> Result<Option<IpPool>, StoreError> {
        self.call(Op::GetPool, "pool", name, |s| Ok(s.pools.get(name).cloned())).await
    }

    async fn create_pool(&self, new: &super::NewPool<'_>) -> Result<Created<IpPool>, StoreError> {
        let name = new.name;
        self.call(Op::CreatePool, "pool", name, |s| {
            if s.pools.contains_key(name) {
                return Ok(Created::Exists);
            }
            let mut pool = new.object();
            pool.metadata.namespace = Some(self.namespace.clone());
            pool.metadata.resource_version = Some(s.bump());
            pool.metadata.uid = Some(format!("uid-{}", s.version));
            pool.metadata.creation_timestamp = Some(Time(crate::clock::now()));
            s.pools.insert(name.to_string(), pool.clone());
            Ok(Created::Created(pool))
        })
        .await
    }

    async fn list_pools(&self) -> Result<Vec<IpPool>, StoreError> {
        self.call(Op::ListPools, "pool", "*", |s| Ok(s.pools.values().cloned().collect())).await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.call(Op::Probe, "pool", "*", |_| Ok(())).await
    }

    async fn apply_pool_patch(
        &self,
        name: &str,
        _op: &str,
        patch: &json_patch::Patch,
    ) -> Result<(Patched, Option<IpPool>), StoreError> {
        // faults as for the write it most often carries: an agent's batch of entries
        let mut after = None;
        let patched = self
            .pool_call_with(Op::AddAllocation, name, Change::Guarded(patch), |s| after = s.pools.get(name).cloned())
            .await?;
        let applied = patched == Patched::Applied;
        Ok((patched, after.filter(|_| applied)))
    }

    async fn add_allocation(
        &self,
        pool: &str,
        offset: u128,
        entry: &IpAllocation,
        read: &super::AsRead,
    ) -> Result<Patched, StoreError> {
        self.pool_call(Op::AddAllocation, pool, Change::Guarded(&guard::add_entry(offset, entry, read))).await
    }

    async fn replace_allocation(
        &self,
        pool: &str,
        offset: u128,
        expected: &IpAllocation,
        entry: &IpAllocation,
    ) -> Result<Patched, StoreError> {
        let patch = guard::replace_entry(offset, expected, entry);
        self.pool_call(Op::ReplaceAllocation, pool, Change::Guarded(&patch)).await
    }

    async fn remove_allocation(
        &self,
        pool: &str,
        offset: u128,
        held: &IpAllocation,
        record: Option<&super::ReleaseRecord>,
    ) -> Result<Patched, StoreError> {
        let patch = guard::remove_entry(offset, held, record);
        let make_released = guard::make_released();
        refused_as_patched(
            self.call(Op::RemoveAllocation, "pool", pool, |s| {
                // the live store makes the map in a request of its own, before the guarded patch
                if record.is_some_and(|r| !r.map_exists) {
                    match self.patch_pool(s, pool, &Change::Merge(&make_released))? {
                        Patched::Applied => {}
                        other => return Ok(other),
                    }
                }
                self.patch_pool(s, pool, &Change::Guarded(&patch))
            })
            .await,
        )
    }

    async fn set_pool_cooldown(&self, name: &str, seconds: u64) -> Result<Option<IpPool>, StoreError> {
        match self.pool_call(Op::SetPoolCooldown, name, Change::Merge(&guard::set_cooldown(seconds))).await? {
            Patched::Applied => Ok(self.state.lock().unwrap().pools.get(name).cloned()),
            Patched::Missing | Patched::Refused(_) => Ok(None),
        }
    }

    async fn retime_release(&self, name: &str, offset: u128, read: &str, now: &str) -> Result<Patched, StoreError> {
        let patch = guard::retime_release(offset, read, now);
        self.pool_call(Op::RetimeRelease, name, Change::Guarded(&patch)).await
    }

    async fn delete_pool(&self, name: &str, version: &Version) -> Result<Deleted, StoreError> {
        self.call(Op::DeletePool, "pool", name, |s| {
            let Some(stored) = s.pools.get(name) else { return Ok(Deleted::Missing) };
            if !version.matches(&stored.metadata) {
                return Ok(Deleted::Changed);
            }
            s.pools.remove(name);
            s.bump();
            Ok(Deleted::Deleted)
        })
        .await
    }
}

impl SubInterfaceStore for MemoryStore {
    async fn set_sub_interface(
        &self,
        name: &str,
        offset: u128,
        record: &SubInterfaceRecord,
    ) -> Result<Patched, StoreError> {
        let patch = guard::record_sub_interface(offset, record);
        self.pool_call(Op::SetSubInterface, name, Change::Merge(&patch)).await
    }

    async fn remove_sub_interface(&self, name: &str, offset: u128, node: &str) -> Result<Patched, StoreError> {
        let patch = guard::remove_sub_interface(offset, node);
        self.pool_call(Op::RemoveSubInterface, name, Change::Guarded(&patch)).await
    }
}

impl CoreStore for MemoryStore {
    async fn core_metadata(
        &self,
        kind: super::CoreObject,
        namespace: &str,
        name: &str,
    ) -> Result<Option<super::ObjectMeta>, StoreError> {
        let ns = if kind == super::CoreObject::Pod { namespace } else { "" };
        let key = (kind, ns.to_string(), name.to_string());
        self.call(Op::CoreMetadata, kind.kind(), name, |s| Ok(s.core.get(&key).cloned())).await
    }

    async fn warn_pod(&self, pod: &super::PodEvent<'_>, reason: &str, message: &str) -> Result<(), StoreError> {
        let what = format!("{}/{}", pod.namespace, pod.name);
        self.call(Op::WarnPod, "event on pod", &what, |s| {
            s.events.push((what.clone(), reason.to_string(), message.to_string()));
            Ok(())
        })
        .await
    }
}

impl super::IpamClaimStore for MemoryStore {
    async fn get_ipamclaim(&self, namespace: &str, name: &str) -> Result<Option<crate::crd::IpamClaim>, StoreError> {
        let key = (namespace.to_string(), name.to_string());
        self.call(Op::GetIpamClaim, "ipamclaim", name, |s| Ok(s.ipamclaims.get(&key).cloned())).await
    }

    async fn set_ipamclaim_status(
        &self,
        current: &crate::crd::IpamClaim,
        status: &crate::crd::IpamClaimStatus,
    ) -> Result<Patched, StoreError> {
        let key =
            (current.metadata.namespace.clone().unwrap_or_default(), current.metadata.name.clone().unwrap_or_default());
        let patch = guard::claim_status(current, status);
        refused_as_patched(
            self.call(Op::SetIpamClaimStatus, "ipamclaim", &key.1, |s| {
                let Some(stored) = s.ipamclaims.get(&key) else { return Ok(Patched::Missing) };
                let mut claim = stored.clone();
                if let Err(refusal) = patch_object(&mut claim, &Change::Guarded(&patch)) {
                    return Ok(Patched::Refused(refusal));
                }
                claim.metadata.resource_version = Some(s.bump());
                s.ipamclaims.insert(key.clone(), claim);
                Ok(Patched::Applied)
            })
            .await,
        )
    }
}

impl ReservationStore for MemoryStore {
    async fn get_reservation(&self, name: &str) -> Result<Option<OverlappingRangeIpReservation>, StoreError> {
        self.call(Op::GetReservation, "reservation", name, |s| Ok(s.reservations.get(name).cloned())).await
    }

    async fn create_reservation(
        &self,
        name: &str,
        claim: &Claim,
    ) -> Result<Created<OverlappingRangeIpReservation>, StoreError> {
        self.call(Op::CreateReservation, "reservation", name, |s| {
            if s.reservations.contains_key(name) {
                return Ok(Created::Exists);
            }
            let mut reservation = super::reservation_object(name, claim);
            reservation.metadata.namespace = Some(self.namespace.clone());
            reservation.metadata.resource_version = Some(s.bump());
            reservation.metadata.uid = Some(format!("uid-{}", s.version));
            reservation.metadata.creation_timestamp = Some(Time(crate::clock::now()));
            s.reservations.insert(name.to_string(), reservation.clone());
            Ok(Created::Created(reservation))
        })
        .await
    }

    async fn take_over_reservation(
        &self,
        current: &OverlappingRangeIpReservation,
        claim: &Claim,
    ) -> Result<Patched, StoreError> {
        let name = current.metadata.name.clone().unwrap_or_default();
        let patch = guard::take_over(current, claim);
        refused_as_patched(
            self.call(Op::TakeOverReservation, "reservation", &name, |s| {
                let Some(stored) = s.reservations.get(&name) else { return Ok(Patched::Missing) };
                let mut reservation = stored.clone();
                if let Err(refusal) = patch_object(&mut reservation, &Change::Guarded(&patch)) {
                    return Ok(Patched::Refused(refusal));
                }
                reservation.metadata.resource_version = Some(s.bump());
                s.reservations.insert(name.clone(), reservation);
                Ok(Patched::Applied)
            })
            .await,
        )
    }

    async fn delete_reservation(&self, name: &str, version: &Version) -> Result<Deleted, StoreError> {
        self.call(Op::DeleteReservation, "reservation", name, |s| {
            let Some(stored) = s.reservations.get(name) else { return Ok(Deleted::Missing) };
            if !version.matches(&stored.metadata) {
                return Ok(Deleted::Changed);
            }
            s.reservations.remove(name);
            s.bump();
            Ok(Deleted::Deleted)
        })
        .await
    }

    async fn list_reservations(&self, node: Option<&str>) -> Result<Vec<OverlappingRangeIpReservation>, StoreError> {
        self.call(Op::ListReservations, "reservation", "*", |s| {
            let on_node = |r: &OverlappingRangeIpReservation| match node {
                None => true,
                Some(node) => r.metadata.labels.as_ref().and_then(|l| l.get(NODE_LABEL)).is_some_and(|n| n == node),
            };
            Ok(s.reservations.values().filter(|r| on_node(r)).cloned().collect())
        })
        .await
    }
}

impl MemoryStore {
    /// Applies a guarded patch to the NodeSlicePool `name`, as the API server would (its faults those of `op`).
    async fn patch_slices(&self, op: Op, name: &str, patch: json_patch::Patch) -> Result<Patched, StoreError> {
        refused_as_patched(
            self.call(op, "nodeslicepool", name, |s| {
                let Some(stored) = s.node_slices.get(name) else { return Ok(Patched::Missing) };
                let mut object = stored.clone();
                if let Err(refusal) = patch_object(&mut object, &Change::Guarded(&patch)) {
                    return Ok(Patched::Refused(refusal));
                }
                object.metadata.resource_version = Some(s.bump());
                s.node_slices.insert(name.to_string(), object);
                Ok(Patched::Applied)
            })
            .await,
        )
    }
}

impl SliceStore for MemoryStore {
    async fn get_node_slices(&self, name: &str) -> Result<Option<NodeSlicePool>, StoreError> {
        self.call(Op::GetNodeSlices, "nodeslicepool", name, |s| Ok(s.node_slices.get(name).cloned())).await
    }

    async fn create_node_slices(
        &self,
        name: &str,
        spec: &NodeSlicePoolSpec,
        slices: &[NodeSliceAllocation],
    ) -> Result<Created<NodeSlicePool>, StoreError> {
        self.call(Op::CreateNodeSlices, "nodeslicepool", name, |s| {
            if s.node_slices.contains_key(name) {
                return Ok(Created::Exists);
            }
            let mut object = super::node_slices_object(name, spec, slices);
            object.metadata.namespace = Some(self.namespace.clone());
            object.metadata.resource_version = Some(s.bump());
            object.metadata.uid = Some(format!("uid-{}", s.version));
            s.node_slices.insert(name.to_string(), object.clone());
            Ok(Created::Created(object))
        })
        .await
    }

    async fn move_slice(
        &self,
        name: &str,
        index: usize,
        slice: &NodeSliceAllocation,
        to: &str,
    ) -> Result<Patched, StoreError> {
        self.patch_slices(Op::MoveSlice, name, guard::move_slice(index, slice, to)).await
    }

    async fn split_slice(
        &self,
        name: &str,
        index: usize,
        slice: &NodeSliceAllocation,
        to: &str,
        kept: &str,
        rest: &[String],
    ) -> Result<Patched, StoreError> {
        self.patch_slices(Op::MoveSlice, name, guard::split_slice(index, slice, to, kept, rest)).await
    }

    async fn join_slices(
        &self,
        name: &str,
        i: usize,
        a: &NodeSliceAllocation,
        j: usize,
        b: &NodeSliceAllocation,
        parent: &str,
    ) -> Result<Patched, StoreError> {
        self.patch_slices(Op::MoveSlice, name, guard::join_slices(i, a, j, b, parent)).await
    }

    async fn list_node_slices(&self) -> Result<Vec<NodeSlicePool>, StoreError> {
        self.call(Op::ListNodeSlices, "nodeslicepool", "*", |s| Ok(s.node_slices.values().cloned().collect())).await
    }

    async fn keep_node_slices_owners(
        &self,
        name: &str,
        version: &str,
        kept: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    ) -> Result<Patched, StoreError> {
        self.patch_slices(Op::KeepNodeSlicesOwners, name, guard::keep_owners(version, kept)).await
    }
}
