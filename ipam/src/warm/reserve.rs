//! A node agent's warm reserves (`warm_addresses`): per network config, slots claimed in advance by a filler task;
//! ADDs that take one, recorded in the node's journal before they answer; a hand-over task that rewrites taken
//! slots to their pods in batches, and goes on where it left after a crash (the journal).
//!
//! The journal is the truth about what pods hold until the API server says so; the slots in memory are only a
//! list of what may be handed out, rebuilt from the API server (adoption) when the agent starts.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use tokio::sync::Notify;

use super::journal::NodeJournal;
use super::{HandOverError, Slot, Take};
use crate::budget::Budget;
use crate::config::{IpamConfig, Slices};
use crate::request::{Assigned, Request};
use crate::store::{PoolStore, ReservationStore, SliceStore};
use crate::verbs::{Settling, WarmSettled};
use crate::warm;

/// Where the journal lives on the host by default: on disk, so that it outlives the agent's container.
pub const DEFAULT_DIR: &str = "/var/lib/hereabouts/warm";

/// What a reserve's store must do.
pub trait WarmStore: PoolStore + ReservationStore + SliceStore + Clone + 'static {}
impl<S: PoolStore + ReservationStore + SliceStore + Clone + 'static> WarmStore for S {}

/// Whether the fleet lets a reserve be kept, asked of the first reserve's store: `Err` says why not.
pub type FleetCheck<S> = Arc<dyn Fn(S) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// How often the fleet is checked again once a reserve was asked for: a Whereabouts reconciler installed later (a
/// rollback, its manifest applied again) is seen within this, and no slot is taken from then on.
pub const FLEET_EVERY: Duration = Duration::from_secs(60);

/// How long one hand-over round may take before what is left waits for the next.
const ROUND_BUDGET: Duration = Duration::from_secs(5);

/// The longest wait between fills that fail (the API server away), and between reads of the pools for adoption.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// How long takes must pause before the hand-over and a refill above [`LOW_WATER`] start: a burst's takes are
/// then handed over in one round per node, and its ADDs do not share the node's cores and the API server with
/// the writes of the ones before them.
const QUIET: Duration = Duration::from_millis(100);

/// The longest the background work waits for that pause under a steady stream of takes.
const QUIET_AT_MOST: Duration = Duration::from_secs(1);

/// The share of the reserve (1/4) below which a refill starts at once, pause or not.
const LOW_WATER: usize = 4;

/// A config's reserve on this node.
struct Network<S> {
    cfg: IpamConfig,
    mode: Slices,
    store: S,
    slots: VecDeque<Slot>,
    filler: bool,
    /// Whether what the API server holds of this reserve was taken in (once per process: after that, every slot
    /// of it is in `slots` or in the journal).
    adopted: bool,
    /// When an ADD first asked for it, and last ([`Reserves::retire_unwanted`] leaves one asked for since its NAD
    /// list, or lately: a config that is no NAD's, written on the node for a runtime, keeps its reserve while used).
    created: tokio::time::Instant,
    asked: tokio::time::Instant,
}

/// How long a reserve no NAD asks for is kept while ADDs still ask for it ([`Reserves::retire_unwanted`]).
pub const ASKED_LATELY: Duration = Duration::from_secs(600);

/// What the cluster's configs ask of warm reserves ([`Reserves::retire_unwanted`]): the reserves kept, and the
/// netconf names of their configs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    keys: HashSet<String>,
    names: HashSet<String>,
}

impl Wanted {
    /// Adds the reserve of `cfg` (through `kubeconfig`), if it keeps one (`warm_addresses` above 0).
    pub fn add(&mut self, kubeconfig: &Path, cfg: &IpamConfig, mode: &Slices) {
        if mode.warm > 0 {
            self.keys.insert(reserve_key(kubeconfig, cfg, mode));
            self.names.insert(cfg.name.clone());
        }
    }
}

struct Inner<S> {
    node: String,
    journal: Mutex<Option<NodeJournal>>,
    /// Why no reserve is kept, once that is known.
    refused: Mutex<Option<String>>,
    networks: Mutex<HashMap<String, Network<S>>>,
    /// The kubeconfigs' stores the takes in the journal are handed over through.
    stores: Mutex<HashMap<PathBuf, S>>,
    /// Takes a hand-over write may have been sent for (all of those replayed from the journal): not to be given
    /// back to the reserve by a DEL, only handed over.
    attempted: Mutex<HashSet<String>>,
    /// One hand-over at a time: the round's, or a DEL's.
    handing: tokio::sync::Mutex<()>,
    wake: Notify,
    /// When the last take was recorded (see [`QUIET`]).
    last_take: Mutex<Option<tokio::time::Instant>>,
    /// Whether the fleet was checked once (with the first reserve's store, which later checks use too); fills
    /// wait for that first answer.
    fleet_checked: tokio::sync::Mutex<bool>,
    /// Why the last fleet check refuses a reserve, if it does ([`FLEET_EVERY`]).
    fleet_refused: Mutex<Option<String>>,
    fleet_check: FleetCheck<S>,
    /// The slot containers [`Reserves::retire_unwanted`] is giving back: no reserve takes them in meanwhile.
    giving_back: Mutex<HashSet<String>>,
    /// Set when the agent stops (or, in the simulation, dies): its tasks end and write nothing more.
    stopped: AtomicBool,
    /// Set while the node's Node object is missing: the reconciler gives a gone Node's reserve back, so nothing
    /// of it is handed out until the Node is back and the reserve is read again from the API server.
    node_missing: AtomicBool,
}

/// The warm reserves of one agent.
pub struct Reserves<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for Reserves<S> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

impl<S> std::fmt::Debug for Reserves<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reserves").field("node", &self.inner.node).finish_non_exhaustive()
    }
}

impl<S: WarmStore> Reserves<S> {
    /// The reserves of `node`, with the journal in `dir`; takes it holds from before are handed over as soon as
    /// their stores are known ([`Reserves::know`]). A journal that cannot be opened keeps no reserve (every ADD
    /// claims its own) and says why.
    pub fn open(node: &str, dir: &Path, fleet_check: FleetCheck<S>) -> Self {
        let (journal, refused) = match NodeJournal::open(dir) {
            Ok(journal) => (Some(journal), None),
            Err(e) => {
                tracing::error!(error = %e, "warm reserve off: its journal cannot be used");
                (None, Some(e.to_string()))
            }
        };
        let attempted = journal.iter().flat_map(|j| j.pending().map(Take::id)).collect();
        let reserves = Self {
            inner: Arc::new(Inner {
                node: node.into(),
                journal: Mutex::new(journal),
                refused: Mutex::new(refused),
                networks: Mutex::default(),
                stores: Mutex::default(),
                attempted: Mutex::new(attempted),
                handing: tokio::sync::Mutex::new(()),
                wake: Notify::new(),
                last_take: Mutex::new(None),
                fleet_checked: tokio::sync::Mutex::new(false),
                fleet_refused: Mutex::new(None),
                fleet_check,
                giving_back: Mutex::default(),
                stopped: AtomicBool::new(false),
                node_missing: AtomicBool::new(false),
            }),
        };
        tokio::spawn(reserves.clone().hand_over_loop());
        reserves
    }

    /// Takes a slot of `cfg`'s reserve for the attachment `req` (see [`crate::verbs::Host::take_warm`]);
    /// `store` is the config's API server.
    pub fn take(
        &self,
        cfg: &IpamConfig,
        mode: &Slices,
        req: &Request,
        first: bool,
        kubeconfig: &Path,
        store: S,
    ) -> Option<Vec<Assigned>> {
        if self.stopped() || self.refused().is_some() {
            return None;
        }
        // a retry is still answered from the journal below; a new take waits for the Node
        let missing = self.inner.node_missing.load(Ordering::SeqCst);
        let id = warm::take_id(&cfg.name, &req.container_id, &req.ifname);
        let mut journal = self.inner.journal.lock().expect("not poisoned");
        let journal = journal.as_mut()?;
        if let Some(taken) = journal.get(&id) {
            // a retry of an ADD that took one: the same answer
            return Some(taken.slot.assigned());
        }
        if !first || missing {
            return None;
        }
        let key = reserve_key(kubeconfig, cfg, mode);
        let slot = {
            let mut networks = self.inner.networks.lock().expect("not poisoned");
            let network = networks.entry(key.clone()).or_insert_with(|| Network {
                cfg: cfg.clone(),
                mode: mode.clone(),
                store: store.clone(),
                slots: VecDeque::new(),
                filler: false,
                adopted: false,
                created: tokio::time::Instant::now(),
                asked: tokio::time::Instant::now(),
            });
            network.asked = tokio::time::Instant::now();
            let slot = network.slots.pop_front();
            if !network.filler {
                network.filler = true;
                tokio::spawn(self.clone().fill_loop(key.clone()));
            }
            slot?
        };
        let take = Take {
            reserve: key.clone(),
            network: cfg.name.clone(),
            kubeconfig: kubeconfig.to_path_buf(),
            node: req.node.clone(),
            slot,
            podref: cfg.pod.to_string(),
            poduid: cfg.pod.uid.clone(),
            container: req.container_id.clone(),
            ifname: req.ifname.clone(),
            at: crate::clock::now().to_string(),
        };
        self.inner.stores.lock().expect("not poisoned").insert(kubeconfig.to_path_buf(), store);
        let assigned = take.slot.assigned();
        if let Err(e) = journal.take(take.clone()) {
            // not recorded, so not handed out: the slot stays the node's
            tracing::error!(error = %e, "warm reserve: the take cannot be recorded; the ADD claims its own");
            self.put_back(take);
            return None;
        }
        tracing::info!(container_id = %take.container, slot = %take.slot.container, "took a warm slot");
        *self.inner.last_take.lock().expect("not poisoned") = Some(tokio::time::Instant::now());
        self.inner.wake.notify_one();
        Some(assigned)
    }

    /// Ends the pending take of attachment `req` of `network` before its DEL or CHECK (`why`): before a DEL, given
    /// back when nothing of its hand-over was sent yet, else handed over now; before a CHECK, handed over now or
    /// left pending. A CHECK comes for a running container: a slot given back would be the next pod's while this
    /// one still uses it.
    pub async fn settle(&self, network: &str, req: &Request, why: Settling) -> WarmSettled {
        let id = warm::take_id(network, &req.container_id, &req.ifname);
        let pending = |inner: &Inner<S>| inner.journal.lock().expect("not poisoned").as_ref()?.get(&id).cloned();
        if pending(&self.inner).is_none() {
            return WarmSettled::Nothing;
        }
        let _turn = self.inner.handing.lock().await;
        let Some(take) = pending(&self.inner) else { return WarmSettled::HandedOver };
        if why == Settling::Del && !self.inner.attempted.lock().expect("not poisoned").contains(&id) {
            let back = self.inner.journal.lock().expect("not poisoned").as_mut().map(|j| j.back(&id));
            return match back {
                Some(Ok(_)) => {
                    self.put_back(take);
                    WarmSettled::GivenBack
                }
                _ => WarmSettled::Pending,
            };
        }
        let done = self.round(vec![take]).await;
        if done == 1 { WarmSettled::HandedOver } else { WarmSettled::Pending }
    }

    /// Hands over now what the journal holds pending of attachment `ifname` of pod `podref` on network `network`,
    /// in any sandbox, before an ADD of it that no take answered looks for its entry in the API server, where the
    /// entry is still the node's until then: a sandbox made again after a reboot, or a retry after the network's
    /// config dropped its reserve, would claim a second address. `store` is the config's API server (`None`: it
    /// cannot be reached).
    pub async fn settle_attachment(
        &self,
        network: &str,
        podref: &str,
        ifname: &str,
        kubeconfig: &Path,
        store: Option<S>,
    ) -> WarmSettled {
        let pending = |inner: &Inner<S>| -> Vec<Take> {
            let journal = inner.journal.lock().expect("not poisoned");
            journal
                .iter()
                .flat_map(|j| j.pending())
                .filter(|t| t.is_attachment(network, podref, ifname))
                .cloned()
                .collect()
        };
        if pending(&self.inner).is_empty() {
            return WarmSettled::Nothing;
        }
        let Some(store) = store else { return WarmSettled::Pending };
        self.inner.stores.lock().expect("not poisoned").insert(kubeconfig.to_path_buf(), store);
        let _turn = self.inner.handing.lock().await;
        let takes = pending(&self.inner);
        let total = takes.len();
        if total == 0 || self.round(takes).await == total { WarmSettled::HandedOver } else { WarmSettled::Pending }
    }

    /// A slot given back by a DEL that came before its hand-over: to its reserve, or to the API server when
    /// that reserve is no longer kept.
    fn put_back(&self, take: Take) {
        if self.node_missing() {
            // the reserve is read again from the API server once the Node is back: the slot is still the node's
            return;
        }
        let mut networks = self.inner.networks.lock().expect("not poisoned");
        match networks.get_mut(&take.reserve) {
            Some(network) => network.slots.push_back(take.slot),
            None => {
                let store = self.inner.stores.lock().expect("not poisoned").get(&take.kubeconfig).cloned();
                if let Some(store) = store {
                    let node = self.inner.node.clone();
                    tokio::spawn(async move {
                        for e in warm::give_back(&store, &take.slot, &node, &Budget::new(ROUND_BUDGET)).await {
                            tracing::warn!(error = %e, "warm slot of a reserve no longer kept: not given back");
                        }
                    });
                }
            }
        }
    }

    /// Keeps the reserve `key` full: first what the API server holds of it already (an agent before this one
    /// claimed it), then new claims, all at once, backing off while they fail.
    async fn fill_loop(self, key: String) {
        let Some((cfg, mode, store)) = self.network(&key) else { return };
        if let Err(why) = self.fleet(&store).await {
            tracing::debug!(reason = %why, network = %cfg.name, "warm reserve refused: not filled");
            if let Some(network) = self.inner.networks.lock().expect("not poisoned").get_mut(&key) {
                network.filler = false;
            }
            return;
        }
        self.adopt(&key, &cfg, &store).await;
        let mut backoff = Duration::from_millis(200);
        loop {
            if self.stopped() || self.node_missing() || self.fleet_refuses() {
                if let Some(network) = self.inner.networks.lock().expect("not poisoned").get_mut(&key) {
                    network.filler = false;
                }
                return;
            }
            let warm = usize::try_from(mode.warm).unwrap_or(usize::MAX);
            let held = self.inner.networks.lock().expect("not poisoned").get(&key).map(|n| n.slots.len());
            if held.is_some_and(|held| held >= warm / LOW_WATER) {
                self.quiet().await;
            }
            let missing = {
                let mut networks = self.inner.networks.lock().expect("not poisoned");
                let Some(network) = networks.get_mut(&key) else { return };
                let missing = warm.saturating_sub(network.slots.len());
                if missing == 0 {
                    network.filler = false;
                    return;
                }
                missing
            };
            let node = self.inner.node.clone();
            let claims = (0..missing).map(|i| {
                let container = format!("warm-{:016x}", crate::entropy::random(&i.to_le_bytes()));
                let (store, cfg, mode, node) = (&store, &cfg, &mode, &node);
                async move { warm::fill(store, cfg, mode, node, &container, &Budget::new(cfg.timeout)).await }
            });
            // each slot goes into the reserve as soon as it is claimed: one slow claim keeps none of the others back
            let mut claimed = futures::stream::iter(claims).buffer_unordered(missing);
            let mut filled = 0;
            while let Some(outcome) = claimed.next().await {
                match outcome {
                    Ok(slot) => {
                        filled += 1;
                        // claimed as the Node went, or as the fleet check refused the reserve: it stays the node's,
                        // read again from the API server when the reserve may be used again
                        if let Some(network) = self.inner.networks.lock().expect("not poisoned").get_mut(&key)
                            && !self.node_missing()
                            && !self.fleet_refuses()
                        {
                            network.slots.push_back(slot);
                        }
                    }
                    Err(e) => tracing::warn!(network = %cfg.name, error = %e, "warm slot not claimed"),
                }
            }
            if filled == 0 {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            } else {
                backoff = Duration::from_millis(200);
            }
        }
    }

    fn network(&self, key: &str) -> Option<(IpamConfig, Slices, S)> {
        let networks = self.inner.networks.lock().expect("not poisoned");
        networks.get(key).map(|n| (n.cfg.clone(), n.mode.clone(), n.store.clone()))
    }

    /// Takes into the reserve the whole slots of this node the API server holds and the journal does not, and
    /// gives back the parts of slots a crash cut short. Until the pools can be listed, fills wait.
    async fn adopt(&self, key: &str, cfg: &IpamConfig, store: &S) {
        let adopted = self.inner.networks.lock().expect("not poisoned").get(key).is_none_or(|n| n.adopted);
        if adopted {
            return;
        }
        // the journal's takes as they are before the pools are read: one handed over (and recorded done) while the
        // list is on the wire still shows as the node's in it, and must not be taken in as free
        let pending = |inner: &Inner<S>| -> HashSet<String> {
            let journal = inner.journal.lock().expect("not poisoned");
            journal.iter().flat_map(|j| j.pending().map(|t| t.slot.container.clone())).collect()
        };
        let before = pending(&self.inner);
        let mut backoff = Duration::from_millis(200);
        let pools = loop {
            match store.list_pools().await {
                Ok(pools) => break pools,
                Err(e) => {
                    tracing::warn!(error = %e, "warm reserve: cannot list pools yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        };
        let mut taken = pending(&self.inner);
        taken.extend(before);
        let (whole, partial) = {
            let mut networks = self.inner.networks.lock().expect("not poisoned");
            let Some(network) = networks.get_mut(key) else { return };
            if self.node_missing() {
                return;
            }
            // what this process claimed meanwhile (none yet: fills wait for this), what it holds, and what it is
            // giving back as no config's
            taken.extend(network.slots.iter().map(|s| s.container.clone()));
            taken.extend(self.inner.giving_back.lock().expect("not poisoned").iter().cloned());
            let (whole, partial) = warm::adopt(cfg, &pools, &self.inner.node, &|c| taken.contains(c));
            network.slots.extend(whole.iter().cloned());
            network.adopted = true;
            (whole, partial)
        };
        if !whole.is_empty() {
            tracing::info!(network = %cfg.name, slots = whole.len(), "warm reserve: adopted what the node held");
        }
        for slot in partial {
            for e in warm::give_back(store, &slot, &self.inner.node, &Budget::new(ROUND_BUDGET)).await {
                tracing::warn!(error = %e, slot = %slot.container, "warm reserve: part of a slot not given back");
            }
        }
    }

    /// Whether the fleet lets a reserve be kept (not where Whereabouts' reconciler runs: it would free the node's
    /// entries as entries of no pod, and a pod told one could then share its address): asked of `store` the first
    /// time, and every [`FLEET_EVERY`] from then on.
    async fn fleet(&self, store: &S) -> Result<(), String> {
        let mut checked = self.inner.fleet_checked.lock().await;
        if !*checked {
            let verdict = (self.inner.fleet_check)(store.clone()).await;
            self.fleet_found(verdict);
            *checked = true;
            tokio::spawn(self.clone().fleet_loop(store.clone()));
        }
        drop(checked);
        self.inner.fleet_refused.lock().expect("not poisoned").clone().map_or(Ok(()), Err)
    }

    async fn fleet_loop(self, store: S) {
        loop {
            tokio::time::sleep(FLEET_EVERY).await;
            if self.stopped() {
                return;
            }
            let verdict = (self.inner.fleet_check)(store.clone()).await;
            self.fleet_found(verdict);
        }
    }

    /// What a fleet check found. Refused, no slot is taken and the reserves are dropped from memory: the
    /// reconciler found frees their entries (they name no pod), so a reserve allowed again is read again from the
    /// API server. Takes already made are still handed over.
    fn fleet_found(&self, verdict: Result<(), String>) {
        // set before the reserves are dropped (and never with the reserves' lock held): a fill that lands in
        // between sees it and keeps its slot out of memory
        let newly_refused = {
            let mut refused = self.inner.fleet_refused.lock().expect("not poisoned");
            match verdict {
                Err(why) => {
                    let newly = refused.is_none();
                    *refused = Some(why.clone());
                    newly.then_some(why)
                }
                Ok(()) => {
                    if let Some(why) = refused.take() {
                        tracing::info!(was = %why, "warm reserve allowed again");
                    }
                    None
                }
            }
        };
        if let Some(why) = newly_refused {
            tracing::error!(reason = %why, "warm reserve refused; ADDs claim their own");
            for network in self.inner.networks.lock().expect("not poisoned").values_mut() {
                network.slots.clear();
                network.adopted = false;
            }
        }
    }

    /// Hands the journal's pending takes over, in rounds: after each take, and every second while some are left.
    async fn hand_over_loop(self) {
        let mut backoff = Duration::from_secs(1);
        loop {
            let _ = tokio::time::timeout(backoff, self.inner.wake.notified()).await;
            if self.stopped() {
                return;
            }
            self.quiet().await;
            let _turn = self.inner.handing.lock().await;
            let pending: Vec<Take> = {
                let journal = self.inner.journal.lock().expect("not poisoned");
                journal.iter().flat_map(|j| j.pending().cloned()).collect()
            };
            if pending.is_empty() {
                backoff = Duration::from_secs(1);
                continue;
            }
            let total = pending.len();
            let done = self.round(pending).await;
            // at most two seconds apart: the API server back, what waits goes soon
            backoff = if done == total { Duration::from_secs(1) } else { (backoff * 2).min(Duration::from_secs(2)) };
        }
    }

    /// Returns once no take came for [`QUIET`], or after [`QUIET_AT_MOST`].
    async fn quiet(&self) {
        let deadline = tokio::time::Instant::now() + QUIET_AT_MOST;
        loop {
            let last = *self.inner.last_take.lock().expect("not poisoned");
            let Some(until) = last.map(|at| at + QUIET).filter(|until| *until > tokio::time::Instant::now()) else {
                return;
            };
            if until >= deadline {
                tokio::time::sleep_until(deadline).await;
                return;
            }
            tokio::time::sleep_until(until).await;
        }
    }

    /// One hand-over of `takes` (the caller holds the turn); returns how many ended.
    async fn round(&self, takes: Vec<Take>) -> usize {
        let mut by_store: HashMap<PathBuf, Vec<Take>> = HashMap::new();
        for take in takes {
            by_store.entry(take.kubeconfig.clone()).or_default().push(take);
        }
        let mut ended = 0;
        for (kubeconfig, takes) in by_store {
            let Some(store) = self.store_of(&kubeconfig) else { continue };
            let started = std::time::Instant::now();
            let outcomes = warm::hand_over(&store, &takes, &Budget::new(ROUND_BUDGET)).await;
            if self.stopped() {
                return ended;
            }
            let mut handed = 0;
            for (take, outcome) in takes.iter().zip(outcomes) {
                match outcome {
                    Ok(()) => handed += 1,
                    Err(HandOverError::Unsent(e)) => {
                        tracing::debug!(container_id = %take.container, error = %e, "hand-over waits, nothing sent");
                        continue;
                    }
                    Err(HandOverError::Later(e)) => {
                        // a DEL from now on hands it over rather than give the slot back
                        self.inner.attempted.lock().expect("not poisoned").insert(take.id());
                        tracing::debug!(container_id = %take.container, error = %e, "hand-over waits");
                        continue;
                    }
                    Err(e @ HandOverError::Lost { .. }) => {
                        tracing::error!(container_id = %take.container, podref = %take.podref, error = %e,
                            "warm slot lost before its hand-over: the pod's address may be held twice");
                    }
                }
                let done = self.inner.journal.lock().expect("not poisoned").as_mut().map(|j| j.done(&take.id()));
                if let Some(Err(e)) = done {
                    tracing::error!(error = %e, "warm journal: the hand-over's end cannot be recorded");
                    continue;
                }
                self.inner.attempted.lock().expect("not poisoned").remove(&take.id());
                ended += 1;
            }
            tracing::info!(takes = takes.len(), handed, ms = started.elapsed().as_millis() as u64, "warm hand-over");
        }
        ended
    }

    /// The store of `kubeconfig`: the one its takes came with, or the one [`Reserves::know`] was told of.
    fn store_of(&self, kubeconfig: &Path) -> Option<S> {
        self.inner.stores.lock().expect("not poisoned").get(kubeconfig).cloned()
    }

    /// Tells the reserves the store of `kubeconfig`: takes replayed from the journal are handed over through it.
    pub fn know(&self, kubeconfig: &Path, store: S) {
        self.inner.stores.lock().expect("not poisoned").insert(kubeconfig.to_path_buf(), store);
        self.inner.wake.notify_one();
    }

    /// The kubeconfigs of takes the journal holds whose stores are not known yet.
    pub fn unknown_kubeconfigs(&self) -> Vec<PathBuf> {
        let journal = self.inner.journal.lock().expect("not poisoned");
        let stores = self.inner.stores.lock().expect("not poisoned");
        let mut paths: Vec<PathBuf> = journal
            .iter()
            .flat_map(|j| j.pending().map(|t| t.kubeconfig.clone()))
            .filter(|k| !stores.contains_key(k))
            .collect();
        paths.dedup();
        paths
    }

    /// Gives back what no config asks a reserve for any more, `wanted` being what the cluster's configs asked for
    /// as listed at `listed_at`: each reserve in memory made before then, and no ADD asked of for
    /// [`ASKED_LATELY`], whose config is not wanted (its
    /// `warm_addresses` removed or 0, its NAD deleted, its key changed: a new slice size, gateway or overlap
    /// setting), and, in every API server this process knows, this node's warm entries of a network no wanted
    /// config and no reserve in memory names, unless a pending take holds them — the latter only with `search`
    /// (a LIST of every pool: the caller asks for it when what is wanted changed, or at start). Each only while
    /// still the node's. Returns how many slots it gave back.
    pub async fn retire_unwanted(&self, wanted: &Wanted, listed_at: tokio::time::Instant, search: bool) -> usize {
        if self.stopped() || self.node_missing() {
            return 0;
        }
        let dropped: Vec<(S, Slot)> = {
            let mut networks = self.inner.networks.lock().expect("not poisoned");
            let unwanted: Vec<String> = networks
                .iter()
                .filter(|(key, n)| {
                    !wanted.keys.contains(*key) && n.created < listed_at && n.asked.elapsed() >= ASKED_LATELY
                })
                .map(|(key, _)| key.clone())
                .collect();
            let mut dropped = Vec::new();
            for key in unwanted {
                let Some(network) = networks.remove(&key) else { continue };
                tracing::info!(network = %network.cfg.name, slots = network.slots.len(),
                    "warm reserve no config asks for: given back");
                dropped.extend(network.slots.into_iter().map(|slot| (network.store.clone(), slot)));
            }
            let mut giving = self.inner.giving_back.lock().expect("not poisoned");
            giving.extend(dropped.iter().map(|(_, slot)| slot.container.clone()));
            dropped
        };
        let mut given = 0;
        for (store, slot) in &dropped {
            given += self.give_back_stray(store, slot).await;
        }
        let stores: Vec<S> = match search || !dropped.is_empty() {
            true => self.inner.stores.lock().expect("not poisoned").values().cloned().collect(),
            false => Vec::new(),
        };
        for store in stores {
            let Ok(pools) = store.list_pools().await else { continue };
            let strays = {
                // in take()'s order (the journal, then the reserves): no slot moves between them while this looks
                let journal = self.inner.journal.lock().expect("not poisoned");
                let networks = self.inner.networks.lock().expect("not poisoned");
                let mut giving = self.inner.giving_back.lock().expect("not poisoned");
                let mut held: HashSet<String> = giving.iter().cloned().collect();
                held.extend(journal.iter().flat_map(|j| j.pending().map(|t| t.slot.container.clone())));
                held.extend(networks.values().flat_map(|n| n.slots.iter().map(|s| s.container.clone())));
                // a reserve in memory may be filling: its network's entries are never strays
                let kept: HashSet<&str> = networks.values().map(|n| n.cfg.name.as_str()).collect();
                let unwanted = |network: &str| !wanted.names.contains(network) && !kept.contains(network);
                let strays = warm::strays(&pools, &self.inner.node, &unwanted, &|c| held.contains(c));
                giving.extend(strays.iter().map(|slot| slot.container.clone()));
                strays
            };
            for slot in &strays {
                given += self.give_back_stray(&store, slot).await;
            }
        }
        given
    }

    async fn give_back_stray(&self, store: &S, slot: &Slot) -> usize {
        let errors = warm::give_back(store, slot, &self.inner.node, &Budget::new(ROUND_BUDGET)).await;
        for e in &errors {
            tracing::warn!(error = %e, slot = %slot.container, "warm slot no config asks for: not given back");
        }
        self.inner.giving_back.lock().expect("not poisoned").remove(&slot.container);
        usize::from(errors.is_empty())
    }

    /// What a read of the node's Node object found. Missing, the reserves are dropped from memory (their
    /// entries stay the node's until the reconciler, after its grace period, gives them back) and no slot is taken;
    /// back, they are read again from the API server on the next take. The agent reads its Node more often than
    /// the reconciler's grace period, so it stops taking before the reconciler can give anything back.
    pub fn node_seen(&self, exists: bool) {
        let was_missing = self.inner.node_missing.swap(!exists, Ordering::SeqCst);
        if exists || was_missing {
            return;
        }
        tracing::warn!(node = %self.inner.node, "the Node is missing: the warm reserve is not used until it is back");
        for network in self.inner.networks.lock().expect("not poisoned").values_mut() {
            network.slots.clear();
            network.adopted = false;
        }
    }

    fn fleet_refuses(&self) -> bool {
        self.inner.fleet_refused.lock().expect("not poisoned").is_some()
    }

    fn node_missing(&self) -> bool {
        self.inner.node_missing.load(Ordering::SeqCst)
    }

    /// Stops the reserves' tasks: nothing more is claimed, handed over or recorded.
    pub fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        self.inner.wake.notify_one();
    }

    fn stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    /// How many slots each reserve holds now, by network name (for tests and the log).
    pub fn held(&self) -> HashMap<String, usize> {
        let networks = self.inner.networks.lock().expect("not poisoned");
        let mut held = HashMap::new();
        for network in networks.values() {
            *held.entry(network.cfg.name.clone()).or_default() += network.slots.len();
        }
        held
    }

    /// Why no reserve is kept, if none is: its journal cannot be used, or the last fleet check refuses it.
    pub fn refused(&self) -> Option<String> {
        let journal = self.inner.refused.lock().expect("not poisoned").clone();
        journal.or_else(|| self.inner.fleet_refused.lock().expect("not poisoned").clone())
    }

    /// How many takes wait for their hand-over.
    pub fn pending(&self) -> usize {
        self.inner.journal.lock().expect("not poisoned").as_ref().map_or(0, |j| j.pending().count())
    }
}

/// The reserve of a config: its API server, its network, and what decides which addresses it holds.
fn reserve_key(kubeconfig: &Path, cfg: &IpamConfig, mode: &Slices) -> String {
    format!(
        "{}\n{}\n{}\n{:?}\n{:?}\n{}\n{:?}",
        kubeconfig.display(),
        cfg.name,
        cfg.network_name,
        cfg.ranges,
        cfg.gateway,
        mode.kube.overlapping_ranges,
        mode.size,
    )
}
