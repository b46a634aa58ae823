//! A store shared by the concurrent invocations of one long-lived process — the node agent — so that what one
//! invocation learnt or is writing helps the others (docs/design.md, "The node agent"):
//!
//! - **Group commit.** Guarded writes of one pool (entries added, replaced, removed) that arrive while a write of
//!   that pool is on the wire wait for it, then go as one JSON patch: the guards' documents end to end, which the
//!   API server applies all or nothing, exactly as it would apply them one after the other. When the batch is
//!   refused (one guard failed), each write is sent again alone, in order, so that each caller gets the answer its
//!   own guard earns; an answer lost is lost for every write of the batch, and each caller reads back, as always.
//! - **A hint cache.** The newest version of each pool and NodeSlicePool this process received (a read, a create,
//!   a batch's answer; in the agent, a watch of its node's pools and of the NodeSlicePools: `observe_*`). Only
//!   [`PoolStore::cached_pool`] and [`SliceStore::cached_node_slices`] return it; every `get_*` still reads the
//!   server, so the read-backs and re-reads the protocol relies on are never served from memory. A failed write
//!   forgets the object (a watch may bring back an older copy: a copy is never taken to show a write of this
//!   process). Plans use it only where the attachment is known to hold nothing in the object (its search reads
//!   fresh): an attachment's first ADD on the node, a claim planning again, a pool another claim just created, a
//!   slice another claim just took.
//! - **Shared reads.** A read of an object shares the read of it on the wire when that was sent after every answer
//!   this process had received when the reader asked — after the reader's own writes were answered, after any
//!   refusal or failure it is reading back from — and, for an invocation's view ([`Shared::for_invocation`]),
//!   after the invocation began, so it is as fresh for the reader as a read of its own (GETs are linearizable).
//!   The second rule covers what this process never heard of: a try of the same ADD that the binary made alone
//!   (the agent declined it, or did not answer in time) completed before the runtime sent the retry, so a read
//!   sent before the retry began may not show it, and the retry would miss its own entry. Otherwise the reader
//!   waits, and shares the next one with the others that wait. The claims of one batch, which read their slice's
//!   owner as the batch is answered, so send one read between them.
//! - **Offsets in flight.** Concurrent claims of one pool plan around each other's offsets instead of racing for
//!   the lowest free one, and concurrent ADDs that find the node's slices full claim one slice between them
//!   ([`SliceStore::slice_turn`]), or a pool missing create it once ([`PoolStore::create_turn`]).
//!
//! Nothing here is the truth: the guards decide, the state is lost with the process, and the binary can always do
//! the same work alone.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use json_patch::Patch;
use tokio::sync::oneshot;

use super::{
    AsRead, Claim, CoreObject, CoreStore, Created, Deleted, ObjectMeta, Patched, PodEvent, PoolStore, ReleaseRecord,
    ReservationStore, SliceStore, StoreError, SubInterfaceStore, Version, guard,
};
use crate::crd::{
    IpAllocation, IpPool, NodeSliceAllocation, NodeSlicePool, NodeSlicePoolSpec, OverlappingRangeIpReservation,
    SubInterfaceRecord,
};

/// How long a batch waits, at most, for the claims of its pool that held an offset before it was taken and have
/// not queued their write yet (their reservation create is on the wire): two reservation creates on an API server
/// busy with a burst (W1s: 30–50 ms each), so that a node's concurrent ADDs go in one patch rather than the first
/// alone and the rest in the next. A claim that gives its offset up ends the wait for it. (In W1s, 40 ms gave 0.45
/// patches per ADD, 80 ms 0.42 and a lower p99: fewer requests for the 2 cores the API server shares.)
const LINGER_AT_MOST: std::time::Duration = std::time::Duration::from_millis(80);

/// `inner`, shared: clones share the cache, the queues and the offsets in flight.
#[derive(Clone)]
pub struct Shared<S> {
    inner: S,
    state: Arc<State>,
    /// When the invocation using this view began: it joins only reads sent since ([`Shared::for_invocation`]).
    began: Option<tokio::time::Instant>,
}

impl<S> std::fmt::Debug for Shared<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

/// What the group commit did, for the agent's metrics and the tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedStats {
    /// Guarded pool writes asked for.
    pub writes: u64,
    /// Requests that carried them (batches and writes sent alone).
    pub requests: u64,
    /// Batches of more than one write that the server refused, whose writes were sent again alone.
    pub split: u64,
}

/// A turn to claim a slice or create a pool ([`SliceStore::slice_turn`], [`PoolStore::create_turn`]): the next
/// waiter's begins when it is dropped.
#[derive(Debug)]
pub struct Turn(#[allow(dead_code)] tokio::sync::OwnedMutexGuard<()>);

#[derive(Default)]
struct State {
    pools: Mutex<HashMap<String, IpPool>>,
    slices: Mutex<HashMap<String, NodeSlicePool>>,
    in_flight: Mutex<HashMap<String, BTreeSet<u128>>>,
    queues: Mutex<HashMap<String, Arc<Queue>>>,
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    reads: Mutex<HashMap<String, Arc<Reads>>>,
    writes: AtomicU64,
    requests: AtomicU64,
    split: AtomicU64,
    /// Answers (results and failures) received from the server so far: what a reader may know of it.
    answers: AtomicU64,
}

/// One pool's writes waiting to be sent, and who sends now.
#[derive(Default)]
struct Queue {
    sending: tokio::sync::Mutex<()>,
    waiting: Mutex<Vec<Waiting>>,
    /// Told when a write is queued or an offset of the pool given up: a lingering batch looks again.
    changed: tokio::sync::Notify,
}

/// One object's reads: the one on the wire, which a reader joins when it learnt nothing since it was sent, the
/// readers waiting to share the next one, and who reads now.
#[derive(Default)]
struct Reads {
    sending: tokio::sync::Mutex<()>,
    waiting: Mutex<Vec<Reader>>,
    /// The read on the wire, and the readers that joined it since.
    on_wire: Mutex<Option<(SentWhen, Vec<Reader>)>>,
}

/// When a read on the wire was sent: how many answers this process had received then, and the instant.
#[derive(Clone, Copy)]
struct SentWhen {
    answers: u64,
    at: tokio::time::Instant,
}

type Reader = oneshot::Sender<Result<Read, StoreError>>;

/// Ends the read on the wire when its sender is done or dropped: the readers that joined it and are not answered
/// yet see their read end (their invocation may try again), never wait for ever.
struct OnWire<'a>(&'a Reads);

impl OnWire<'_> {
    fn joined(&self) -> Vec<Reader> {
        self.0.on_wire.lock().expect("not poisoned").take().map(|(_, joined)| joined).unwrap_or_default()
    }
}

impl Drop for OnWire<'_> {
    fn drop(&mut self) {
        self.joined();
    }
}

#[derive(Clone)]
enum Read {
    Pool(Option<Box<IpPool>>),
    Slices(Option<Box<NodeSlicePool>>),
}

struct Waiting {
    /// The offset the write is about, which its claim holds while it waits.
    offset: u128,
    op: String,
    patch: Patch,
    answer: oneshot::Sender<Result<Patched, StoreError>>,
}

/// Whether `new` is a later version of an object than `old` (resourceVersions are etcd revisions; one that is not
/// a number is taken as newer).
pub(crate) fn newer(new: &ObjectMeta, old: &ObjectMeta) -> bool {
    let revision = |m: &ObjectMeta| m.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok());
    match (revision(new), revision(old)) {
        (Some(n), Some(o)) => n > o,
        _ => true,
    }
}

/// Forgets the copy of `gone` in `known` unless the copy is newer than `gone` (the object was made again since).
fn forget_unless_newer<K: kube::Resource>(known: &Mutex<HashMap<String, K>>, gone: &K) {
    let Some(name) = gone.meta().name.as_deref() else { return };
    let mut known = known.lock().expect("not poisoned");
    if known.get(name).is_some_and(|k| !newer(k.meta(), gone.meta())) {
        known.remove(name);
    }
}

fn copy(e: &StoreError) -> StoreError {
    StoreError::new(e.kind, &e.name, e.op.clone(), e.failure, e.message.clone())
}

impl<S> Shared<S> {
    /// A new shared view over `inner`, nothing known yet.
    pub fn new(inner: S) -> Self {
        Self { inner, state: Arc::default(), began: None }
    }

    /// The same shared view over another handle of the store (the agent's client made again).
    pub fn with_inner<T>(&self, inner: T) -> Shared<T> {
        Shared { inner, state: self.state.clone(), began: self.began }
    }

    /// This view for an invocation that begins now: it shares everything, and joins only reads sent from now on
    /// (a try of the same ADD the binary made alone, unseen by this process, completed before now).
    pub fn for_invocation(&self) -> Self
    where
        S: Clone,
    {
        Shared { began: Some(tokio::time::Instant::now()), ..self.clone() }
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// What the group commit did so far.
    pub fn stats(&self) -> SharedStats {
        SharedStats {
            writes: self.state.writes.load(Ordering::Relaxed),
            requests: self.state.requests.load(Ordering::Relaxed),
            split: self.state.split.load(Ordering::Relaxed),
        }
    }

    fn remember_pool(&self, pool: &IpPool) {
        let Some(name) = pool.metadata.name.clone() else { return };
        let mut pools = self.state.pools.lock().expect("not poisoned");
        if pools.get(&name).is_none_or(|known| newer(&pool.metadata, &known.metadata)) {
            pools.insert(name, pool.clone());
        }
    }

    fn forget_pool(&self, name: &str) {
        self.state.pools.lock().expect("not poisoned").remove(name);
    }

    fn remember_slices(&self, slices: &NodeSlicePool) {
        let Some(name) = slices.metadata.name.clone() else { return };
        let mut known = self.state.slices.lock().expect("not poisoned");
        if known.get(&name).is_none_or(|k| newer(&slices.metadata, &k.metadata)) {
            known.insert(name, slices.clone());
        }
    }

    fn forget_slices(&self, name: &str) {
        self.state.slices.lock().expect("not poisoned").remove(name);
    }

    /// A copy of `pool` a watch delivered: kept unless a newer one is known (this process's own writes and reads
    /// may be ahead of the watch).
    pub fn observe_pool(&self, pool: &IpPool) {
        self.remember_pool(pool);
    }

    /// `pool`, as a watch saw it deleted: forgotten unless what is known is newer (made again since).
    pub fn observe_pool_deleted(&self, pool: &IpPool) {
        forget_unless_newer(&self.state.pools, pool);
    }

    /// A copy of the NodeSlicePool `slices` a watch delivered, as [`Shared::observe_pool`].
    pub fn observe_slices(&self, slices: &NodeSlicePool) {
        self.remember_slices(slices);
    }

    /// `slices`, as a watch saw it deleted, as [`Shared::observe_pool_deleted`].
    pub fn observe_slices_deleted(&self, slices: &NodeSlicePool) {
        forget_unless_newer(&self.state.slices, slices);
    }

    async fn turn(&self, key: String) -> Turn {
        let turn = self.state.turns.lock().expect("not poisoned").entry(key).or_default().clone();
        Turn(turn.lock_owned().await)
    }

    /// `result`, an answer from the server, counted.
    fn seen<T>(&self, result: T) -> T {
        self.state.answers.fetch_add(1, Ordering::SeqCst);
        result
    }

    /// `read` of the object `key`, shared with the readers for whom it is as fresh as their own (group commit for
    /// reads).
    async fn read<F>(&self, key: String, read: impl FnOnce() -> F) -> Result<Read, StoreError>
    where
        F: std::future::Future<Output = Result<Read, StoreError>>,
    {
        let reads = self.state.reads.lock().expect("not poisoned").entry(key.clone()).or_default().clone();
        let known = self.state.answers.load(Ordering::SeqCst);
        let (answer, mut answered) = oneshot::channel();
        let joined = {
            let mut on_wire = reads.on_wire.lock().expect("not poisoned");
            match on_wire.as_mut() {
                Some((sent, joined)) if sent.answers >= known && self.began.is_none_or(|began| sent.at >= began) => {
                    joined.push(answer);
                    true
                }
                _ => {
                    reads.waiting.lock().expect("not poisoned").push(answer);
                    false
                }
            }
        };
        if !joined {
            let _sending = reads.sending.lock().await;
            match answered.try_recv() {
                Ok(result) => return result,
                // a reader before us took our place along and ended (its invocation was killed) before it
                // answered: the channel is spent, so wait on a new one, which this read answers
                Err(oneshot::error::TryRecvError::Closed) => {
                    let (answer, again) = oneshot::channel();
                    reads.waiting.lock().expect("not poisoned").push(answer);
                    answered = again;
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let mut readers = std::mem::take(&mut *reads.waiting.lock().expect("not poisoned"));
            let sent = SentWhen { answers: self.state.answers.load(Ordering::SeqCst), at: tokio::time::Instant::now() };
            *reads.on_wire.lock().expect("not poisoned") = Some((sent, Vec::new()));
            let on_wire = OnWire(&reads);
            let result = read().await;
            readers.append(&mut on_wire.joined());
            for reader in readers {
                let _ = reader.send(match &result {
                    Ok(read) => Ok(read.clone()),
                    Err(e) => Err(copy(e)),
                });
            }
        }
        answered.await.unwrap_or_else(|_| {
            Err(StoreError::new("object", &key, "get", super::Failure::Unavailable, "the shared read ended".into()))
        })
    }

    fn queue(&self, pool: &str) -> Arc<Queue> {
        self.state.queues.lock().expect("not poisoned").entry(pool.to_string()).or_default().clone()
    }
}

/// A write of `pool` whose batch ended before it was answered: it may have been applied.
fn unanswered(pool: &str, op: String) -> StoreError {
    StoreError::new(
        "pool",
        pool,
        op,
        super::Failure::Ambiguous,
        "the batch carrying this write ended unanswered".into(),
    )
}

impl<S: PoolStore> Shared<S> {
    /// Sends the guarded write `patch` of pool `pool` at `offset`, with whatever writes of the pool queue up
    /// meanwhile.
    async fn write(&self, pool: &str, offset: u128, op: String, patch: Patch) -> Result<Patched, StoreError> {
        self.state.writes.fetch_add(1, Ordering::Relaxed);
        let queue = self.queue(pool);
        let (answer, mut answered) = oneshot::channel();
        queue.waiting.lock().expect("not poisoned").push(Waiting { offset, op: op.clone(), patch, answer });
        queue.changed.notify_waiters();
        {
            let _sending = queue.sending.lock().await;
            // a sender before us may have taken ours along; if it ended before it answered (its invocation was
            // killed), the batch may have been applied: the channel is spent, and the caller reads back
            match answered.try_recv() {
                Ok(result) => return result,
                Err(oneshot::error::TryRecvError::Closed) => return Err(unanswered(pool, op)),
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let batch = self.linger(pool, &queue).await;
            self.send(pool, batch).await;
        }
        // the sender was dropped before it answered (its invocation ended): the batch may have been applied
        answered.await.unwrap_or_else(|_| Err(unanswered(pool, op)))
    }

    /// The writes queued for `pool`, with those of the claims that held an offset of it when the batch was
    /// taken and queue their write within [`LINGER_AT_MOST`] — not those that hold one later, which would keep a
    /// batch waiting for as long as ADDs keep coming.
    async fn linger(&self, pool: &str, queue: &Queue) -> Vec<Waiting> {
        let mut batch = std::mem::take(&mut *queue.waiting.lock().expect("not poisoned"));
        let awaited = self.in_flight(pool);
        let deadline = tokio::time::Instant::now() + LINGER_AT_MOST;
        loop {
            let changed = queue.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            batch.append(&mut queue.waiting.lock().expect("not poisoned"));
            let held = self.in_flight(pool);
            let queued: BTreeSet<u128> = batch.iter().map(|w| w.offset).collect();
            if awaited.iter().all(|o| queued.contains(o) || !held.contains(o)) {
                return batch;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                batch.append(&mut queue.waiting.lock().expect("not poisoned"));
                return batch;
            }
        }
    }

    async fn send(&self, pool: &str, mut batch: Vec<Waiting>) {
        if batch.len() == 1 {
            let one = batch.pop().expect("one");
            let result = self.send_one(pool, &one.op, &one.patch).await;
            let _ = one.answer.send(result);
            return;
        }
        let ops: Vec<_> = batch.iter().flat_map(|w| w.patch.0.iter().cloned()).collect();
        let op = format!("{} guarded writes in one patch", batch.len());
        self.state.requests.fetch_add(1, Ordering::Relaxed);
        let sent = self.seen(self.inner.apply_pool_patch(pool, &op, &Patch(ops)).await);
        tracing::debug!(
            pool,
            writes = batch.len(),
            applied = matches!(sent, Ok((Patched::Applied, _))),
            "group commit"
        );
        match sent {
            Ok((Patched::Applied, after)) => {
                if let Some(after) = &after {
                    self.remember_pool(after);
                }
                for w in batch {
                    let _ = w.answer.send(Ok(Patched::Applied));
                }
            }
            Ok((Patched::Missing, _)) => {
                self.forget_pool(pool);
                for w in batch {
                    let _ = w.answer.send(Ok(Patched::Missing));
                }
            }
            // one guard failed, an admission policy refused the batch (the node policy answers 403 to a write
            // it refuses, and nothing of the batch was applied), or the batch is too large for one object's
            // request: each alone earns its answer
            Ok((Patched::Refused(_), _))
            | Err(StoreError { failure: super::Failure::TooLarge | super::Failure::Refused(_), .. }) => {
                self.forget_pool(pool);
                self.state.split.fetch_add(1, Ordering::Relaxed);
                for w in batch {
                    let result = self.send_one(pool, &w.op, &w.patch).await;
                    let _ = w.answer.send(result);
                }
            }
            Err(e) => {
                // all or nothing: each write was applied or none was; each caller reads back what it wrote
                self.forget_pool(pool);
                for w in batch {
                    let _ = w.answer.send(Err(copy(&e)));
                }
            }
        }
    }

    async fn send_one(&self, pool: &str, op: &str, patch: &Patch) -> Result<Patched, StoreError> {
        self.state.requests.fetch_add(1, Ordering::Relaxed);
        match self.seen(self.inner.apply_pool_patch(pool, op, patch).await) {
            Ok((patched, after)) => {
                match &after {
                    Some(after) => self.remember_pool(after),
                    None => self.forget_pool(pool),
                }
                Ok(patched)
            }
            Err(e) => {
                self.forget_pool(pool);
                Err(e)
            }
        }
    }
}

impl<S: PoolStore> PoolStore for Shared<S> {
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    async fn get_pool(&self, name: &str) -> Result<Option<IpPool>, StoreError> {
        let read = self
            .read(format!("pool/{name}"), || async {
                Ok(Read::Pool(self.seen(self.inner.get_pool(name).await)?.map(Box::new)))
            })
            .await?;
        let Read::Pool(read) = read else { unreachable!("a pool's key reads a pool") };
        match &read {
            Some(pool) => self.remember_pool(pool),
            None => self.forget_pool(name),
        }
        Ok(read.map(|p| *p))
    }

    async fn create_pool(&self, new: &super::NewPool<'_>) -> Result<Created<IpPool>, StoreError> {
        let created = self.seen(self.inner.create_pool(new).await)?;
        if let Created::Created(pool) = &created {
            self.remember_pool(pool);
        }
        Ok(created)
    }

    async fn list_pools(&self) -> Result<Vec<IpPool>, StoreError> {
        self.seen(self.inner.list_pools().await)
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.seen(self.inner.probe().await)
    }

    async fn add_allocation(
        &self,
        pool: &str,
        offset: u128,
        entry: &IpAllocation,
        read: &AsRead,
    ) -> Result<Patched, StoreError> {
        self.write(pool, offset, format!("add allocation {offset}"), guard::add_entry(offset, entry, read)).await
    }

    async fn replace_allocation(
        &self,
        pool: &str,
        offset: u128,
        expected: &IpAllocation,
        entry: &IpAllocation,
    ) -> Result<Patched, StoreError> {
        self.write(pool, offset, format!("replace allocation {offset}"), guard::replace_entry(offset, expected, entry))
            .await
    }

    async fn remove_allocation(
        &self,
        pool: &str,
        offset: u128,
        held: &IpAllocation,
        record: Option<&ReleaseRecord>,
    ) -> Result<Patched, StoreError> {
        if record.is_some_and(|r| !r.map_exists) {
            // the map is made with a merge patch first: not a guard's document, so not batched
            self.forget_pool(pool);
            return self.seen(self.inner.remove_allocation(pool, offset, held, record).await);
        }
        self.write(pool, offset, format!("remove allocation {offset}"), guard::remove_entry(offset, held, record)).await
    }

    async fn set_pool_cooldown(&self, name: &str, seconds: u64) -> Result<Option<IpPool>, StoreError> {
        self.forget_pool(name);
        let after = self.seen(self.inner.set_pool_cooldown(name, seconds).await)?;
        if let Some(pool) = &after {
            self.remember_pool(pool);
        }
        Ok(after)
    }

    async fn delete_pool(&self, name: &str, version: &Version) -> Result<Deleted, StoreError> {
        self.forget_pool(name);
        self.seen(self.inner.delete_pool(name, version).await)
    }

    async fn retime_release(&self, name: &str, offset: u128, read: &str, now: &str) -> Result<Patched, StoreError> {
        self.forget_pool(name);
        self.seen(self.inner.retime_release(name, offset, read, now).await)
    }

    async fn apply_pool_patch(
        &self,
        name: &str,
        op: &str,
        patch: &Patch,
    ) -> Result<(Patched, Option<IpPool>), StoreError> {
        self.forget_pool(name);
        self.seen(self.inner.apply_pool_patch(name, op, patch).await)
    }

    fn cached_pool(&self, name: &str) -> Option<IpPool> {
        self.state.pools.lock().expect("not poisoned").get(name).cloned()
    }

    async fn create_turn(&self, name: &str) -> Option<Turn> {
        Some(self.turn(format!("create/{name}")).await)
    }

    fn in_flight(&self, pool: &str) -> BTreeSet<u128> {
        self.state.in_flight.lock().expect("not poisoned").get(pool).cloned().unwrap_or_default()
    }

    fn hold(&self, pool: &str, offset: u128) -> bool {
        self.state.in_flight.lock().expect("not poisoned").entry(pool.to_string()).or_default().insert(offset)
    }

    fn unhold(&self, pool: &str, offset: u128) {
        {
            let mut held = self.state.in_flight.lock().expect("not poisoned");
            if let Some(offsets) = held.get_mut(pool) {
                offsets.remove(&offset);
                if offsets.is_empty() {
                    held.remove(pool);
                }
            }
        }
        // a batch lingering for this offset's write need not any more
        if let Some(queue) = self.state.queues.lock().expect("not poisoned").get(pool) {
            queue.changed.notify_waiters();
        }
    }
}

impl<S: SliceStore> SliceStore for Shared<S> {
    async fn get_node_slices(&self, name: &str) -> Result<Option<NodeSlicePool>, StoreError> {
        let read = self
            .read(format!("nodeslicepool/{name}"), || async {
                Ok(Read::Slices(self.seen(self.inner.get_node_slices(name).await)?.map(Box::new)))
            })
            .await?;
        let Read::Slices(read) = read else { unreachable!("a NodeSlicePool's key reads one") };
        match &read {
            Some(slices) => self.remember_slices(slices),
            None => self.forget_slices(name),
        }
        Ok(read.map(|s| *s))
    }

    async fn create_node_slices(
        &self,
        name: &str,
        spec: &NodeSlicePoolSpec,
        slices: &[NodeSliceAllocation],
    ) -> Result<Created<NodeSlicePool>, StoreError> {
        let created = self.seen(self.inner.create_node_slices(name, spec, slices).await)?;
        if let Created::Created(made) = &created {
            self.remember_slices(made);
        }
        Ok(created)
    }

    async fn move_slice(
        &self,
        name: &str,
        index: usize,
        slice: &NodeSliceAllocation,
        to: &str,
    ) -> Result<Patched, StoreError> {
        self.forget_slices(name);
        self.seen(self.inner.move_slice(name, index, slice, to).await)
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
        self.forget_slices(name);
        self.seen(self.inner.split_slice(name, index, slice, to, kept, rest).await)
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
        self.forget_slices(name);
        self.seen(self.inner.join_slices(name, i, a, j, b, parent).await)
    }

    async fn list_node_slices(&self) -> Result<Vec<NodeSlicePool>, StoreError> {
        self.seen(self.inner.list_node_slices().await)
    }

    async fn keep_node_slices_owners(
        &self,
        name: &str,
        version: &str,
        kept: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    ) -> Result<Patched, StoreError> {
        self.forget_slices(name);
        self.seen(self.inner.keep_node_slices_owners(name, version, kept).await)
    }

    fn cached_node_slices(&self, name: &str) -> Option<NodeSlicePool> {
        self.state.slices.lock().expect("not poisoned").get(name).cloned()
    }

    async fn slice_turn(&self, name: &str) -> Option<Turn> {
        Some(self.turn(format!("claim/{name}")).await)
    }
}

impl<S: ReservationStore> ReservationStore for Shared<S> {
    async fn get_reservation(&self, name: &str) -> Result<Option<OverlappingRangeIpReservation>, StoreError> {
        self.seen(self.inner.get_reservation(name).await)
    }

    async fn create_reservation(
        &self,
        name: &str,
        claim: &Claim,
    ) -> Result<Created<OverlappingRangeIpReservation>, StoreError> {
        self.seen(self.inner.create_reservation(name, claim).await)
    }

    async fn take_over_reservation(
        &self,
        current: &OverlappingRangeIpReservation,
        claim: &Claim,
    ) -> Result<Patched, StoreError> {
        self.seen(self.inner.take_over_reservation(current, claim).await)
    }

    async fn delete_reservation(&self, name: &str, version: &Version) -> Result<Deleted, StoreError> {
        self.seen(self.inner.delete_reservation(name, version).await)
    }

    async fn list_reservations(&self, node: Option<&str>) -> Result<Vec<OverlappingRangeIpReservation>, StoreError> {
        self.seen(self.inner.list_reservations(node).await)
    }
}

impl<S: SubInterfaceStore + PoolStore> SubInterfaceStore for Shared<S> {
    async fn set_sub_interface(
        &self,
        name: &str,
        offset: u128,
        record: &SubInterfaceRecord,
    ) -> Result<Patched, StoreError> {
        self.forget_pool(name);
        self.seen(self.inner.set_sub_interface(name, offset, record).await)
    }

    async fn remove_sub_interface(&self, name: &str, offset: u128, node: &str) -> Result<Patched, StoreError> {
        self.forget_pool(name);
        self.seen(self.inner.remove_sub_interface(name, offset, node).await)
    }
}

impl<S: CoreStore> CoreStore for Shared<S> {
    async fn warn_pod(&self, pod: &PodEvent<'_>, reason: &str, message: &str) -> Result<(), StoreError> {
        self.seen(self.inner.warn_pod(pod, reason, message).await)
    }

    async fn core_metadata(
        &self,
        kind: CoreObject,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ObjectMeta>, StoreError> {
        self.seen(self.inner.core_metadata(kind, namespace, name).await)
    }
}

impl<S: super::IpamClaimStore> super::IpamClaimStore for Shared<S> {
    async fn get_ipamclaim(&self, namespace: &str, name: &str) -> Result<Option<crate::crd::IpamClaim>, StoreError> {
        self.seen(self.inner.get_ipamclaim(namespace, name).await)
    }

    async fn set_ipamclaim_status(
        &self,
        current: &crate::crd::IpamClaim,
        status: &crate::crd::IpamClaimStatus,
    ) -> Result<Patched, StoreError> {
        self.seen(self.inner.set_ipamclaim_status(current, status).await)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::memory::{Fault, FaultPlan, MemoryStore, Op};

    fn entry(container: &str) -> IpAllocation {
        IpAllocation {
            id: container.into(),
            podref: format!("ns/{container}"),
            ifname: "net1".into(),
            ..Default::default()
        }
    }

    /// A store whose requests take up to 5 ms, so that concurrent writes meet; `plan` adds faults.
    fn slow(base: &MemoryStore, plan: FaultPlan) -> Shared<MemoryStore> {
        let mut plan = plan;
        plan.max_latency_ms = 5;
        Shared::new(base.handle("agent", plan))
    }

    async fn pool_with(base: &MemoryStore) {
        let made = base.create_pool(&crate::store::NewPool::new("p", "198.18.0.0/24", 254)).await.unwrap();
        assert!(matches!(made, Created::Created(_)));
    }

    /// `n` concurrent adds of distinct offsets, each with its answer.
    async fn add_at_once(store: &Shared<MemoryStore>, offsets: &[u128]) -> Vec<Result<Patched, StoreError>> {
        let adds = offsets.iter().map(|&o| {
            let store = store.clone();
            async move { store.add_allocation("p", o, &entry(&format!("c{o}")), &AsRead::default()).await }
        });
        futures::future::join_all(adds).await
    }

    #[tokio::test(start_paused = true)]
    async fn writes_that_meet_go_as_one_patch_and_each_is_answered() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        let store = slow(&base, FaultPlan::quiet(7));
        let offsets: Vec<u128> = (1..=16).collect();
        let answers = add_at_once(&store, &offsets).await;
        assert!(answers.iter().all(|a| matches!(a, Ok(Patched::Applied))), "{answers:?}");
        let pool = base.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some("p")).unwrap();
        assert_eq!(pool.spec.allocations.len(), 16);
        let stats = store.stats();
        assert_eq!(stats.writes, 16);
        assert!(stats.requests < 16, "the writes that waited went together: {stats:?}");
        assert_eq!(stats.split, 0);
        let cached = store.cached_pool("p").expect("the batch's answer is kept");
        assert_eq!(cached.spec.allocations.len(), 16, "the cache holds the pool as the last batch left it");
    }

    /// Claims that held their offsets when the first write came, each queueing its own write when its reservation
    /// create answers (10, 20 and 30 ms later): one patch carries all four. `late` holds an offset after the first
    /// write was queued and is not waited for.
    #[tokio::test(start_paused = true)]
    async fn a_batch_waits_for_the_claims_that_held_an_offset_when_it_was_taken() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        let store = Shared::new(base.handle("agent", FaultPlan::quiet(2)));
        for o in 1..=4 {
            assert!(store.hold("p", o));
        }
        let started = tokio::time::Instant::now();
        let claims = (1..=4u128).map(|o| {
            let store = store.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(10 * (o as u64 - 1))).await;
                let answer = store.add_allocation("p", o, &entry(&format!("c{o}")), &AsRead::default()).await;
                store.unhold("p", o);
                (answer, started.elapsed())
            }
        });
        let late = {
            let store = store.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                assert!(store.hold("p", 9), "held after the batch was taken");
                tokio::time::sleep(Duration::from_secs(5)).await;
                store.unhold("p", 9);
            }
        };
        let (answers, ()) = tokio::join!(futures::future::join_all(claims), late);
        for (answer, _) in &answers {
            assert!(matches!(answer, Ok(Patched::Applied)), "{answers:?}");
        }
        assert_eq!(store.stats().requests, 1, "one patch for the four: {:?}", store.stats());
        let first_answered = answers[0].1;
        assert!(first_answered >= Duration::from_millis(30) && first_answered < LINGER_AT_MOST, "{first_answered:?}");
        let pool = base.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some("p")).unwrap();
        assert_eq!(pool.spec.allocations.len(), 4);
    }

    /// A claim that holds an offset but whose write never comes keeps a batch waiting [`LINGER_AT_MOST`] at most,
    /// and one that gives its offset up (its address was taken elsewhere) ends the wait at once.
    #[tokio::test(start_paused = true)]
    async fn a_batch_waits_no_longer_than_its_bound_nor_for_an_offset_given_up() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        let store = Shared::new(base.handle("agent", FaultPlan::quiet(4)));
        assert!(store.hold("p", 7), "a claim whose reservation create hangs");
        let started = tokio::time::Instant::now();
        let answer = store.add_allocation("p", 1, &entry("c1"), &AsRead::default()).await;
        assert!(matches!(answer, Ok(Patched::Applied)), "{answer:?}");
        assert_eq!(started.elapsed(), LINGER_AT_MOST, "waited its bound for offset 7, no longer");
        store.unhold("p", 7);

        assert!(store.hold("p", 8), "a claim that will find its address held elsewhere");
        let started = tokio::time::Instant::now();
        let giving_up = {
            let store = store.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                store.unhold("p", 8);
            }
        };
        let (c2, read) = (entry("c2"), AsRead::default());
        let (answer, ()) = tokio::join!(store.add_allocation("p", 2, &c2, &read), giving_up);
        assert!(matches!(answer, Ok(Patched::Applied)), "{answer:?}");
        assert_eq!(started.elapsed(), Duration::from_millis(5), "sent as offset 8 was given up");
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_with_one_failing_guard_is_split_and_only_that_write_is_refused() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        // offset 3 is another pod's already
        let taken = base.add_allocation("p", 3, &entry("other"), &AsRead::default()).await.unwrap();
        assert_eq!(taken, Patched::Applied);
        let store = slow(&base, FaultPlan::quiet(11));
        let answers = add_at_once(&store, &[1, 2, 3, 4, 5, 6]).await;
        for (offset, answer) in [1u128, 2, 3, 4, 5, 6].iter().zip(&answers) {
            match offset {
                3 => assert!(matches!(answer, Ok(Patched::Refused(_))), "offset 3: {answer:?}"),
                _ => assert!(matches!(answer, Ok(Patched::Applied)), "offset {offset}: {answer:?}"),
            }
        }
        let pool = base.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some("p")).unwrap();
        assert_eq!(pool.spec.allocations["3"].id, "other", "the other pod's entry stays");
        assert_eq!(pool.spec.allocations.len(), 6);
        assert!(store.stats().split >= 1, "{:?}", store.stats());
    }

    /// S13 of the fourth review: the shipped node policy answers a write it refuses with 403, which the group
    /// commit gave to every write of the batch; each is sent alone now, as after a failed guard.
    #[tokio::test(start_paused = true)]
    async fn a_batch_an_admission_policy_refuses_is_split_and_each_write_earns_its_answer() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        // the second request (the batch of those that waited behind the first) is refused as the policy refuses
        let store = slow(&base, FaultPlan::quiet(5).at(Op::AddAllocation, 2, Fault::Refused));
        let answers = add_at_once(&store, &[1, 2, 3, 4, 5]).await;
        for answer in &answers {
            assert!(matches!(answer, Ok(Patched::Applied)), "{answers:?}");
        }
        let pool = base.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some("p")).unwrap();
        assert_eq!(pool.spec.allocations.len(), 5);
        assert!(store.stats().split >= 1, "{:?}", store.stats());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_answer_is_lost_for_every_write_of_the_batch_and_all_or_none_was_applied() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        // the second request (the batch of those that waited behind the first) is applied, its answer lost
        let store = slow(&base, FaultPlan::quiet(5).at(Op::AddAllocation, 2, Fault::LostResponse));
        let answers = add_at_once(&store, &[1, 2, 3, 4, 5]).await;
        let lost: Vec<_> = answers.iter().filter(|a| a.as_ref().is_err_and(StoreError::is_ambiguous)).collect();
        assert!(lost.len() > 1, "the lost batch carried several writes: {answers:?}");
        assert_eq!(answers.iter().filter(|a| matches!(a, Ok(Patched::Applied))).count() + lost.len(), 5);
        let pool = base.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some("p")).unwrap();
        assert_eq!(pool.spec.allocations.len(), 5, "the batch was applied whole");
        assert!(store.cached_pool("p").is_none(), "an answer lost forgets the pool: the next plan reads it");
    }

    #[tokio::test(start_paused = true)]
    async fn offsets_in_flight_are_held_once_and_reads_always_go_to_the_server() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        let store = Shared::new(base.handle("agent", FaultPlan::quiet(1)));
        assert!(store.hold("p", 4));
        assert!(!store.hold("p", 4), "a second claim of this process does not take offset 4");
        assert_eq!(store.in_flight("p"), BTreeSet::from([4]));
        store.unhold("p", 4);
        assert!(store.in_flight("p").is_empty());

        let read = store.get_pool("p").await.unwrap().unwrap();
        assert_eq!(store.cached_pool("p").map(|p| p.metadata.resource_version), Some(read.metadata.resource_version));
        // another process writes: the cache is a hint, a read is a read
        base.add_allocation("p", 9, &entry("elsewhere"), &AsRead::default()).await.unwrap();
        assert!(store.cached_pool("p").unwrap().spec.allocations.is_empty());
        assert_eq!(store.get_pool("p").await.unwrap().unwrap().spec.allocations.len(), 1);
        assert_eq!(store.cached_pool("p").unwrap().spec.allocations.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_copy_never_replaces_a_newer_one_and_a_late_deletion_keeps_the_pool_made_again() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        let store = Shared::new(base.handle("agent", FaultPlan::quiet(1)));
        let old = store.get_pool("p").await.unwrap().unwrap();
        store.add_allocation("p", 4, &entry("c4"), &AsRead::default()).await.unwrap();
        assert_eq!(store.cached_pool("p").unwrap().spec.allocations.len(), 1, "the write's answer");
        store.observe_pool(&old);
        assert_eq!(store.cached_pool("p").unwrap().spec.allocations.len(), 1, "an older watched copy is dropped");
        let newer = store.get_pool("p").await.unwrap().unwrap();
        base.add_allocation("p", 5, &entry("c5"), &AsRead::default()).await.unwrap();
        let newest = base.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some("p")).unwrap();
        store.observe_pool(&newest);
        assert_eq!(store.cached_pool("p").unwrap().spec.allocations.len(), 2, "a newer watched copy is taken");
        store.observe_pool_deleted(&newer);
        assert!(store.cached_pool("p").is_some(), "a deletion older than the copy forgets nothing");
        store.observe_pool_deleted(&newest);
        assert!(store.cached_pool("p").is_none(), "the deletion of what is known forgets it");
    }

    /// The first read of the pool hangs 5 s, then fails. A reader that asks while it is on the wire and before
    /// any other answer came shares it (and its failure); one that asks after this process's write was answered
    /// does not — the read on the wire may predate the write — and gets the next read, which shows the write.
    #[tokio::test(start_paused = true)]
    async fn a_read_on_the_wire_is_shared_only_by_readers_who_learnt_nothing_since_it_was_sent() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        let store = Shared::new(base.handle("agent", FaultPlan::quiet(3).at(Op::GetPool, 1, Fault::Timeout)));
        let at = |secs: u64| tokio::time::sleep(Duration::from_secs(secs));
        let first = async { store.get_pool("p").await };
        let sharing = async {
            at(1).await;
            store.get_pool("p").await
        };
        let writer = async {
            at(2).await;
            store.add_allocation("p", 9, &entry("c9"), &AsRead::default()).await
        };
        let after_the_write = async {
            at(3).await;
            store.get_pool("p").await
        };
        let (first, sharing, written, after) = tokio::join!(first, sharing, writer, after_the_write);
        assert!(first.is_err(), "{first:?}");
        assert!(sharing.is_err(), "the reader that learnt nothing since shared the read on the wire: {sharing:?}");
        assert_eq!(written.unwrap(), Patched::Applied);
        let after = after.expect("the next read").expect("the pool");
        assert_eq!(after.spec.allocations.len(), 1, "the read after the write shows it");
    }

    /// S10 of the fourth review: a read of the pool is on the wire (its answer, read at 0 s, comes at 5 s) when the
    /// binary, alone, writes the pod's entry (1 s: the agent declined that try); the runtime's retry begins through
    /// the agent at 2 s. It must not share the read sent before it began, which this process cannot know to be
    /// stale: it would miss its own entry and take a second address. A view that began before the read was sent
    /// still shares it.
    #[tokio::test(start_paused = true)]
    async fn an_invocation_shares_no_read_sent_before_it_began() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        let store = Shared::new(base.handle("agent", FaultPlan::quiet(3).at(Op::GetPool, 1, Fault::LateAnswer)));
        let at = |millis: u64| tokio::time::sleep(Duration::from_millis(millis));
        let earlier = store.for_invocation();
        let on_wire = async { earlier.get_pool("p").await };
        let sharing = async {
            at(2000).await;
            earlier.get_pool("p").await
        };
        let binary = async {
            at(1000).await;
            base.add_allocation("p", 9, &entry("c9"), &AsRead::default()).await
        };
        let retry = async {
            at(2000).await;
            store.for_invocation().get_pool("p").await
        };
        let (on_wire, sharing, written, retry) = tokio::join!(on_wire, sharing, binary, retry);
        assert_eq!(written.unwrap(), Patched::Applied);
        let entries = |read: Result<Option<IpPool>, StoreError>| read.unwrap().unwrap().spec.allocations.len();
        assert_eq!(entries(on_wire), 0, "the read sent at 0 s was answered as the pool was then");
        assert_eq!(entries(sharing), 0, "a view begun before the read was sent shared it");
        assert_eq!(entries(retry), 1, "the retry read the pool again, and found the binary's entry");
    }

    /// Found by a 100,000-case simulation run (a panic, "called after complete"): two invocations wait behind a read
    /// they cannot share; the first takes the second's place along and is killed before its read is answered.
    /// The second, its answer gone, reads itself and gets the pool, where it polled a spent channel.
    #[tokio::test(start_paused = true)]
    async fn a_reader_whose_place_a_killed_reader_took_along_reads_itself() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        let plan = FaultPlan::quiet(3).at(Op::GetPool, 1, Fault::LateAnswer).at(Op::GetPool, 2, Fault::LateAnswer);
        let store = Shared::new(base.handle("agent", plan));
        let at = |millis: u64| tokio::time::sleep(Duration::from_millis(millis));
        let on_wire = async { store.get_pool("p").await };
        let killed = async {
            at(1000).await;
            // begun after the read on the wire was sent: waits its turn; killed while its own read is out
            tokio::time::timeout(Duration::from_secs(7), store.for_invocation().get_pool("p")).await
        };
        let taken_along = async {
            at(2000).await;
            store.for_invocation().get_pool("p").await
        };
        let (on_wire, killed, taken_along) = tokio::join!(on_wire, killed, taken_along);
        assert!(matches!(on_wire, Ok(Some(_))), "{on_wire:?}");
        assert!(killed.is_err(), "killed before its read was answered: {killed:?}");
        assert!(matches!(taken_along, Ok(Some(_))), "it read the pool itself: {taken_along:?}");
    }

    /// The same for a write: two wait behind a batch on the wire; the first takes the second's write along in its
    /// batch and is killed before the answer. The second's write may have been applied: it is told so (ambiguous,
    /// to read back), where it polled a spent channel.
    #[tokio::test(start_paused = true)]
    async fn a_write_a_killed_sender_took_along_is_ambiguous() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        let plan =
            FaultPlan::quiet(3).at(Op::AddAllocation, 1, Fault::LateAnswer).at(Op::AddAllocation, 2, Fault::LateAnswer);
        let store = Shared::new(base.handle("agent", plan));
        let at = |millis: u64| tokio::time::sleep(Duration::from_millis(millis));
        let add = |offset: u128| {
            let store = store.clone();
            async move { store.add_allocation("p", offset, &entry(&format!("c{offset}")), &AsRead::default()).await }
        };
        let on_wire = add(1);
        let killed = async {
            at(1000).await;
            tokio::time::timeout(Duration::from_secs(7), add(2)).await
        };
        let taken_along = async {
            at(2000).await;
            add(3).await
        };
        let (on_wire, killed, taken_along) = tokio::join!(on_wire, killed, taken_along);
        assert_eq!(on_wire.unwrap(), Patched::Applied);
        assert!(killed.is_err(), "killed before its batch was answered: {killed:?}");
        let ambiguous = taken_along.expect_err("its batch ended unanswered");
        assert!(matches!(ambiguous.failure, crate::store::Failure::Ambiguous), "{ambiguous:?}");
    }

    /// Readers that ask together, before anything is answered, share one read; a reader whose read's sender is
    /// dropped (its invocation ended) gets an error, never waits for ever.
    #[tokio::test(start_paused = true)]
    async fn readers_that_meet_share_one_read_and_a_dropped_read_answers_its_joiners() {
        let base = MemoryStore::new("ns");
        pool_with(&base).await;
        // the second request is refused with 429: only a reader after the eight sends it
        let store = slow(&base, FaultPlan::quiet(3).at(Op::GetPool, 2, Fault::TooMany));
        let reads = (0..8).map(|_| {
            let store = store.clone();
            async move { store.get_pool("p").await }
        });
        let answers = futures::future::join_all(reads).await;
        assert!(answers.iter().all(|a| matches!(a, Ok(Some(_)))), "one read served all eight: {answers:?}");
        // a reader after their answer reads again: the 429 of the second request
        assert!(store.get_pool("p").await.is_err_and(|e| e.is_transient()));

        let store = Shared::new(base.handle("agent", FaultPlan::quiet(5).at(Op::GetPool, 1, Fault::Timeout)));
        let sender = tokio::spawn({
            let store = store.clone();
            async move { store.get_pool("p").await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let joiner = tokio::spawn({
            let store = store.clone();
            async move { store.get_pool("p").await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        sender.abort();
        let joined = tokio::time::timeout(Duration::from_secs(1), joiner).await.expect("answered").unwrap();
        assert!(joined.is_err(), "the read it joined ended: {joined:?}");
        assert!(store.get_pool("p").await.unwrap().is_some(), "the next read is sent");
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_claims_of_a_slice_take_turns() {
        let store = Shared::new(MemoryStore::new("ns"));
        let first = store.slice_turn("net").await.expect("the agent's store has turns");
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.slice_turn("net").await.is_some() }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the second waits while the first claims");
        drop(first);
        assert!(waiting.await.unwrap());
    }
}
