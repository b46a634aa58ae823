//! ADD in slice mode: the range is cut into slices listed in a NodeSlicePool; a node allocates in its own slices'
//! pools (one object per node and slice, so nodes never contend), claims a free slice with a guarded patch when its
//! own are full, and borrows from another node's slice when none is free. Within a slice, the claim of every mode
//! runs unchanged ([`Claim`]), reservations included.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use super::growth::{Cut, Growth};
use super::plan::{self as slices, Next, Slice};
use crate::budget::Budget;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::claim::{Claim, Claimant, Journal, Policy, Target};
use crate::clock;
use crate::crd::{IpPool, NodeSlicePool, NodeSlicePoolSpec};
use crate::error::IpamError;
use crate::names;
use crate::range::IpRange;
use crate::slices::SliceSize;
use crate::store::{Created, Patched, PoolStore, ReservationStore, SliceStore, StoreError};

/// How many times an ADD that found every slice claimed waits for owners' pools that do not exist yet (backing
/// off from 40 ms to 1.3 s, at most 2.5 s in all) before the range counts as full: a slice whose owner died between
/// its claim and its pool is freed by the leader after its grace, not by waiting here.
const UNBORN_WAITS: u32 = 6;

/// One range's share of an ADD in slice mode.
pub(super) struct SlicedAdd<'a, S> {
    pub store: &'a S,
    pub who: &'a Claimant<'a>,
    pub range: &'a IpRange,
    pub budget: &'a Budget,
    /// `node_slice_size`.
    pub size: &'a SliceSize,
    pub requested: Option<IpAddr>,
    /// Addresses earlier ranges of this ADD gave.
    pub given: &'a [IpAddr],
    /// The attachment's first ADD on this node: it has borrowed nothing yet.
    pub first_add: bool,
    /// `max_slices_per_node`.
    pub max_slices: Option<u64>,
    /// The sizes a claim cuts a free slice to: `node_slice_size`, and `min_node_slice_size` (adaptive slices).
    pub growth: Growth,
    /// Set to `max_slices_per_node` when the cap made this claim borrow though slices were free.
    pub capped: &'a std::sync::atomic::AtomicU64,
}

impl<S: PoolStore + ReservationStore + SliceStore> SlicedAdd<'_, S> {
    fn node(&self) -> &str {
        self.who.node
    }

    fn network_name(&self) -> &str {
        &self.who.cfg.network_name
    }

    /// `max_slices_per_node`, when it is what keeps this node from a free slice: it holds that many.
    fn capped(&self, slices: &[Slice]) -> Option<u64> {
        let held = slices.iter().filter(|s| s.node == self.node()).count() as u64;
        self.max_slices.filter(|max| held >= *max && slices.iter().any(|s| s.node.is_empty()))
    }

    /// [`slices::next`] for this node: once its own slices are full it claims another (up to
    /// `max_slices_per_node`), else borrows, if the network has reservations to find a borrowed entry by.
    fn next_slice(
        &self,
        slices: &[Slice],
        full: &BTreeSet<IpNet>,
        unclaimable: &BTreeSet<IpNet>,
        preferred: Option<IpNet>,
        seed: u64,
    ) -> Next {
        let max_own = self.max_slices.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let lending = slices::Lending { may_borrow: self.who.kube.overlapping_ranges, max_own, growth: self.growth };
        // a free slice holding no address the range may hand out (range_start, range_end, exclude) is never
        // claimed: the node would find it full and claim the next, hoarding slices until its budget ran out
        let mut passed = unclaimable.clone();
        passed
            .extend(slices.iter().filter(|s| s.node.is_empty() && self.range.slice(s.cidr).is_none()).map(|s| s.cidr));
        slices::next(slices, self.node(), full, &passed, preferred, lending, seed)
    }

    pub(super) async fn run(&self, journal: &mut Journal) -> Result<IpAddr, IpamError> {
        let name = names::node_slice_pool_name(self.network_name(), &self.who.cfg.name);
        // A first ADD may plan on what this process saw last (the node agent's copies): since the node booted no
        // invocation of this pod's interface has run here (its mark says so), so no entry of it was written after
        // any copy was read; a copy only goes stale on what others do, which the guards and a fresh read before
        // "full" take care of. Every other ADD reads: it must find what an earlier try or sandbox wrote.
        let seen = if self.first_add { self.store.cached_node_slices(&name) } else { None };
        let (mut slices, mut hinted) = match seen.map(|seen| self.check(&seen)) {
            Some(Ok(slices)) => (slices, true),
            _ => (self.read_slices(&name).await?, false),
        };
        let (found_in, mut read) = self.find_mine(&slices).await?;
        let preferred = found_in.as_ref().map(|s| s.cidr);
        let mut full: BTreeSet<IpNet> = BTreeSet::new();
        let mut unclaimable: BTreeSet<IpNet> = BTreeSet::new();
        let mut seed = crate::entropy::random(self.who.me.container.as_bytes());
        let mut claims = 0;
        let mut cooling = None;
        // slices borrowed from whose pool did not exist yet: their owner claimed them and is about to create it
        let mut unborn: BTreeSet<IpNet> = BTreeSet::new();
        let mut waits = 0;
        loop {
            if self.budget.expired() {
                return Err(IpamError::Expired(format!("node slices {name}: no address claimed in time")));
            }
            seed = crate::entropy::step(seed);
            if let Some(found) = &found_in {
                pin(&mut slices, self.node(), found);
            }
            let next = match self.requested {
                Some(ip) => self.requested_next(&slices, ip)?,
                None => self.next_slice(&slices, &full, &unclaimable, preferred, seed >> 16),
            };
            match next {
                Next::Own(slice) | Next::Borrow(slice) => {
                    let Some(sub) = self.range.slice(slice.cidr) else {
                        full.insert(slice.cidr);
                        continue;
                    };
                    let pool = slice.pool_name(self.network_name());
                    if slice.node != self.node() {
                        match self.capped(&slices) {
                            Some(max) => {
                                self.capped.store(max, std::sync::atomic::Ordering::Relaxed);
                                tracing::warn!(
                                    slice = %slice.cidr, owner = %slice.node, max_slices_per_node = max,
                                    "the node holds max_slices_per_node slices, all full: borrowing, though slices are free"
                                )
                            }
                            None => {
                                tracing::info!(slice = %slice.cidr, owner = %slice.node, "no slice free: borrowing")
                            }
                        }
                    }
                    let mut target = Target::new(pool.clone(), &sub);
                    target.requested = self.requested;
                    target.given = self.given.iter().filter_map(|ip| sub.offset_of(*ip)).collect();
                    target.read = read.take().filter(|p| p.metadata.name.as_deref() == Some(pool.as_str()));
                    if target.read.is_none()
                        && self.first_add
                        && slice.node == self.node()
                        && let Some(seen) = self.store.cached_pool(&pool)
                    {
                        // the attachment holds nothing in the node's pools (searched above): a pool of ours this
                        // process has seen is a hint, its plan guarded, "full" read again
                        target.read = Some(seen);
                        target.hinted = true;
                    }
                    let policy = InSlice::new(self, &name, &slice);
                    match Claim::new(self.store, self.who, target, &policy, self.budget).run(journal).await {
                        Ok(ip) => return Ok(ip),
                        Err(e @ (IpamError::Exhausted { .. } | IpamError::CoolingDown { .. }))
                            if self.requested.is_none() =>
                        {
                            // a slice whose free addresses are all cooling is passed over like a full one; if
                            // nothing else gives one, the ADD says so
                            if matches!(e, IpamError::CoolingDown { .. }) {
                                cooling = Some(e);
                            }
                            full.insert(slice.cidr);
                            if policy.missing.load(Ordering::Relaxed) {
                                unborn.insert(slice.cidr);
                            }
                            // A slice pool that vanished under a claim (or an entry given back because its slice
                            // moved) leaves that claim's writes in the journal; slice mode has one range, so all the
                            // journal holds is such leftovers. One that cannot be given back fails the ADD: taking
                            // another address would leave the attachment two entries, and the next ADD would find
                            // the other one. The runtime's DEL of the sandbox removes what is left.
                            let errors = std::mem::take(journal).roll_back(self.store, self.budget).await;
                            if let Some(first) = errors.into_iter().next() {
                                tracing::warn!(error = %first, "what a vanished slice pool left could not be given back");
                                return Err(first);
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
                Next::Full if hinted => {
                    // "full" is decided on the slices as read (a claim is too: its turn below reads them)
                    hinted = false;
                    slices = self.read_slices(&name).await?;
                }
                Next::Claim(cut) => {
                    self.budget
                        .pause(claims)
                        .await
                        .map_err(|_| IpamError::Expired(format!("node slices {name}: claim a slice")))?;
                    claims += 1;
                    // concurrent ADDs of this process that find the node's slices full claim one between them:
                    // whoever waited reads again, and takes the slice claimed meanwhile
                    let turn = self.store.slice_turn(&name).await;
                    if turn.is_some() {
                        hinted = false;
                        let mine = |s: &[Slice]| s.iter().filter(|s| s.node == self.node()).count();
                        // the claim before ours read the slices back: a slice of ours it shows is taken as a hint
                        let seen = self.store.cached_node_slices(&name).and_then(|c| self.check(&c).ok());
                        if let Some(seen) = seen.filter(|seen| mine(seen) > mine(&slices)) {
                            slices = seen;
                            hinted = true;
                            continue;
                        }
                        let now = self.read_slices(&name).await?;
                        if mine(&now) > mine(&slices) {
                            slices = now;
                            continue;
                        }
                        slices = now;
                        let again = self.next_slice(&slices, &full, &unclaimable, preferred, 0);
                        if !matches!(again, Next::Claim(_)) {
                            continue;
                        }
                    }
                    slices = self.claim_unless_held(&name, &cut, &mut unclaimable).await?;
                }
                Next::Full if !unborn.is_empty() && waits < UNBORN_WAITS => {
                    // every slice is claimed and some owners have not made their pool yet (under load, a claim
                    // and the pool's creation are seconds apart): the range is not full, wait for them
                    waits += 1;
                    self.budget
                        .pause(waits)
                        .await
                        .map_err(|_| IpamError::Expired(format!("node slices {name}: wait for a slice's pool")))?;
                    tracing::debug!(node_slices = name, slices = ?unborn, "borrowing again once their pools exist");
                    full.retain(|cidr| !unborn.contains(cidr));
                    unborn.clear();
                    slices = self.read_slices(&name).await?;
                }
                Next::Full => {
                    let exhausted = match self.capped(&slices) {
                        Some(max) => IpamError::SliceCap { pool: name, node: self.node().to_string(), max },
                        None => IpamError::Exhausted { pool: name, range: self.range.cidr().to_string() },
                    };
                    return Err(cooling.unwrap_or(exhausted));
                }
            }
        }
    }

    /// Claims ahead of any ADD (the node agent, when a network appears): makes sure this node holds a slice of the
    /// range and that its pool exists, so that the node's first ADDs write an entry and nothing else. Claims only
    /// while at least half of the range is in free slices ([`slices::claimable_ahead`]): past that, slices go to
    /// the nodes that ask. Returns the node's slice, `None` when it holds none and claims none ahead. Writes no
    /// entry and no reservation; a claim is the ADD's own guarded patch, read back whatever its answer.
    pub(super) async fn hold(&self) -> Result<Option<IpNet>, IpamError> {
        let name = names::node_slice_pool_name(self.network_name(), &self.who.cfg.name);
        let mut slices = self.read_slices(&name).await?;
        let mut unclaimable: BTreeSet<IpNet> = BTreeSet::new();
        let mut claims = 0;
        loop {
            if self.budget.expired() {
                return Err(IpamError::Expired(format!("node slices {name}: no slice claimed ahead in time")));
            }
            if let Some(own) = slices.iter().find(|s| s.node == self.node()).cloned() {
                let Some(sub) = self.range.slice(own.cidr) else { return Ok(None) };
                let target = Target::new(own.pool_name(self.network_name()), &sub);
                let policy = InSlice::new(self, &name, &own);
                return match Claim::new(self.store, self.who, target, &policy, self.budget).read_pool().await {
                    Ok(_) => Ok(Some(own.cidr)),
                    // the slice changed hands, or another node's pool of it holds entries: an ADD sorts it out
                    Err(IpamError::Exhausted { .. }) => Ok(None),
                    Err(e) => Err(e),
                };
            }
            // every node's agent sees a new network at once: each starts from its own pick among the free slices
            // the rule leaves to claims ahead (not all from the same one, and never more than the rule allows)
            let claimable = slices::claimable_ahead(&slices, self.range.cidr(), self.growth.wanted(0));
            if claimable.is_empty() {
                return Ok(None);
            }
            let mut passed = unclaimable.clone();
            passed.extend(slices.iter().filter(|s| s.node.is_empty() && !claimable.contains(&s.cidr)).map(|s| s.cidr));
            let pick = crate::entropy::random(self.node().as_bytes());
            let next = self.next_slice(&slices, &BTreeSet::new(), &passed, None, pick);
            let Next::Claim(cut) = next else { return Ok(None) };
            self.budget
                .pause(claims)
                .await
                .map_err(|_| IpamError::Expired(format!("node slices {name}: claim a slice ahead")))?;
            claims += 1;
            // the node's ADDs that find its slices full meanwhile wait for this claim, and take its slice
            let turn = self.store.slice_turn(&name).await;
            if turn.is_some() {
                let now = self.read_slices(&name).await?;
                if now.iter().any(|s| s.node == self.node()) {
                    slices = now;
                    continue;
                }
            }
            slices = self.claim_unless_held(&name, &cut, &mut unclaimable).await?;
        }
    }

    /// Where a requested address is allocated: in the slice that holds it, claimed first when it is free.
    fn requested_next(&self, slices: &[Slice], ip: IpAddr) -> Result<Next, IpamError> {
        let unusable = || IpamError::RequestedUnusable { ip, range: self.range.cidr().to_string() };
        let slice = slices::slice_of(slices, ip).ok_or_else(unusable)?;
        let held = slices.iter().filter(|s| s.node == self.node()).count();
        Ok(match slice.node.as_str() {
            "" => Next::Claim(self.growth.cut_at(slice, held, ip)),
            node if node == self.node() => Next::Own(slice.clone()),
            _ => Next::Borrow(slice.clone()),
        })
    }

    /// The slice whose pool holds this attachment's entry (a retried ADD, a new sandbox of the pod), with the node
    /// whose pool it is, and that pool; else the pool of the node's first slice, read on the way. The node's own
    /// slices are read (a first ADD takes the agent's copies); an entry elsewhere is looked for only by an ADD
    /// that is not the attachment's first on the node ([`Self::find_borrowed`]).
    async fn find_mine(&self, slices: &[Slice]) -> Result<(Option<Slice>, Option<IpPool>), IpamError> {
        let me = &self.who.me;
        let mut first = None;
        // another sandbox's entry of the attachment is taken over only when this sandbox has none: a repeated ADD
        // gets what it got, even when an earlier sandbox's entry showed up since (a warm take handed over late)
        let mut theirs: Option<(Slice, IpPool)> = None;
        for slice in slices.iter().filter(|s| s.node == self.node()) {
            let name = slice.pool_name(self.network_name());
            // an entry from before the node booted shows in any copy; the plan takes the copy (see `run`)
            let copy = self.store.cached_pool(&name).filter(|_| self.first_add);
            let from_copy = copy.is_some();
            let pool = match copy {
                Some(seen) => seen,
                None => match self.get(&name, || self.store.get_pool(&name)).await? {
                    Some(pool) => pool,
                    None => continue,
                },
            };
            if pool.spec.allocations.values().any(|a| me.is_mine(a)) {
                return Ok((Some(slice.clone()), Some(pool)));
            }
            if pool.spec.allocations.values().any(|a| me.is_attachment(a)) {
                theirs.get_or_insert((slice.clone(), pool));
                continue;
            }
            if !from_copy {
                first.get_or_insert(pool);
            }
        }
        if !self.first_add
            && let Some((slice, pool, mine)) = self.find_borrowed(slices).await?
            && (mine || theirs.is_none())
        {
            return Ok((Some(slice), Some(pool)));
        }
        match theirs {
            Some((slice, pool)) => Ok((Some(slice), Some(pool))),
            None => Ok((None, first)),
        }
    }

    /// The slice, with the node whose pool of it holds an entry of this attachment outside the slices listed as
    /// its node's, and that pool, if any, and whether the entry is this sandbox's: an entry borrowed from another
    /// node's slice (with reservations, when no slice was free), or one in the node's own pool of a slice a
    /// NodeSlicePool, lost and rebuilt by another node, lists as free — whatever the slices' state since (a node
    /// left, the leader gave a slice back). The pools are the only record that cannot be lost with the entry (a
    /// reservation can be: Whereabouts' DEL deletes one by name), so they are listed, once, and looked through;
    /// this sandbox's own entry first.
    async fn find_borrowed(&self, slices: &[Slice]) -> Result<Option<(Slice, IpPool, bool)>, IpamError> {
        let pools = self.list_pools().await?;
        let me = &self.who.me;
        let mut found = None;
        let holding = pools.iter().filter(|p| {
            slices::of_network(p, self.network_name()) && p.spec.allocations.values().any(|a| me.is_attachment(a))
        });
        for pool in holding {
            let Some(name) = pool.metadata.name.as_deref() else { continue };
            let Ok(range) = pool.spec.range.parse::<IpNet>() else { continue };
            let Some(slice) = slices.iter().find(|s| s.cidr == range.trunc() && s.node != self.node()) else {
                continue;
            };
            let Some(node) = names::node_of_slice_pool(name, self.network_name(), slice.cidr) else { continue };
            // without reservations nothing is borrowed: only the node's own pools count
            if node == self.node() || self.who.kube.overlapping_ranges {
                let mine = pool.spec.allocations.values().any(|a| me.is_mine(a));
                let hit = (Slice { node: node.to_string(), ..slice.clone() }, pool.clone(), mine);
                if mine {
                    return Ok(Some(hit));
                }
                found.get_or_insert(hit);
            }
        }
        Ok(found)
    }

    /// The NodeSlicePool `name`'s slices; the pool is created, every slice free, when it does not exist.
    async fn read_slices(&self, name: &str) -> Result<Vec<Slice>, IpamError> {
        let mut attempt = 0;
        loop {
            self.budget.pause(attempt).await.map_err(|_| IpamError::Expired(format!("node slices {name}: get")))?;
            attempt += 1;
            if let Some(pool) = self.get(name, || self.store.get_node_slices(name)).await? {
                return self.check(&pool);
            }
            let cidr = self.range.cidr();
            // as the config spells it: Whereabouts' controller compares the strings, and re-slices on a difference
            let spec =
                NodeSlicePoolSpec { range: names::range_string(cidr), slice_size: self.size.as_str().to_string() };
            // a NodeSlicePool may be lost while its slice pools hold entries: this node's stay its own
            let pools = self.list_pools().await?;
            let slices =
                slices::rebuilt(cidr, self.size.prefix(), self.network_name(), self.node(), &pools, clock::now())
                    .map_err(|e| IpamError::SliceMismatch { name: name.to_string(), message: e.to_string() })?;
            let created = self
                .budget
                .retry(StoreError::is_transient, || self.store.create_node_slices(name, &spec, &slices))
                .await
                .map_err(|e| IpamError::from_retry(&format!("node slices {name}: create"), e))?;
            if let Created::Created(pool) = created {
                let owned = slices.iter().filter(|s| !s.node_name.is_empty()).count();
                tracing::info!(node_slices = name, range = %cidr, slice = %self.size, owned, "node slices created");
                return self.check(&pool);
            }
            // another node just made it: read it
        }
    }

    /// The slices of `pool`, if it slices this range. Its slices may be of another size than the config's
    /// `node_slice_size` (the NAD changed it, or adaptive slices cut them): they are taken as listed, and a free one
    /// larger than this config's next slice is cut to size, so a slice size changes in place for new claims.
    fn check(&self, pool: &NodeSlicePool) -> Result<Vec<Slice>, IpamError> {
        let name = pool.metadata.name.clone().unwrap_or_default();
        let range: Option<IpNet> = pool.spec.range.parse().ok();
        if range.map(|r| r.trunc()) != Some(self.range.cidr()) {
            return Err(IpamError::SliceMismatch {
                name,
                message: format!("it slices {}, this config {}", pool.spec.range, self.range.cidr()),
            });
        }
        let slices = slices::slices_of(pool);
        if slices.is_empty() {
            return Err(IpamError::SliceMismatch { name, message: "it lists no slices".into() });
        }
        Ok(slices)
    }

    /// Gives the free slice of `cut` (or the part of it `cut` names, the rest listed free) to this node. Whatever
    /// the answer, the caller reads the slices again: a refused claim lost to another node, a claim whose answer was
    /// lost shows as ours.
    async fn claim(&self, name: &str, cut: &Cut) -> Result<(), IpamError> {
        let node = self.node();
        let (slice, stored) = (&cut.free, cut.free.stored());
        let kept = names::range_string(cut.cidr);
        let rest: Vec<String> = cut.rest().into_iter().map(names::range_string).collect();
        let outcome = self
            .budget
            .retry(StoreError::is_transient, || async {
                if cut.splits() {
                    self.store.split_slice(name, slice.index, &stored, node, &kept, &rest).await
                } else {
                    self.store.move_slice(name, slice.index, &stored, node).await
                }
            })
            .await
            .map_err(|e| IpamError::from_retry(&format!("node slices {name}: claim {}", cut.cidr), e))?;
        match outcome {
            Patched::Applied => {
                tracing::info!(node_slices = name, slice = %cut.cidr, from = %slice.cidr, "slice claimed")
            }
            Patched::Refused(message) => {
                tracing::debug!(node_slices = name, slice = %cut.cidr, %message, "slice claimed by another node first")
            }
            Patched::Missing => tracing::warn!(node_slices = name, "node slices deleted while claiming"),
        }
        Ok(())
    }

    /// Claims `cut` for this node unless another node's pool of it holds entries (then it is `unclaimable` for this
    /// ADD: most often another node claimed it since the slices were read); the slices as read afterwards.
    async fn claim_unless_held(
        &self,
        name: &str,
        cut: &Cut,
        unclaimable: &mut BTreeSet<IpNet>,
    ) -> Result<Vec<Slice>, IpamError> {
        match self.held_elsewhere(cut.cidr).await? {
            Some(holder) => {
                tracing::info!(node_slices = name, slice = %cut.cidr, node = %holder.node, pool = %holder.pool,
                    "a slice listed free whose pool of another node holds entries: not claimed");
                unclaimable.insert(cut.free.cidr);
            }
            None => self.claim(name, cut).await?,
        }
        self.read_slices(name).await
    }

    /// Another node's slice pool of `cidr` that holds entries (or addresses cooling), if any: a slice in use,
    /// whatever the NodeSlicePool says (lost and rebuilt, or freed by Whereabouts' controller under its pods).
    async fn held_elsewhere(&self, cidr: IpNet) -> Result<Option<slices::Holder>, IpamError> {
        let pools = self.list_pools().await?;
        let holders = slices::holders(&pools, self.network_name(), cidr, clock::now());
        Ok(holders.into_iter().find(|h| h.node != self.node()))
    }

    async fn list_pools(&self) -> Result<Vec<IpPool>, IpamError> {
        self.budget
            .retry(StoreError::is_transient, || self.store.list_pools())
            .await
            .map_err(|e| IpamError::from_retry("pools: list", e))
    }

    /// The slice at `slice`'s place as the NodeSlicePool `name` lists it now.
    async fn slice_now(&self, name: &str, slice: &Slice) -> Result<Option<Slice>, IpamError> {
        let listing = self.get(name, || self.store.get_node_slices(name)).await?;
        Ok(listing.and_then(|l| slices::slices_of(&l).into_iter().find(|s| s.cidr == slice.cidr)))
    }

    async fn get<T, F>(&self, name: &str, op: impl Fn() -> F) -> Result<Option<T>, IpamError>
    where
        F: Future<Output = Result<Option<T>, StoreError>>,
    {
        self.budget
            .retry(StoreError::is_transient, op)
            .await
            .map_err(|e| IpamError::from_retry(&format!("{name}: get"), e))
    }
}

/// Where the attachment's entry was found, laid over the slices as listed: a slice listed free whose pool of
/// another node holds it is that node's to this ADD (it borrows there, keeping its address). One listed free whose
/// pool of this node holds it stays listed free: the ADD claims it back (`slices::next` takes it first).
fn pin(slices: &mut [Slice], node: &str, found: &Slice) {
    if found.node == node {
        return;
    }
    if let Some(listed) = slices.iter_mut().find(|s| s.cidr == found.cidr && s.node.is_empty()) {
        listed.node = found.node.clone();
    }
}

/// The claim in one slice's pool. A borrower never creates another node's slice pool (one that is gone was
/// deleted with its slice freed). The owner creates its missing pool only after reading again that the slice is
/// still its own and that no other node's pool of it holds entries, and, having written its entry into the pool it
/// created, reads once more that the slice is still its own: the leader deletes a gone node's empty pool before it
/// moves the slice, so an ADD of that node that re-creates the pool in between either sees the move and gives its
/// entry back, or wrote it before the move, where the slice's next owner finds it.
struct InSlice<'a, 'b, S> {
    add: &'a SlicedAdd<'b, S>,
    node_slices: &'a str,
    slice: &'a Slice,
    created: AtomicBool,
    /// The slice's pool did not exist when a borrower read it.
    missing: AtomicBool,
}

impl<'a, 'b, S: PoolStore + ReservationStore + SliceStore> InSlice<'a, 'b, S> {
    fn new(add: &'a SlicedAdd<'b, S>, node_slices: &'a str, slice: &'a Slice) -> Self {
        Self { add, node_slices, slice, created: AtomicBool::new(false), missing: AtomicBool::new(false) }
    }

    /// Whether the slice, as the NodeSlicePool lists it `now`, is no longer the node's whose pool this claim
    /// writes (this node's, or the lender's).
    fn moved(&self, now: Option<&Slice>) -> bool {
        now.is_none_or(|s| s.node != self.slice.node)
    }

    fn full(&self) -> IpamError {
        IpamError::Exhausted { pool: self.slice.pool_name(self.add.network_name()), range: self.slice.cidr.to_string() }
    }
}

impl<S: PoolStore + ReservationStore + SliceStore> Policy<S> for InSlice<'_, '_, S> {
    fn create(&self) -> Option<Option<&str>> {
        let owned = self.slice.node == self.add.node();
        self.missing.store(!owned, Ordering::Relaxed);
        owned.then_some(None)
    }

    /// A network that kept one pool per range (or other slices) before: the slice's new pool names the pools of
    /// the network whose ranges overlap the slice but other nodes' pools of the same slice ([`crate::claim::replaces`]).
    fn replaces_others(&self) -> bool {
        true
    }

    fn guard_in_use(&self, pool: &IpPool) -> Option<(u128, String)> {
        let offsets = pool.spec.allocations.iter().filter_map(|(k, e)| Some((k.parse::<u128>().ok()?, e)));
        offsets.min_by_key(|(offset, _)| *offset).map(|(offset, e)| (offset, e.id.clone()))
    }

    async fn may_create(&self, _store: &S, _budget: &Budget) -> Result<bool, IpamError> {
        let now = self.add.slice_now(self.node_slices, self.slice).await?;
        if self.moved(now.as_ref()) {
            tracing::info!(node_slices = self.node_slices, slice = %self.slice.cidr,
                owner = now.map(|s| s.node).unwrap_or_default(), "slice no longer this node's: its pool not re-created");
            return Ok(false);
        }
        if let Some(holder) = self.add.held_elsewhere(self.slice.cidr).await? {
            tracing::warn!(node_slices = self.node_slices, slice = %self.slice.cidr, node = %holder.node,
                pool = %holder.pool, "another node's pool of this slice holds entries: this node's not created");
            return Ok(false);
        }
        self.created.store(true, Ordering::Relaxed);
        Ok(true)
    }

    async fn claimed(
        &self,
        _store: &S,
        pool: &IpPool,
        _range: &IpRange,
        _offset: u128,
        _budget: &Budget,
    ) -> Result<(), IpamError> {
        // A pool in use (its guard tested an entry still there) keeps its slice: no node claims a slice whose
        // pools hold entries. The first entry of an empty pool, or of one re-created, may have landed as the slice
        // changed hands: read the owner, and give the entry back if it is no longer the pool's node.
        if !self.created.load(Ordering::Relaxed) && !pool.spec.allocations.is_empty() {
            return Ok(());
        }
        let now = self.add.slice_now(self.node_slices, self.slice).await?;
        if self.moved(now.as_ref()) {
            tracing::warn!(node_slices = self.node_slices, slice = %self.slice.cidr,
                "the slice changed hands as the entry was written into its empty pool: the entry is given back");
            return Err(self.full());
        }
        Ok(())
    }
}
