//! ADD: one address from every range, all or nothing, with no lock: the reservation is the cluster-wide claim,
//! the guarded patch the pool's (DESIGN §5). Every path that ends with an entry for the attachment ends with its
//! reservation too; a write without an answer is resolved by reading back.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::candidates::CandidateAdd;
use super::decide::{self, Ask, AtOffset, Me, Plan};
use super::journal::{Journal, Written, remove_entry};
use super::placed::{At, Placer};
use super::reservation::{self, Claimed as Reserved};
use super::sliced::SlicedAdd;
use super::{Assigned, IpamError, Request};
use crate::budget::Budget;
use crate::config::IpamConfig;
use crate::crd::{IpAllocation, IpPool, SubInterfaceRecord};
use crate::names;
use crate::provider::placement::Mode;
use crate::range::IpRange;
use crate::store::{Created, Patched, Store, StoreError};
use crate::{clock, cooldown};

/// Assigns one address from each range of `cfg` to the attachment `req`. An attachment (pod + interface) that
/// already holds an address in a pool gets it back. On any failure, what this call wrote is rolled back first.
pub async fn assign(
    store: &impl Store,
    cfg: &IpamConfig,
    req: &Request,
    budget: &Budget,
) -> Result<Vec<Assigned>, IpamError> {
    let podref = format!("{}/{}", cfg.pod.namespace, cfg.pod.name);
    let me = Me { podref: &podref, ifname: &req.ifname, container: &req.container_id };
    // a provider's CA and certificates are read before anything is written
    if let Some(placer) = Placer::new(cfg, &req.node)? {
        let add = CandidateAdd { store, cfg, req, budget, me: &me, placer: &placer };
        return add.run().await;
    }
    let mut journal = Journal::default();
    let mut assigned = Vec::with_capacity(cfg.ranges.len());
    for (index, range) in cfg.ranges.iter().enumerate() {
        // ranges of one config may overlap: an address an earlier range gave is not this one's to give again
        let given: Vec<IpAddr> = assigned.iter().map(|a: &Assigned| a.ip).collect();
        let requested = cfg.requested_for(index);
        let outcome = match cfg.node_slice_prefix() {
            Some(prefix) => {
                let add = SlicedAdd { store, cfg, req, me: &me, range, budget, prefix, requested, given: &given };
                add.run(&mut journal).await
            }
            None => {
                let mut add = RangeAdd::new(store, cfg, req, &me, range, budget);
                add.requested = requested;
                add.given = given.iter().filter_map(|ip| range.offset_of(*ip)).collect();
                add.run(&mut journal).await
            }
        };
        match outcome {
            Ok(ip) => assigned.push(Assigned {
                ip,
                prefix_len: range.cidr().prefix_len(),
                gateway: cfg.gateway.filter(|gw| range.cidr().contains(gw)),
            }),
            Err(err) => {
                for e in journal.roll_back(store, budget).await {
                    tracing::error!(error = %e, "roll-back of a failed ADD");
                }
                return Err(err);
            }
        }
    }
    Ok(assigned)
}

/// One range's share of an ADD, in one pool (the range's, or one slice's in slice mode).
pub(super) struct RangeAdd<'a, S> {
    store: &'a S,
    cfg: &'a IpamConfig,
    me: &'a Me<'a>,
    node: &'a str,
    range: &'a IpRange,
    budget: &'a Budget,
    pool: String,
    pub(super) requested: Option<IpAddr>,
    /// Offsets of addresses earlier ranges of this ADD gave.
    pub(super) given: BTreeSet<u128>,
    /// The pool as already read, if it was.
    pub(super) read: Option<IpPool>,
    /// Whether a missing pool is created. A borrower never creates another node's slice pool: a pool that is
    /// gone was deleted with its slice freed, and writing into it again would hide the entry from the slice's
    /// next owner.
    pub(super) create_missing: bool,
    /// The entry this sandbox writes.
    entry: IpAllocation,
    /// For a provider-backed range: prefers cached (or warm) sub-interfaces, and places the address claimed.
    pub(super) placer: Option<(&'a Placer<'a>, &'a Mode)>,
    /// In a provider config, the node the range's pool must be bound to (`None`: no node): a pool found in
    /// another shape is refused, since its mode is fixed for its life. `None` here: no check (other configs).
    pub(super) shape: Option<Option<&'a str>>,
    /// Whether `placer` places the address once claimed; `false` for the IPv4 half of a dual-stack pair, placed
    /// with its IPv6 partner once both are claimed.
    pub(super) place: bool,
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

impl<'a, S: Store> RangeAdd<'a, S> {
    pub(super) fn new(
        store: &'a S,
        cfg: &'a IpamConfig,
        req: &'a Request,
        me: &'a Me<'a>,
        range: &'a IpRange,
        budget: &'a Budget,
    ) -> Self {
        Self {
            store,
            cfg,
            me,
            node: &req.node,
            range,
            budget,
            pool: names::pool_name(&cfg.network_name, range.cidr()),
            requested: None,
            given: BTreeSet::new(),
            read: None,
            create_missing: true,
            entry: IpAllocation {
                id: req.container_id.clone(),
                podref: me.podref.to_string(),
                ifname: req.ifname.clone(),
                poduid: cfg.pod.uid.clone(),
                allocated: Some(crate::clock::now().to_string()),
                node: Some(req.node.clone()).filter(|n| !n.is_empty()),
                network: Some(cfg.name.clone()).filter(|n| !n.is_empty()),
                reserved: cfg.overlapping_ranges,
                statefulset: cfg.sticky_statefulset(range),
            },
            placer: None,
            shape: None,
            place: true,
        }
    }

    /// The same, in the pool named `pool` (a slice's).
    pub(super) fn in_pool(mut self, pool: String) -> Self {
        self.pool = pool;
        self
    }

    pub(super) async fn run(&self, journal: &mut Journal) -> Result<IpAddr, IpamError> {
        let mut excluded = self.given.clone();
        let mut preferred = None;
        let mut spread = false;
        let mut seed = crate::entropy::random(self.me.container.as_bytes());
        let mut pool = match &self.read {
            Some(pool) => self.in_shape(pool.clone())?,
            None => self.read_pool().await?,
        };
        self.set_cooldown(&mut pool).await?;
        loop {
            if self.budget.expired() {
                return Err(IpamError::Expired(format!("pool {}: no address claimed in time", self.pool)));
            }
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let placed_first = match self.placer {
                Some((placer, mode)) => {
                    let (unbinding, prefer) = placer.prefer(mode, &pool, self.range, &excluded);
                    excluded.extend(unbinding);
                    prefer
                }
                None => None,
            };
            // a node-warm pool hands out only what is warm on this node: no provider call, no other address
            let warm_only = matches!(self.placer, Some((_, Mode::NodeWarm { .. })));
            // released too recently (the pool's reuse cooldown): not handed out unless asked for by address
            let mut cooling = cooldown::cooling(&pool, clock::now());
            cooling.retain(|offset, _| !pool.spec.allocations.contains_key(&offset.to_string()));
            let blocked: BTreeSet<u128> = excluded.iter().chain(cooling.keys()).copied().collect();
            let ask = Ask {
                me: self.me,
                range: self.range,
                requested: self.requested,
                excluded: &blocked,
                preferred: preferred.or(placed_first),
                strategy: self.cfg.strategy,
                spread,
                seed,
            };
            match decide::plan(&pool, &ask) {
                Plan::Exhausted if !cooling.is_empty() => {
                    let until = cooling.values().min().expect("not empty").to_string();
                    return Err(IpamError::CoolingDown { pool: self.pool.clone(), count: cooling.len(), until });
                }
                Plan::Exhausted => {
                    return Err(IpamError::Exhausted { pool: self.pool.clone(), range: self.range.cidr().to_string() });
                }
                Plan::RequestedUnusable => {
                    let ip = self.requested.expect("only a requested address is unusable");
                    return Err(IpamError::RequestedUnusable { ip, range: self.range.cidr().to_string() });
                }
                Plan::RequestedTaken { holder } => {
                    let ip = self.requested.expect("only a requested address is taken");
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
                Plan::Claim(offset) if warm_only && Some(offset) != placed_first => {
                    return Err(IpamError::NoWarmAddress { pool: self.pool.clone(), node: self.node.to_string() });
                }
                Plan::Claim(offset) => match self.claim(offset, self.seen_record(&pool, offset), journal).await? {
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

    /// `ip` at `offset`, once a provider-backed range's sub-interface is on this node (a failure is rolled back by
    /// the caller with everything else this ADD wrote).
    async fn placed(&self, pool: &IpPool, offset: u128, ip: IpAddr) -> Result<IpAddr, IpamError> {
        if let Some((placer, mode)) = self.placer
            && self.place
        {
            let at = At { pool, range: self.range, offset, paired: None };
            placer.place(self.store, mode, &at, self.budget).await?;
        }
        Ok(ip)
    }

    /// Claims the free `offset`: cluster-wide first (the reservation, when the network reserves), then in the
    /// pool.
    async fn claim(
        &self,
        offset: u128,
        seen: Option<SubInterfaceRecord>,
        journal: &mut Journal,
    ) -> Result<Claimed, IpamError> {
        let ip = self.range.addr_at(offset);
        let reservation = self.cfg.overlapping_ranges.then(|| self.reservation_name(ip));
        if let Some(name) = &reservation {
            journal.record(Written::Reservation {
                name: name.clone(),
                podref: self.me.podref.to_string(),
                container: self.me.container.to_string(),
            });
            if let Reserved::Other(holder) =
                reservation::claim(self.store, name, self.me, self.node, self.budget).await?
            {
                journal.forget_reservation(name);
                if self.requested.is_some() {
                    return Err(IpamError::RequestedTaken { ip, holder });
                }
                tracing::debug!(%ip, %holder, "address held through an overlapping range");
                return Ok(Claimed::HeldElsewhere);
            }
        }
        match self.add(offset, reservation.clone(), seen.as_ref(), journal).await? {
            Added::Done(ip) => Ok(Claimed::Done(ip)),
            Added::MyAttachment(fresh) => Ok(Claimed::MyAttachment(fresh)),
            Added::Lost(fresh) => {
                // A writer that reserved nothing (overlap off, or Whereabouts) holds it in the pool.
                if let Some(name) = &reservation {
                    reservation::release_if_ours(self.store, name, self.me.podref, self.me.container, self.budget)
                        .await?;
                    journal.forget_reservation(name);
                }
                if let Some(ip) = self.requested {
                    return Err(IpamError::RequestedTaken { ip, holder: "a concurrent ADD".into() });
                }
                Ok(Claimed::Lost(fresh))
            }
        }
    }

    fn reservation_name(&self, ip: IpAddr) -> String {
        names::reservation_name(&self.cfg.network_name, ip)
    }

    pub(super) async fn read_pool(&self) -> Result<IpPool, IpamError> {
        let mut attempt = 0;
        loop {
            self.budget.pause(attempt).await.map_err(|_| IpamError::Expired(format!("pool {}: get", self.pool)))?;
            attempt += 1;
            if let Some(pool) = self.get_pool().await? {
                return self.in_shape(pool);
            }
            if !self.create_missing {
                tracing::debug!(pool = %self.pool, "pool gone: nothing to borrow from it");
                return Err(IpamError::Exhausted { pool: self.pool.clone(), range: self.range.cidr().to_string() });
            }
            let range = names::range_string(self.range.cidr());
            let usable = self.range.usable_count();
            let network = &self.cfg.network_name;
            let node_name = self.shape.flatten();
            let created = self
                .budget
                .retry(StoreError::is_transient, || {
                    self.store.create_pool(&self.pool, &range, network, usable, node_name)
                })
                .await
                .map_err(|e| IpamError::from_retry(&format!("pool {}: create", self.pool), e))?;
            if let Created::Created(pool) = created {
                return Ok(pool);
            }
            // someone else just made it: read it
        }
    }

    /// Sets the config's reuse cooldown on `pool` when the pool has another (a config without one leaves the
    /// pool's alone), and on the copy as read.
    async fn set_cooldown(&self, pool: &mut IpPool) -> Result<(), IpamError> {
        let Some(seconds) = self.cfg.reuse_cooldown else { return Ok(()) };
        let current = cooldown::of_pool(pool).map_or(0, |d| d.as_secs());
        if current == seconds {
            return Ok(());
        }
        let written = self
            .budget
            .retry(StoreError::is_transient, || self.store.set_pool_cooldown(&self.pool, seconds))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {}: set reuse cooldown", self.pool), e))?;
        tracing::info!(pool = %self.pool, seconds, ?written, "reuse cooldown set on the pool");
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

    /// `pool`, if it has the shape (node binding) the config gives its range.
    fn in_shape(&self, pool: IpPool) -> Result<IpPool, IpamError> {
        let Some(want) = self.shape else { return Ok(pool) };
        let found = pool.spec.node_name.as_deref();
        if found == want {
            return Ok(pool);
        }
        let say = |n: Option<&str>| n.map_or("a global pool (no node)".to_string(), |n| format!("node-warm on {n}"));
        Err(IpamError::PoolPlacement {
            pool: self.pool.clone(),
            message: format!(
                "the pool is {} but the config makes it {}: a pool's placement is fixed for its life",
                say(found),
                say(want)
            ),
        })
    }

    async fn get_pool(&self) -> Result<Option<IpPool>, IpamError> {
        self.budget
            .retry(StoreError::is_transient, || self.store.get_pool(&self.pool))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {}: get", self.pool), e))
    }

    /// Keeps the entry the attachment already holds at `offset`: first the reservation (re-created when it is
    /// missing, taken over from an earlier sandbox), then the entry, for this sandbox.
    async fn keep(&self, offset: u128, held: &IpAllocation) -> Result<Kept, IpamError> {
        let ip = self.range.addr_at(offset);
        if self.cfg.overlapping_ranges {
            let name = self.reservation_name(ip);
            if let Reserved::Other(holder) =
                reservation::claim(self.store, &name, self.me, self.node, self.budget).await?
            {
                tracing::error!(pool = %self.pool, %ip, %holder,
                    "this attachment's entry is held cluster-wide by another: giving the entry back");
                remove_entry(self.store, &self.pool, offset, held, None, self.budget).await?;
                return Ok(Kept::NotOurs);
            }
        }
        if self.me.is_mine(held) && held.reserved == self.entry.reserved {
            return Ok(Kept::Done(ip));
        }
        let outcome = self
            .budget
            .retry(StoreError::is_transient, || self.store.replace_allocation(&self.pool, offset, held, &self.entry))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {}: replace allocation {offset}", self.pool), e))?;
        if outcome == Patched::Applied {
            tracing::info!(pool = %self.pool, %ip, from = %held.id, "attachment already held this address; now this sandbox's");
            return Ok(Kept::Done(ip));
        }
        let pool = self.read_pool().await?;
        Ok(match decide::at_offset(&pool, offset, self.me) {
            // a replace whose answer was lost
            AtOffset::Mine => Kept::Done(ip),
            _ => Kept::Changed,
        })
    }

    /// For a provider-backed range, the sub-interface record at `offset` of `pool` as this ADD read it: the claim
    /// is guarded on it, so one the provider marked unbinding (or moved) since is not taken.
    fn seen_record(&self, pool: &IpPool, offset: u128) -> Option<SubInterfaceRecord> {
        self.placer.and_then(|_| pool.spec.sub_interfaces.get(&offset.to_string()).cloned())
    }

    /// The guarded patch that claims `offset` in the pool (and, when `seen` is given, that its sub-interface record
    /// is still as read).
    async fn add(
        &self,
        offset: u128,
        reservation: Option<String>,
        seen: Option<&SubInterfaceRecord>,
        journal: &mut Journal,
    ) -> Result<Added, IpamError> {
        let ip = self.range.addr_at(offset);
        journal.record(Written::Allocation { pool: self.pool.clone(), offset, entry: self.entry.clone(), reservation });
        let outcome = self
            .budget
            .retry(StoreError::is_transient, || async {
                match seen {
                    Some(seen) => self.store.add_allocation_on(&self.pool, offset, &self.entry, seen).await,
                    None => self.store.add_allocation(&self.pool, offset, &self.entry).await,
                }
            })
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {}: add allocation {offset}", self.pool), e));
        let outcome = match outcome {
            Ok(outcome) => outcome,
            // refused, so never applied: nothing of it to undo (the roll-back then gives its reservation back)
            Err(IpamError::Store(e)) if e.failure == crate::store::Failure::TooLarge => {
                journal.forget_allocation(&self.pool, offset);
                return Err(IpamError::PoolTooLarge { pool: self.pool.clone(), message: e.message.clone() });
            }
            Err(IpamError::Store(e)) if matches!(e.failure, crate::store::Failure::Refused(_)) => {
                journal.forget_allocation(&self.pool, offset);
                return Err(IpamError::Store(e));
            }
            Err(e) => return Err(e),
        };
        let refusal = match outcome {
            Patched::Applied => {
                tracing::info!(pool = %self.pool, %ip, "assigned");
                return Ok(Added::Done(ip));
            }
            Patched::Refused(message) => Some(message),
            Patched::Missing => None,
        };
        // Refused: our test failed (someone holds the offset — maybe us, if an earlier try's answer was lost), or
        // something else refused the patch. Missing: the pool went away. Read back to tell.
        let pool = self.read_pool().await?;
        match decide::at_offset(&pool, offset, self.me) {
            AtOffset::Mine => {
                tracing::info!(pool = %self.pool, %ip, "assigned (an earlier attempt's answer was lost)");
                Ok(Added::Done(ip))
            }
            AtOffset::MyAttachment => {
                journal.forget_allocation(&self.pool, offset);
                Ok(Added::MyAttachment(pool))
            }
            AtOffset::Other(holder) => {
                journal.forget_allocation(&self.pool, offset);
                tracing::debug!(pool = %self.pool, offset, %holder, "offset taken concurrently; picking again");
                Ok(Added::Lost(pool))
            }
            // the provider marked or moved the sub-interface since we read the pool: pick again
            AtOffset::Free
                if seen.is_some_and(|s| !same_place(pool.spec.sub_interfaces.get(&offset.to_string()), s)) =>
            {
                journal.forget_allocation(&self.pool, offset);
                tracing::info!(pool = %self.pool, offset, "sub-interface changed under the claim; picking again");
                Ok(Added::Lost(pool))
            }
            AtOffset::Free => match refusal {
                // the 422 was not our test: a schema or an admission policy refuses the write
                Some(message) => {
                    Err(IpamError::Refused { what: format!("pool {}: add allocation {offset}", self.pool), message })
                }
                None => Ok(Added::Lost(pool)),
            },
        }
    }
}

/// Whether `now` is the sub-interface record `seen` was: same node, same VLAN.
fn same_place(now: Option<&SubInterfaceRecord>, seen: &SubInterfaceRecord) -> bool {
    now.is_some_and(|r| r.node == seen.node && r.vlan == seen.vlan)
}
