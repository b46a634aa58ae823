//! The warm reserve (`warm_addresses`, node slices mode, node agent only): addresses a node claims in advance in
//! its own slices, so that an ADD answers from the node without a request on its path — and goes on while the API
//! server is away.
//!
//! A warm address is an ordinary pool entry (and reservation) whose pod reference is the node's own token
//! ([`podref`]): `hereabouts-warm:<node>`, which no pod can have (no `/`, so it names no namespace). The claim that
//! makes it is an ADD like any other ([`fill`]), so every guard of an ADD holds for it. An ADD that takes one
//! records a [`Take`] in the node's journal ([`journal`], fsync) before it answers; the agent then hands entry and
//! reservation over to the pod with guarded writes ([`hand_over`]) — reservation first, then entries, one patch
//! per pool for all takes that meet — and records that it is done. A take the journal holds is the pod's
//! whatever the API server says yet: after a crash the journal is replayed, never guessed from the pools.
//!
//! What keeps a warm entry from being given back as an orphan: the reconciler judges an entry of a warm token by
//! its node (kept while the Node exists, released with it), CNI GC leaves it alone, and the in-use guard of slice
//! mode counts it as the pool's use like any entry. Whereabouts' reconciler knows none of this and would free it,
//! which is why a fleet that runs it must not enable the reserve (docs/safety.md).

mod fleet;
pub mod journal;
mod reserve;

pub use fleet::whereabouts_reconciler;

pub use reserve::{ASKED_LATELY, DEFAULT_DIR, FLEET_EVERY, FleetCheck, Reserves, Wanted, WarmStore};

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::budget::Budget;
use crate::claim::{Journal, Written, reservation_of};
use crate::config::{IpamConfig, Slices as SliceMode};
use crate::crd::{IpAllocation, IpPool, OverlappingRangeIpReservationSpec};
use crate::error::IpamError;
use crate::request::{Assigned, Request};
use crate::store::{Claim, Created, Patched, PoolStore, ReservationStore, SliceStore, StoreError, guard};

/// The most warm addresses a network may keep per node: a reserve is a node's share of a burst, not a slice.
pub const MAX_WARM: u64 = 256;

const PODREF_PREFIX: &str = "hereabouts-warm:";

/// The pod reference of node `node`'s warm entries.
pub fn podref(node: &str) -> String {
    format!("{PODREF_PREFIX}{node}")
}

/// The node whose warm entry `podref` marks, if it is one.
pub fn node_of(podref: &str) -> Option<&str> {
    podref.strip_prefix(PODREF_PREFIX).filter(|node| !node.is_empty())
}

/// One warm address of one range: where its entry is, and what an ADD answers with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// The pool that holds the entry.
    pub pool: String,
    /// The entry's offset in it.
    pub offset: u128,
    /// The address.
    pub ip: IpAddr,
    /// The prefix length of its range.
    pub prefix_len: u8,
    /// The configured gateway, if it lies in this range.
    pub gateway: Option<IpAddr>,
    /// The reservation that claims it, if the network reserves.
    pub reservation: Option<String>,
}

/// One attachment's worth of warm addresses — one per range of the config, all under one container id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// The container id its entries and reservations record.
    pub container: String,
    /// One address per range, in the config's order.
    pub held: Vec<Held>,
}

impl Slot {
    /// What an ADD that takes this slot answers.
    pub fn assigned(&self) -> Vec<Assigned> {
        self.held.iter().map(|h| Assigned { ip: h.ip, prefix_len: h.prefix_len, gateway: h.gateway }).collect()
    }

    /// The entry as [`fill`] wrote it at `held`, as far as the guards test it.
    fn entry(&self, node: &str) -> IpAllocation {
        IpAllocation {
            id: self.container.clone(),
            podref: podref(node),
            ifname: self.container.clone(),
            ..Default::default()
        }
    }
}

/// A warm slot taken by an ADD: recorded in the journal before the ADD answers, handed over to the pod after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Take {
    /// The reserve it came from (the agent's key of a network's config): where a DEL before the hand-over puts
    /// the slot back.
    pub reserve: String,
    /// The netconf's `name`.
    pub network: String,
    /// The kubeconfig of the API server the slot's objects live in.
    pub kubeconfig: PathBuf,
    /// The node whose reserve it came from.
    pub node: String,
    /// The slot.
    pub slot: Slot,
    /// The pod, `namespace/name`.
    pub podref: String,
    /// Its UID, if the runtime passed one.
    pub poduid: Option<String>,
    /// The sandbox.
    pub container: String,
    /// The interface.
    pub ifname: String,
    /// When the ADD took it, RFC 3339: the entry's allocation time.
    pub at: String,
}

impl Take {
    /// The journal's key of the attachment: one take per network, container and interface.
    pub fn id(&self) -> String {
        take_id(&self.network, &self.container, &self.ifname)
    }

    /// Whether it gave attachment `ifname` of pod `podref` on network `network` its address, in any sandbox: an
    /// ADD of the attachment that this take does not answer must not claim another while it is pending.
    pub fn is_attachment(&self, network: &str, podref: &str, ifname: &str) -> bool {
        self.network == network && self.podref == podref && self.ifname == ifname
    }

    /// The entry the pod holds at `held` once handed over.
    fn entry(&self, held: &Held) -> IpAllocation {
        IpAllocation {
            id: self.container.clone(),
            podref: self.podref.clone(),
            ifname: self.ifname.clone(),
            poduid: self.poduid.clone(),
            allocated: Some(self.at.clone()),
            node: Some(self.node.clone()),
            network: Some(self.network.clone()).filter(|n| !n.is_empty()),
            reserved: held.reservation.is_some(),
            statefulset: None,
            ipamclaim: None,
            recorded_for: Some(self.container.clone()),
        }
    }

    fn claim(&self) -> Claim {
        Claim {
            spec: OverlappingRangeIpReservationSpec {
                containerid: self.container.clone(),
                ifname: self.ifname.clone(),
                podref: self.podref.clone(),
                ipamclaim: None,
            },
            node: self.node.clone(),
            at: crate::clock::now(),
        }
    }
}

/// The journal's key of an attachment of network `network`.
pub fn take_id(network: &str, container: &str, ifname: &str) -> String {
    format!("{network}\n{container}\n{ifname}")
}

/// The pending takes of the journal in `dir` that gave attachment `ifname` of pod `podref` on network `network`
/// its address, in whichever sandbox, read without writing (none when the journal cannot be read, as
/// [`read_take`]).
pub fn read_attachment_takes(dir: &std::path::Path, network: &str, podref: &str, ifname: &str) -> Vec<Take> {
    match journal::read_pending(dir) {
        Ok(pending) => pending.into_values().filter(|t| t.is_attachment(network, podref, ifname)).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "the agent's warm journal cannot be read");
            Vec::new()
        }
    }
}

/// The take `id` ([`take_id`]) the journal in `dir` holds pending, read without writing; `None` also when the
/// journal cannot be read (said in the log: the ADD then claims its own, as without an agent).
pub fn read_take(dir: &std::path::Path, id: &str) -> Option<Take> {
    match journal::read_pending(dir) {
        Ok(mut pending) => pending.remove(id),
        Err(e) => {
            tracing::warn!(error = %e, "the agent's warm journal cannot be read");
            None
        }
    }
}

/// Why a hand-over did not finish.
#[derive(Debug, thiserror::Error)]
pub enum HandOverError {
    /// The API server did not let it finish (unreachable, overloaded, out of time): try again later.
    #[error("{0}")]
    Later(IpamError),
    /// As [`HandOverError::Later`], before any write of it was sent: the slot is still untouched, the node's.
    #[error("{0}")]
    Unsent(IpamError),
    /// The warm entry or reservation is someone else's now (another tool released it and another pod claimed
    /// it): the pod's address may be held twice. Nothing can be written for it; an operator must look.
    #[error("warm {what} is no longer the node's: {found}")]
    Lost {
        /// The entry or reservation.
        what: String,
        /// What holds it now.
        found: String,
    },
}

/// Claims one slot for `node`'s reserve of `cfg`: an ADD under the node's token, in the node's slices, with every
/// guard an ADD has; rolled back if it fails half-way. Its interface name is its container id: of two entries
/// of one pod and interface, an ADD takes the other for its own attachment's (a sandbox before it), and every
/// slot is an attachment of its own.
pub async fn fill<S: PoolStore + ReservationStore + SliceStore>(
    store: &S,
    cfg: &IpamConfig,
    mode: &SliceMode,
    node: &str,
    container: &str,
    budget: &Budget,
) -> Result<Slot, IpamError> {
    let mut cfg = cfg.clone();
    cfg.pod = crate::config::PodRef::default();
    cfg.requested.clear();
    let req = Request { container_id: container.into(), ifname: container.into(), node: node.into() };
    let token = podref(node);
    let (assigned, journal) = crate::slices::add_for_node(store, &cfg, mode, &req, budget, &token).await?;
    let mut held = Vec::with_capacity(assigned.len());
    for a in &assigned {
        match placed(store, &journal, container, a.ip, budget).await {
            Ok(Some((pool, offset, reservation))) => {
                held.push(Held { pool, offset, ip: a.ip, prefix_len: a.prefix_len, gateway: a.gateway, reservation });
            }
            Ok(None) => {
                let e = IpamError::Refused {
                    what: format!("warm address {}", a.ip),
                    message: "its entry is not where the claim wrote it".into(),
                };
                return Err(undo(store, journal, budget, e).await);
            }
            Err(e) => return Err(undo(store, journal, budget, e).await),
        }
    }
    Ok(Slot { container: container.into(), held })
}

async fn undo(
    store: &(impl PoolStore + ReservationStore),
    journal: Journal,
    budget: &Budget,
    e: IpamError,
) -> IpamError {
    for failed in journal.roll_back(store, budget).await {
        tracing::error!(error = %failed, "roll-back of a warm claim");
    }
    e
}

/// Which of the pools `journal` wrote to holds `container`'s entry of `ip`, with its reservation's name: read
/// back (from the store's copy when it shows the entry), since the journal says only what was tried. A copy that
/// does not show it proves nothing: after a write whose answer was lost, a watch may bring an older copy.
async fn placed<S: PoolStore>(
    store: &S,
    journal: &Journal,
    container: &str,
    ip: IpAddr,
    budget: &Budget,
) -> Result<Option<(String, u128, Option<String>)>, IpamError> {
    for (pool, offset) in journal.entries_of(container) {
        let shows = |p: &IpPool| p.spec.allocations.get(&offset.to_string()).is_some_and(|a| a.id == container);
        let read = match store.cached_pool(pool).filter(|p| shows(p)) {
            Some(p) => Some(p),
            None => budget
                .retry(StoreError::is_transient, || store.get_pool(pool))
                .await
                .map_err(|e| IpamError::from_retry(&format!("pool {pool}: get"), e))?,
        };
        let Some(read) = read else { continue };
        let ours = read.spec.allocations.get(&offset.to_string()).is_some_and(|a| a.id == container);
        if ours && crate::claim::address_of(&read, offset) == Some(ip) {
            let reservation = journal.reservation_of(pool, offset).or_else(|| {
                read.spec.allocations[&offset.to_string()].reserved.then(|| reservation_of(&read, offset)).flatten()
            });
            return Ok(Some((pool.to_string(), offset, reservation)));
        }
    }
    Ok(None)
}

/// The slots of `node`'s warm entries of `cfg` that `pools` hold, complete ones (an address in every range) apart
/// from the rest (a fill cut short by a crash), which are to be given back ([`give_back`]). Slots whose container
/// `taken` names are the journal's and left out.
pub fn adopt(cfg: &IpamConfig, pools: &[IpPool], node: &str, taken: &dyn Fn(&str) -> bool) -> (Vec<Slot>, Vec<Slot>) {
    let token = podref(node);
    let mut found: BTreeMap<String, Vec<Option<Held>>> = BTreeMap::new();
    for pool in pools.iter().filter(|p| crate::slices::of_network(p, &cfg.network_name)) {
        let Some(name) = pool.metadata.name.as_deref() else { continue };
        for (key, entry) in &pool.spec.allocations {
            let ours = entry.podref == token && entry.network.as_deref() == Some(cfg.name.as_str());
            let (Ok(offset), true) = (key.parse::<u128>(), ours) else { continue };
            if taken(&entry.id) {
                continue;
            }
            let Some(ip) = crate::claim::address_of(pool, offset) else { continue };
            let Some(index) = cfg.ranges.iter().position(|r| r.cidr().contains(&ip)) else { continue };
            let range = &cfg.ranges[index];
            let held = Held {
                pool: name.to_string(),
                offset,
                ip,
                prefix_len: range.cidr().prefix_len(),
                gateway: cfg.gateway.filter(|gw| range.cidr().contains(gw)),
                reservation: entry.reserved.then(|| reservation_of(pool, offset)).flatten(),
            };
            let slots = found.entry(entry.id.clone()).or_insert_with(|| vec![None; cfg.ranges.len()]);
            slots[index] = Some(held);
        }
    }
    let (mut whole, mut partial) = (Vec::new(), Vec::new());
    for (container, held) in found {
        if held.iter().all(Option::is_some) {
            whole.push(Slot { container, held: held.into_iter().flatten().collect() });
        } else {
            partial.push(Slot { container, held: held.into_iter().flatten().collect() });
        }
    }
    (whole, partial)
}

/// The slots of `node`'s warm entries in `pools` whose network (the netconf name an entry records) `unwanted` says
/// no reserve is kept for, leaving out the containers `held` names (a reserve's or a pending take's): what is left
/// of reserves no config asks for, to be given back ([`give_back`]), whole slots or parts alike.
pub fn strays(pools: &[IpPool], node: &str, unwanted: &dyn Fn(&str) -> bool, held: &dyn Fn(&str) -> bool) -> Vec<Slot> {
    let token = podref(node);
    let mut found: BTreeMap<String, Vec<Held>> = BTreeMap::new();
    for pool in pools {
        let Some(name) = pool.metadata.name.as_deref() else { continue };
        for (key, entry) in &pool.spec.allocations {
            let network = entry.network.as_deref().unwrap_or_default();
            if entry.podref != token || !unwanted(network) || held(&entry.id) {
                continue;
            }
            let (Ok(offset), Some((range, _))) = (key.parse::<u128>(), crate::claim::pool_scope(pool)) else {
                continue;
            };
            let Some(ip) = crate::claim::address_of(pool, offset) else { continue };
            found.entry(entry.id.clone()).or_default().push(Held {
                pool: name.to_string(),
                offset,
                ip,
                prefix_len: range.cidr().prefix_len(),
                gateway: None,
                reservation: entry.reserved.then(|| reservation_of(pool, offset)).flatten(),
            });
        }
    }
    found.into_iter().map(|(container, held)| Slot { container, held }).collect()
}

/// Gives `slot` of `node` back: its entries, then its reservations, each only while still the node's.
pub async fn give_back(
    store: &(impl PoolStore + ReservationStore),
    slot: &Slot,
    node: &str,
    budget: &Budget,
) -> Vec<IpamError> {
    let mut journal = Journal::default();
    let token = podref(node);
    for held in &slot.held {
        if let Some(name) = &held.reservation {
            journal.record(Written::Reservation {
                name: name.clone(),
                podref: token.clone(),
                container: slot.container.clone(),
            });
        }
        journal.record(Written::Allocation {
            pool: held.pool.clone(),
            offset: held.offset,
            entry: Box::new(slot.entry(node)),
            reservation: held.reservation.clone(),
        });
    }
    journal.roll_back(store, budget).await
}

/// Hands the slots of `takes` over to their pods: each reservation (read, then rewritten at the version read),
/// then the entries, one guarded patch per pool for all of `takes` that meet there. Each take's outcome, in
/// order; a take is done only when all of its objects are the pod's. Every step may be sent again: what is the
/// pod's already is left as it is.
pub async fn hand_over<S: PoolStore + ReservationStore>(
    store: &S,
    takes: &[Take],
    budget: &Budget,
) -> Vec<Result<(), HandOverError>> {
    let claimed = futures::future::join_all(takes.iter().map(|t| reservations_over(store, t, budget))).await;
    let mut outcome: Vec<Result<(), HandOverError>> = claimed;
    let mut by_pool: HashMap<&str, Vec<(usize, &Take, &Held)>> = HashMap::new();
    for (i, take) in takes.iter().enumerate() {
        if outcome[i].is_ok() {
            for held in &take.slot.held {
                by_pool.entry(held.pool.as_str()).or_default().push((i, take, held));
            }
        }
    }
    let results = futures::future::join_all(
        by_pool
            .iter()
            .map(|(pool, entries)| async move { (entries, entries_over(store, pool, entries, budget).await) }),
    )
    .await;
    for (entries, result) in results {
        for ((i, _, _), r) in entries.iter().zip(result) {
            if outcome[*i].is_ok()
                && let Err(e) = r
            {
                outcome[*i] = Err(e);
            }
        }
    }
    outcome
}

async fn reservations_over(store: &impl ReservationStore, take: &Take, budget: &Budget) -> Result<(), HandOverError> {
    let token = podref(&take.node);
    let claim = take.claim();
    // whether a write of this take may have reached the server: until then, a failure leaves the slot untouched
    let mut sent = false;
    let failed = |sent: bool, e: IpamError| if sent { HandOverError::Later(e) } else { HandOverError::Unsent(e) };
    for name in take.slot.held.iter().filter_map(|h| h.reservation.as_deref()) {
        let mut attempt = 0;
        loop {
            budget
                .pause(attempt)
                .await
                .map_err(|_| failed(sent, IpamError::Expired(format!("reservation {name}: hand over"))))?;
            attempt += 1;
            let current = budget
                .retry(StoreError::is_transient, || store.get_reservation(name))
                .await
                .map_err(|e| failed(sent, IpamError::from_retry(&format!("reservation {name}: get"), e)))?;
            match current {
                Some(r) if r.spec.podref == take.podref && r.spec.containerid == take.container => break,
                Some(r) if r.spec.podref == token && r.spec.containerid == take.slot.container => {
                    sent = true;
                    let done = budget.retry(StoreError::is_transient, || store.take_over_reservation(&r, &claim)).await;
                    match done {
                        Ok(Patched::Applied) => break,
                        // changed or gone since the read, or an answer lost: the next read tells
                        Ok(Patched::Refused(_) | Patched::Missing) | Err(_) => {}
                    }
                }
                Some(r) => {
                    return Err(HandOverError::Lost {
                        what: format!("reservation {name}"),
                        found: format!("held by {} (container {})", r.spec.podref, r.spec.containerid),
                    });
                }
                // deleted by another tool: the pod's claim is put back, as the reconciler restores a live one's
                None => {
                    sent = true;
                    let created =
                        budget.retry(StoreError::is_transient, || store.create_reservation(name, &claim)).await;
                    if let Ok(Created::Created(_)) = created {
                        break;
                    }
                }
            }
        }
    }
    Ok(())
}

fn later(what: String, e: Option<StoreError>) -> HandOverError {
    HandOverError::Later(IpamError::Expired(match e {
        Some(e) => format!("{what}: {e}"),
        None => what,
    }))
}

/// Rewrites `entries` (all of pool `pool`) from the node's to their pods': one patch for all, then one by one
/// for those a failed patch leaves in doubt.
async fn entries_over<S: PoolStore>(
    store: &S,
    pool: &str,
    entries: &[(usize, &Take, &Held)],
    budget: &Budget,
) -> Vec<Result<(), HandOverError>> {
    let rewrite =
        |take: &Take, held: &Held| guard::replace_entry(held.offset, &take.slot.entry(&take.node), &take.entry(held));
    let patch = json_patch::Patch(entries.iter().flat_map(|(_, t, h)| rewrite(t, h).0).collect());
    let op = format!("hand {} warm entries over", entries.len());
    let sent = budget.retry(StoreError::is_transient, || store.apply_pool_patch(pool, &op, &patch)).await;
    if let Ok((Patched::Applied, _)) = sent {
        return entries.iter().map(|_| Ok(())).collect();
    }
    // refused (one of them is not as expected), gone, or no answer: read, and settle each on its own
    let mut results = Vec::with_capacity(entries.len());
    for (_, take, held) in entries {
        results.push(entry_over(store, pool, take, held, budget).await);
    }
    results
}

async fn entry_over<S: PoolStore>(
    store: &S,
    pool: &str,
    take: &Take,
    held: &Held,
    budget: &Budget,
) -> Result<(), HandOverError> {
    let (warm, mine) = (take.slot.entry(&take.node), take.entry(held));
    let mut attempt = 0;
    loop {
        budget
            .pause(attempt)
            .await
            .map_err(|_| later(format!("pool {pool}: hand entry {} over", held.offset), None))?;
        attempt += 1;
        let read = budget
            .retry(StoreError::is_transient, || store.get_pool(pool))
            .await
            .map_err(|e| HandOverError::Later(IpamError::from_retry(&format!("pool {pool}: get"), e)))?;
        let found = read.as_ref().and_then(|p| p.spec.allocations.get(&held.offset.to_string()));
        match found {
            Some(e) if e.id == mine.id && e.podref == mine.podref => return Ok(()),
            Some(e) if e.id == warm.id && e.podref == warm.podref => {
                let sent = budget
                    .retry(StoreError::is_transient, || store.replace_allocation(pool, held.offset, &warm, &mine))
                    .await;
                if let Ok(Patched::Applied) = sent {
                    return Ok(());
                }
            }
            other => {
                return Err(HandOverError::Lost {
                    what: format!("entry {} of pool {pool} ({})", held.offset, held.ip),
                    found: other.map_or_else(|| "free".into(), |e| format!("held by {} ({})", e.podref, e.id)),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
