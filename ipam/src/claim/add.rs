//! The claim of one address in one pool, with no lock: the reservation is the cluster-wide claim, the guarded
//! patch the pool's. Every path that ends with an entry for the attachment ends with its reservation too; a write
//! without an answer is resolved by reading back. Every mode on the API server claims through here; what a mode
//! adds (a pool it must not create, a sub-interface to place) it says through its [`Policy`].

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;

use super::Claimant;
use super::decide::{self, Ask, AtOffset, Plan};
use super::journal::{Journal, Written, remove_entry};
use super::reservation::{self, Claimed as Reserved};
use crate::budget::Budget;
use crate::crd::drift::{self, IPPOOLS_CRD};
use crate::crd::{IpAllocation, IpPool, SubInterfaceRecord};
use crate::error::IpamError;
use crate::names;
use crate::range::IpRange;
use crate::store::{AsRead, Created, NewPool, Patched, PoolStore, ReservationStore, StoreError};
use crate::{clock, cooldown};

/// Which pool an address is claimed in, and what the caller already knows.
#[derive(Debug, Clone)]
pub(crate) struct Target<'a> {
    /// The pool's name (the range's, or one slice's).
    pub pool: String,
    /// The range the pool holds.
    pub range: &'a IpRange,
    /// An exact address asked for in this range.
    pub requested: Option<IpAddr>,
    /// An address to take first if it is free (the pod's preferred address).
    pub preferred: Option<IpAddr>,
    /// Offsets of addresses earlier ranges of this ADD gave: not to be given again.
    pub given: BTreeSet<u128>,
    /// The pool as already read, if it was.
    pub read: Option<IpPool>,
    /// `read` is a hint from the store's cache ([`PoolStore::cached_pool`]), not a read: the pool is read before
    /// it is called full.
    pub hinted: bool,
    /// The StatefulSet the entry records (a sticky range).
    pub statefulset: Option<String>,
}

impl<'a> Target<'a> {
    /// The pool `pool` of `range`, nothing known or asked yet.
    pub fn new(pool: String, range: &'a IpRange) -> Self {
        Self {
            pool,
            range,
            requested: None,
            preferred: None,
            given: BTreeSet::new(),
            read: None,
            hinted: false,
            statefulset: None,
        }
    }
}

/// What the pool's state steers a claim to, as a mode reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Steer {
    /// Offsets not to take, though free.
    pub avoid: Vec<u128>,
    /// The offset to take first, if free.
    pub prefer: Option<u128>,
    /// Only `prefer` may be taken: with none, the pool has nothing for this node.
    pub only: bool,
}

/// What a mode adds to the claim of an address in one pool.
pub(crate) trait Policy<S>: Sync {
    /// Whether a missing pool is created, and bound to which node: `None`, it is not, and the claim finds the pool
    /// full (a borrower never creates another node's slice pool: a pool that is gone was deleted with its slice
    /// freed, and writing into it again would hide the entry from the slice's next owner).
    fn create(&self) -> Option<Option<&str>>;

    /// Whether a missing pool it creates may replace other pools of its config (the mode lays a network out anew
    /// when its config changes): such a pool is born with that pending, and settled before any claim
    /// ([`crate::claim::replaces`]).
    fn replaces_others(&self) -> bool {
        false
    }

    /// Read again, right before a missing pool is created, whether it still may be: `false`, the claim finds the
    /// pool full.
    fn may_create(&self, _store: &S, _budget: &Budget) -> impl Future<Output = Result<bool, IpamError>> + Send {
        async { Ok(true) }
    }

    /// Checks the pool as read: `Err` when it cannot be used as this mode wants.
    fn check(&self, pool: IpPool, _name: &str) -> Result<IpPool, IpamError> {
        Ok(pool)
    }

    /// What the pool's state steers the claim to, besides what is `excluded` already.
    fn steer(&self, _pool: &IpPool, _range: &IpRange, _excluded: &BTreeSet<u128>) -> Steer {
        Steer::default()
    }

    /// The error when the pool has nothing for this node to take (`Steer::only` with nothing preferred).
    fn nothing_here(&self, pool: &str, range: &IpRange) -> IpamError {
        IpamError::Exhausted { pool: pool.to_string(), range: range.cidr().to_string() }
    }

    /// What else of the pool as read (besides the free offset) the claim of `offset` must still find.
    fn guard_record(&self, _pool: &IpPool, _offset: u128) -> Option<SubInterfaceRecord> {
        None
    }

    /// An entry of the pool as read (offset and id) that the claim must still find: the pool was in use.
    fn guard_in_use(&self, _pool: &IpPool) -> Option<(u128, String)> {
        None
    }

    /// Once `offset` of `pool` (as read) is claimed, what the mode does before the address is handed out. A
    /// failure is rolled back by the caller with everything else the ADD wrote.
    fn claimed(
        &self,
        _store: &S,
        _pool: &IpPool,
        _range: &IpRange,
        _offset: u128,
        _budget: &Budget,
    ) -> impl Future<Output = Result<(), IpamError>> + Send {
        async { Ok(()) }
    }
}

/// The claim as Whereabouts has it: the pool is created when missing (unless told not to), naming the pools it
/// replaces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plain {
    /// Whether a missing pool is created.
    pub creates: bool,
}

impl<S: PoolStore> Policy<S> for Plain {
    fn create(&self) -> Option<Option<&str>> {
        self.creates.then_some(None)
    }

    /// A range's pool is named after the range: a config whose range grew, shrank or moved writes into a new pool
    /// while the old one still holds its pods' entries. The new pool names the old ones (settled once it is made),
    /// so that the leader moves their entries into it and, without reservations, its claims keep off what they hold.
    fn replaces_others(&self) -> bool {
        true
    }
}

/// One address claimed in one pool for one attachment.
pub(crate) struct Claim<'a, S, P> {
    store: &'a S,
    who: &'a Claimant<'a>,
    target: Target<'a>,
    policy: &'a P,
    budget: &'a Budget,
    /// The entry this sandbox writes.
    entry: IpAllocation,
}

/// What keeping an entry the attachment already holds came to.
enum Kept {
    Done(IpAddr),
    /// The address is held cluster-wide by another attachment: our entry is given back, pick another.
    NotOurs,
    /// The entry changed in between: read the pool again.
    Changed,
}

/// What claiming a free offset came to.
enum Claimed {
    Done(IpAddr),
    /// Another attachment holds the address cluster-wide: pick another.
    HeldElsewhere,
    /// Another pod took the offset in the pool first: the pool as read since.
    Lost(IpPool),
    /// Another sandbox of the same attachment got there: the pool as read since.
    MyAttachment(IpPool),
}

/// What adding our entry came to.
enum Added {
    Done(IpAddr),
    /// Another pod took the offset first: the pool as read since.
    Lost(IpPool),
    /// Another sandbox of the same attachment got there: the pool as read since (the next plan keeps it).
    MyAttachment(IpPool),
}

impl<'a, S, P> Claim<'a, S, P>
where
    S: PoolStore + ReservationStore,
    P: Policy<S>,
{
    /// The claim of an address of `target` for `who`, as `policy` has it, within `budget`.
    pub fn new(store: &'a S, who: &'a Claimant<'a>, target: Target<'a>, policy: &'a P, budget: &'a Budget) -> Self {
        let cfg = who.cfg;
        let entry = IpAllocation {
            id: who.me.container.to_string(),
            podref: who.me.podref.to_string(),
            ifname: who.me.ifname.to_string(),
            poduid: cfg.pod.uid.clone(),
            allocated: Some(crate::clock::now().to_string()),
            node: Some(who.node.to_string()).filter(|n| !n.is_empty()),
            network: Some(cfg.name.clone()).filter(|n| !n.is_empty()),
            reserved: who.kube.overlapping_ranges,
            statefulset: target.statefulset.clone(),
            ipamclaim: who.me.claim.map(str::to_string),
            recorded_for: Some(who.me.container.to_string()),
        };
        Self { store, who, target, policy, budget, entry }
    }

    /// The pool's name.
    fn pool(&self) -> &str {
        &self.target.pool
    }

    /// Claims an address; what it writes goes to `journal` first.
    pub async fn run(&self, journal: &mut Journal) -> Result<IpAddr, IpamError> {
        let mut excluded = self.target.given.clone();
        let mut preferred = self.target.preferred.and_then(|ip| self.target.range.offset_of(ip));
        let mut spread = false;
        let mut seed = crate::entropy::random(self.who.me.container.as_bytes());
        let mut pool = match &self.target.read {
            // a copy whose layout is pending is no plan's ground: read it settled
            Some(pool) if !crate::store::replaces_pending(pool) => self.policy.check(pool.clone(), self.pool())?,
            _ => self.read_pool().await?,
        };
        let mut hinted = self.target.hinted && self.target.read.is_some();
        // with reservations, an old pool's entries keep their reservations, which keep this claim off them already;
        // its addresses still cooling have none, and are read when this network keeps a cooldown
        let cools = self.who.kube.reuse_cooldown.is_some_and(|seconds| seconds > 0);
        if !self.who.kube.overlapping_ranges || cools {
            excluded.extend(self.held_by_overlaps(&pool).await?);
        }
        self.set_cooldown(&mut pool).await?;
        self.retime_ahead(&mut pool).await;
        loop {
            if self.budget.expired() {
                return Err(IpamError::Expired(format!("pool {}: no address claimed in time", self.pool())));
            }
            seed = crate::entropy::step(seed);
            // what concurrent claims of this process write, then the newest version of the pool it has seen (in
            // that order: a write answered in between shows in the one or the other)
            let flying = self.store.in_flight(self.pool());
            if let Some(seen) = self.store.cached_pool(self.pool())
                && crate::store::shared::newer(&seen.metadata, &pool.metadata)
                && !crate::store::replaces_pending(&seen)
            {
                pool = self.policy.check(seen, self.pool())?;
            }
            let steer = self.policy.steer(&pool, self.target.range, &excluded);
            excluded.extend(steer.avoid);
            // released too recently (the pool's reuse cooldown): not handed out unless asked for by address
            let mut cooling = cooldown::cooling(&pool, clock::now());
            cooling.retain(|offset, _| !pool.spec.allocations.contains_key(&offset.to_string()));
            let blocked: BTreeSet<u128> = excluded.iter().chain(cooling.keys()).chain(&flying).copied().collect();
            let ask = Ask {
                me: &self.who.me,
                range: self.target.range,
                requested: self.target.requested,
                excluded: &blocked,
                preferred: preferred.or(steer.prefer),
                strategy: self.who.kube.strategy,
                spread,
                seed,
            };
            let replaced = self.replaced_lately(&pool);
            match decide::plan(&pool, &ask) {
                Plan::Exhausted if hinted => {
                    // the cache's copy may miss a release: full is said only of the pool as read
                    hinted = false;
                    pool = self.read_pool().await?;
                }
                Plan::Exhausted if !cooling.is_empty() => {
                    let until = cooling.values().min().expect("not empty").to_string();
                    return Err(IpamError::CoolingDown { pool: self.pool().to_string(), count: cooling.len(), until });
                }
                Plan::Exhausted => {
                    return Err(IpamError::Exhausted {
                        pool: self.pool().to_string(),
                        range: self.target.range.cidr().to_string(),
                    });
                }
                Plan::RequestedUnusable { ip } => {
                    return Err(IpamError::RequestedUnusable { ip, range: self.target.range.cidr().to_string() });
                }
                Plan::RequestedTaken { ip, holder } => {
                    return Err(IpamError::RequestedTaken { ip, holder });
                }
                Plan::Keep { offset, entry } => match self.keep(offset, &entry).await? {
                    Kept::Done(ip) => return self.placed(&pool, offset, ip).await,
                    Kept::NotOurs => {
                        excluded.insert(offset);
                        pool = self.read_pool().await?;
                    }
                    Kept::Changed => {
                        preferred = Some(offset);
                        pool = self.read_pool().await?;
                    }
                },
                Plan::Claim(offset) if steer.only && Some(offset) != steer.prefer => {
                    return Err(self.policy.nothing_here(self.pool(), self.target.range));
                }
                Plan::Claim(_) if replaced.is_some() => {
                    let at = replaced.map(|at| at.to_string()).unwrap_or_default();
                    return Err(IpamError::Replaced { pool: self.pool().to_string(), at });
                }
                Plan::Claim(offset) => match self.claim(offset, self.as_read(&pool, offset), journal).await? {
                    Claimed::Done(ip) => return self.placed(&pool, offset, ip).await,
                    Claimed::HeldElsewhere => {
                        excluded.insert(offset);
                    }
                    Claimed::MyAttachment(fresh) => pool = fresh,
                    Claimed::Lost(fresh) => {
                        spread = true;
                        pool = fresh;
                    }
                },
            }
        }
    }

    /// When `pool` was marked replaced, if less than [`crate::store::REPLACED_WINDOW`] ago: an ADD of its config may
    /// be one begun before the network's range changed, which must not claim what the new pool's claims no longer
    /// see.
    fn replaced_lately(&self, pool: &IpPool) -> Option<k8s_openapi::jiff::Timestamp> {
        let at = crate::store::replaced_at(pool)?;
        let window = k8s_openapi::jiff::SignedDuration::try_from(crate::store::REPLACED_WINDOW).ok()?;
        (clock::now().duration_since(at) < window).then_some(at)
    }

    /// The offsets of this range that the pools `pool` replaces still hold ([`crate::store::OVERLAPS_ANNOTATION`]),
    /// or keep cooling (their reuse cooldown, as each pool records it, runs on across the re-layout), read now: not
    /// to be handed out, whoever holds them. A pool named there that is gone holds nothing.
    async fn held_by_overlaps(&self, pool: &IpPool) -> Result<BTreeSet<u128>, IpamError> {
        let mut held = BTreeSet::new();
        for name in crate::store::overlaps_of(pool).into_iter().chain(crate::store::keeps_off_of(pool)) {
            let what = || format!("pool {name} (replaced by {})", self.pool());
            let read = self
                .budget
                .retry(StoreError::is_transient, || self.store.get_pool(&name))
                .await
                .map_err(|e| IpamError::from_retry(&what(), e))?;
            // marked first, then read: an ADD of the old config whose claim lands after the mark fails its guard and
            // claims nothing new there; one whose claim landed before it shows in the read after it
            let read = match &read {
                Some(old) if crate::store::replaced_at(old).is_none() => {
                    let at = clock::now().to_string();
                    let annotated = old.metadata.annotations.is_some();
                    let mark = crate::store::guard::mark_replaced(annotated, &at);
                    let (_, after) = self
                        .budget
                        .retry(StoreError::is_transient, || self.store.apply_pool_patch(&name, "mark replaced", &mark))
                        .await
                        .map_err(|e| IpamError::from_retry(&what(), e))?;
                    match after {
                        // applied: the pool as stored after the mark
                        Some(marked) => {
                            tracing::info!(pool = %name, by = %self.pool(), "marked replaced");
                            Some(marked)
                        }
                        // another claim's mark was first (or the pool went): read it after that mark
                        None => self
                            .budget
                            .retry(StoreError::is_transient, || self.store.get_pool(&name))
                            .await
                            .map_err(|e| IpamError::from_retry(&what(), e))?,
                    }
                }
                _ => read,
            };
            let Some((range, _)) = read.as_ref().and_then(super::pool_scope) else { continue };
            let now = crate::clock::now();
            let cooling = read.iter().flat_map(|p| crate::cooldown::cooling_offsets(p, now));
            let entries = read.iter().flat_map(|p| p.spec.allocations.keys()).filter_map(|k| k.parse::<u128>().ok());
            for offset in entries.chain(cooling) {
                // an offset outside its CIDR (another tool wrote it) names no address
                if let Some(ours) = range.checked_addr_at(offset).and_then(|ip| self.target.range.offset_of(ip)) {
                    held.insert(ours);
                }
            }
        }
        Ok(held)
    }

    /// `ip` at `offset`, once the mode has done what it does with a claimed address.
    async fn placed(&self, pool: &IpPool, offset: u128, ip: IpAddr) -> Result<IpAddr, IpamError> {
        self.policy.claimed(self.store, pool, self.target.range, offset, self.budget).await?;
        self.kept_owner(offset).await?;
        Ok(ip)
    }

    /// An entry that outlives its pod (a sticky StatefulSet's, an IPAMClaim's) is read back once: a schema that
    /// drops what it records would have the address released as any other when the pod goes, the promise broken
    /// without a word.
    async fn kept_owner(&self, offset: u128) -> Result<(), IpamError> {
        if self.entry.statefulset.is_none() && self.entry.ipamclaim.is_none() {
            return Ok(());
        }
        let read = self.get_pool().await?;
        let Some(entry) = read.as_ref().and_then(|p| p.spec.allocations.get(&offset.to_string())) else {
            return Ok(());
        };
        let pruned = |field: &str, needed_by: &str| IpamError::SchemaPrunes {
            crd: IPPOOLS_CRD.into(),
            field: field.into(),
            needed_by: needed_by.into(),
        };
        if entry.id != self.entry.id {
            return Ok(());
        }
        if self.entry.statefulset.is_some() && entry.statefulset.is_none() {
            return Err(pruned(drift::STATEFULSET, "sticky_statefulset"));
        }
        if self.entry.ipamclaim.is_some() && entry.ipamclaim.is_none() {
            return Err(pruned(drift::IPAMCLAIM, "allowPersistentIPs"));
        }
        Ok(())
    }

    /// What the claim of `offset` decided on in `pool` as read, besides the offset being free: its release record
    /// (a pool that keeps a cooldown's books) and what the mode adds.
    fn as_read(&self, pool: &IpPool, offset: u128) -> AsRead {
        let released = cooldown::of_pool(pool)
            .and(pool.spec.released.as_ref())
            .map(|records| records.get(&offset.to_string()).cloned());
        AsRead {
            released,
            sub_interface: self.policy.guard_record(pool, offset),
            in_use: self.policy.guard_in_use(pool),
            replaced: Some(crate::store::MarkAsRead::of(pool)),
        }
    }

    /// Claims the free `offset`: cluster-wide first (the reservation, when the network reserves), then in the
    /// pool, guarded on what it `read`.
    async fn claim(&self, offset: u128, read: AsRead, journal: &mut Journal) -> Result<Claimed, IpamError> {
        let ip = self.target.range.addr_at(offset);
        let Some(_held) = Held::take(self.store, self.pool(), offset) else {
            if self.target.requested.is_some() {
                return Err(IpamError::RequestedTaken { ip, holder: "a concurrent ADD on this node".into() });
            }
            return Ok(Claimed::HeldElsewhere);
        };
        let reservation = self.who.kube.overlapping_ranges.then(|| self.reservation_name(ip));
        if let Some(name) = &reservation {
            journal.record(Written::Reservation {
                name: name.clone(),
                podref: self.who.me.podref.to_string(),
                container: self.who.me.container.to_string(),
            });
            if let Reserved::Other(holder) =
                reservation::claim(self.store, &self.reservation_names(ip), &self.who.me, self.who.node, self.budget)
                    .await?
            {
                journal.forget_reservation(name);
                if self.target.requested.is_some() {
                    return Err(IpamError::RequestedTaken { ip, holder });
                }
                tracing::debug!(%ip, %holder, "address held through an overlapping range");
                return Ok(Claimed::HeldElsewhere);
            }
        }
        match self.add(offset, reservation.clone(), &read, journal).await? {
            Added::Done(ip) => Ok(Claimed::Done(ip)),
            Added::MyAttachment(fresh) => Ok(Claimed::MyAttachment(fresh)),
            Added::Lost(fresh) => {
                // A writer that reserved nothing (overlap off, or Whereabouts) holds it in the pool.
                if let Some(name) = &reservation {
                    let me = &self.who.me;
                    reservation::release_if_ours(self.store, name, me.podref, me.container, self.budget).await?;
                    journal.forget_reservation(name);
                }
                if let Some(ip) = self.target.requested {
                    return Err(IpamError::RequestedTaken { ip, holder: "a concurrent ADD".into() });
                }
                Ok(Claimed::Lost(fresh))
            }
        }
    }

    fn reservation_name(&self, ip: IpAddr) -> String {
        names::reservation_name(&self.who.cfg.network_name, ip)
    }

    /// Every name the reservation of `ip` may have, ours first.
    fn reservation_names(&self, ip: IpAddr) -> Vec<String> {
        names::reservation_names(&self.who.cfg.network_name, ip)
    }

    /// The pool as it is now, created first when it is missing and the policy makes it.
    pub async fn read_pool(&self) -> Result<IpPool, IpamError> {
        let mut attempt = 0;
        loop {
            self.budget.pause(attempt).await.map_err(|_| IpamError::Expired(format!("pool {}: get", self.pool())))?;
            attempt += 1;
            if let Some(pool) = self.get_pool().await? {
                match crate::claim::replaces::settle(self.store, self.policy.check(pool, self.pool())?, self.budget)
                    .await?
                {
                    Some(pool) => return Ok(pool),
                    None => continue,
                }
            }
            let Some(node_name) = self.policy.create() else {
                tracing::debug!(pool = %self.pool(), "pool gone: nothing to borrow from it");
                return Err(IpamError::Exhausted {
                    pool: self.pool().to_string(),
                    range: self.target.range.cidr().to_string(),
                });
            };
            // concurrent claims of this process create it once; the read above forgot any older copy, so one
            // seen now was made (or read) since
            let turn = self.store.create_turn(self.pool()).await;
            if turn.is_some()
                && let Some(made) = self.store.cached_pool(self.pool())
            {
                match crate::claim::replaces::settle(self.store, self.policy.check(made, self.pool())?, self.budget)
                    .await?
                {
                    Some(pool) => return Ok(pool),
                    None => continue,
                }
            }
            if !self.policy.may_create(self.store, self.budget).await? {
                return Err(IpamError::Exhausted {
                    pool: self.pool().to_string(),
                    range: self.target.range.cidr().to_string(),
                });
            }
            let range = names::range_string(self.target.range.cidr());
            let usable = self.target.range.usable_count();
            let network = &self.who.cfg.network_name;
            let new = NewPool {
                network_name: network,
                node_name,
                config_name: &self.who.cfg.name,
                pending: self.policy.replaces_others(),
                ..NewPool::new(self.pool(), &range, usable)
            };
            let created = self
                .budget
                .retry(StoreError::is_transient, || self.store.create_pool(&new))
                .await
                .map_err(|e| IpamError::from_retry(&format!("pool {}: create", self.pool()), e))?;
            if let Created::Created(pool) = created
                && let Some(pool) = crate::claim::replaces::settle(self.store, pool, self.budget).await?
            {
                return Ok(pool);
            }
            // someone else just made it (or it went while it settled): read it
        }
    }

    /// Rewrites as now the release records of `pool` that lie ahead of this clock (a releaser's clock was fast), in
    /// the pool and in the copy as read, so that they cool for the cooldown from now rather than until the real time
    /// passes them. Best effort: a record another releaser rewrote meanwhile stays as that one wrote it.
    async fn retime_ahead(&self, pool: &mut IpPool) {
        let now = clock::now();
        for (offset, read) in cooldown::ahead(pool, now) {
            let stamp = now.to_string();
            match self.store.retime_release(self.pool(), offset, &read, &stamp).await {
                Ok(Patched::Applied) => {
                    tracing::warn!(pool = %self.pool(), offset, released = %read, %now,
                        "a release time ahead of this clock (a releaser's clock is fast): read as now");
                    if let Some(records) = pool.spec.released.as_mut() {
                        records.insert(offset.to_string(), stamp);
                    }
                }
                Ok(other) => tracing::debug!(pool = %self.pool(), offset, ?other, "release record changed meanwhile"),
                // refused (an admission policy older than this release's): the address cools until real time
                // passes the record, which an operator should hear of
                Err(e) if matches!(e.failure, crate::store::Failure::Refused(_)) => {
                    tracing::warn!(pool = %self.pool(), offset, error = %e, "release record ahead of the clock not rewritten")
                }
                Err(e) => tracing::debug!(pool = %self.pool(), offset, error = %e, "release record not rewritten"),
            }
        }
    }

    /// Sets the config's reuse cooldown on `pool` when the pool has another (a config without one leaves the
    /// pool's alone), and on the copy as read.
    async fn set_cooldown(&self, pool: &mut IpPool) -> Result<(), IpamError> {
        let current = cooldown::of_pool(pool).map_or(0, |d| d.as_secs());
        let seconds = self.who.kube.reuse_cooldown.unwrap_or(current);
        // a pool that cools without its books (`spec.released`) gets them first: a claim is guarded on the record
        // of its offset, and there is none to test without the map
        if current == seconds && (seconds == 0 || pool.spec.released.is_some()) {
            return Ok(());
        }
        let written = self
            .budget
            .retry(StoreError::is_transient, || self.store.set_pool_cooldown(self.pool(), seconds))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {}: set reuse cooldown", self.pool()), e))?;
        if seconds > 0 && written.as_ref().is_some_and(|p| p.spec.released.is_none()) {
            // the annotation stuck where the books did not: put it back as read, or every later ADD of the pool,
            // with a cooldown in its config or not, would be refused for it
            if let Err(e) = self.store.set_pool_cooldown(self.pool(), current).await {
                tracing::warn!(pool = %self.pool(), error = %e, seconds = current, "reuse cooldown not put back");
            }
            return Err(IpamError::SchemaPrunes {
                crd: IPPOOLS_CRD.into(),
                field: drift::RELEASED.into(),
                needed_by: "reuse_cooldown_seconds".into(),
            });
        }
        tracing::info!(pool = %self.pool(), seconds, written = written.is_some(), "reuse cooldown set on the pool");
        let annotations = pool.metadata.annotations.get_or_insert_with(Default::default);
        match seconds {
            0 => {
                annotations.remove(cooldown::COOLDOWN_ANNOTATION);
            }
            n => {
                annotations.insert(cooldown::COOLDOWN_ANNOTATION.to_string(), n.to_string());
                pool.spec.released.get_or_insert_with(Default::default);
            }
        }
        Ok(())
    }

    async fn get_pool(&self) -> Result<Option<IpPool>, IpamError> {
        self.budget
            .retry(StoreError::is_transient, || self.store.get_pool(self.pool()))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {}: get", self.pool()), e))
    }

    /// Keeps the entry the attachment already holds at `offset`: first the reservation (re-created when it is
    /// missing, taken over from an earlier sandbox), then the entry, for this sandbox.
    async fn keep(&self, offset: u128, held: &IpAllocation) -> Result<Kept, IpamError> {
        let ip = self.target.range.addr_at(offset);
        if self.who.kube.overlapping_ranges {
            let names = self.reservation_names(ip);
            if let Reserved::Other(holder) =
                reservation::claim(self.store, &names, &self.who.me, self.who.node, self.budget).await?
            {
                tracing::error!(pool = %self.pool(), %ip, %holder,
                    "this attachment's entry is held cluster-wide by another: giving the entry back");
                remove_entry(self.store, self.pool(), offset, held, None, self.budget).await?;
                return Ok(Kept::NotOurs);
            }
        }
        if self.who.me.is_mine(held) && held.reserved == self.entry.reserved {
            return Ok(Kept::Done(ip));
        }
        let outcome = self
            .budget
            .retry(StoreError::is_transient, || self.store.replace_allocation(self.pool(), offset, held, &self.entry))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {}: replace allocation {offset}", self.pool()), e))?;
        if outcome == Patched::Applied {
            tracing::info!(pool = %self.pool(), %ip, from = %held.id, "attachment already held this address; now this sandbox's");
            return Ok(Kept::Done(ip));
        }
        let pool = self.read_pool().await?;
        Ok(match decide::at_offset(&pool, offset, &self.who.me) {
            // a replace whose answer was lost
            AtOffset::Mine => Kept::Done(ip),
            _ => Kept::Changed,
        })
    }

    /// The guarded patch that claims `offset` in the pool, if it is still free and what the claim decided on is as
    /// it was `read`.
    async fn add(
        &self,
        offset: u128,
        reservation: Option<String>,
        read: &AsRead,
        journal: &mut Journal,
    ) -> Result<Added, IpamError> {
        let ip = self.target.range.addr_at(offset);
        let pool_name = self.pool();
        journal.record(Written::Allocation {
            pool: pool_name.to_string(),
            offset,
            entry: Box::new(self.entry.clone()),
            reservation,
        });
        let outcome = self
            .budget
            .retry(StoreError::is_transient, || self.store.add_allocation(pool_name, offset, &self.entry, read))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {pool_name}: add allocation {offset}"), e));
        let outcome = match outcome {
            Ok(outcome) => outcome,
            // refused, so never applied: nothing of it to undo (the roll-back then gives its reservation back)
            Err(IpamError::Store(e)) if e.failure == crate::store::Failure::TooLarge => {
                journal.forget_allocation(pool_name, offset);
                return Err(IpamError::PoolTooLarge { pool: pool_name.to_string(), message: e.message.clone() });
            }
            // refused (an admission policy, an authorizer not ready after a restart): this try was not applied,
            // but an earlier one whose answer was lost may have been; read back to tell
            Err(IpamError::Store(e)) if matches!(e.failure, crate::store::Failure::Refused(_)) => {
                let pool = self.read_pool().await?;
                if decide::at_offset(&pool, offset, &self.who.me) == AtOffset::Mine {
                    tracing::info!(pool = %pool_name, %ip, "assigned (an earlier attempt's answer was lost)");
                    return Ok(Added::Done(ip));
                }
                journal.forget_allocation(pool_name, offset);
                return Err(IpamError::Store(e));
            }
            Err(e) => return Err(e),
        };
        let refusal = match outcome {
            Patched::Applied => {
                tracing::info!(pool = %pool_name, %ip, "assigned");
                return Ok(Added::Done(ip));
            }
            Patched::Refused(message) => Some(message),
            Patched::Missing => None,
        };
        // Refused: our test failed (someone holds the offset — maybe us, if an earlier try's answer was lost), or
        // something else refused the patch. Missing: the pool went away. Read back to tell.
        let pool = self.read_pool().await?;
        match decide::at_offset(&pool, offset, &self.who.me) {
            AtOffset::Mine => {
                tracing::info!(pool = %pool_name, %ip, "assigned (an earlier attempt's answer was lost)");
                Ok(Added::Done(ip))
            }
            AtOffset::MyAttachment => {
                journal.forget_allocation(pool_name, offset);
                Ok(Added::MyAttachment(pool))
            }
            AtOffset::Other(holder) => {
                journal.forget_allocation(pool_name, offset);
                tracing::debug!(pool = %pool_name, offset, %holder, "offset taken concurrently; picking again");
                Ok(Added::Lost(pool))
            }
            // the provider marked or moved the sub-interface since we read the pool: pick again
            AtOffset::Free
                if read
                    .sub_interface
                    .as_ref()
                    .is_some_and(|s| !same_place(pool.spec.sub_interfaces.get(&offset.to_string()), s)) =>
            {
                journal.forget_allocation(pool_name, offset);
                tracing::info!(pool = %pool_name, offset, "sub-interface changed under the claim; picking again");
                Ok(Added::Lost(pool))
            }
            // released (again) since we read the pool: it cools now, pick again
            AtOffset::Free
                if read.released.as_ref().is_some_and(|r| {
                    pool.spec.released.as_ref().and_then(|m| m.get(&offset.to_string())) != r.as_ref()
                }) =>
            {
                journal.forget_allocation(pool_name, offset);
                tracing::info!(pool = %pool_name, offset, "address released under the claim; picking again");
                Ok(Added::Lost(pool))
            }
            // the entry that showed the pool in use is gone: pick again on the pool as it is now
            AtOffset::Free
                if read.in_use.as_ref().is_some_and(|(other, id)| {
                    pool.spec.allocations.get(&other.to_string()).is_none_or(|e| &e.id != id)
                }) =>
            {
                journal.forget_allocation(pool_name, offset);
                tracing::debug!(pool = %pool_name, offset, "the pool emptied under the claim; picking again");
                Ok(Added::Lost(pool))
            }
            AtOffset::Free => match refusal {
                // the 422 was not our test: a schema or an admission policy refuses the write
                Some(message) => {
                    Err(IpamError::Refused { what: format!("pool {pool_name}: add allocation {offset}"), message })
                }
                None => Ok(Added::Lost(pool)),
            },
        }
    }
}

/// An offset this claim is writing ([`PoolStore::hold`]), given up when dropped.
struct Held<'a, S: PoolStore> {
    store: &'a S,
    pool: &'a str,
    offset: u128,
}

impl<'a, S: PoolStore> Held<'a, S> {
    fn take(store: &'a S, pool: &'a str, offset: u128) -> Option<Self> {
        store.hold(pool, offset).then_some(Self { store, pool, offset })
    }
}

impl<S: PoolStore> Drop for Held<'_, S> {
    fn drop(&mut self) {
        self.store.unhold(self.pool, self.offset);
    }
}

/// Whether `now` is the sub-interface record `seen` was: same node, same VLAN.
fn same_place(now: Option<&SubInterfaceRecord>, seen: &SubInterfaceRecord) -> bool {
    now.is_some_and(|r| r.node == seen.node && r.vlan == seen.vlan)
}
