//! ADD: one address from every range, all or nothing, with no lock: the reservation create is the cluster-wide
//! claim, the guarded patch the pool's (DESIGN §5).

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::journal::{Journal, Written};
use super::{Assigned, IpamError, Request};
use crate::allocator::{self, Strategy};
use crate::budget::Budget;
use crate::config::IpamConfig;
use crate::crd::{IpAllocation, IpPool, OverlappingRangeIpReservationSpec};
use crate::names;
use crate::range::IpRange;
use crate::store::{AddOutcome, ReserveOutcome, Store, StoreError};

/// Assigns one address from each range of `cfg` to the attachment `req`. An attachment (pod + interface) that
/// already holds an address in a pool gets it back. On any failure, what this call wrote is rolled back first.
pub async fn assign(
    store: &Store,
    cfg: &IpamConfig,
    req: &Request,
    budget: &Budget,
) -> Result<Vec<Assigned>, IpamError> {
    let mut journal = Journal::default();
    let mut assigned = Vec::with_capacity(cfg.ranges.len());
    for range in &cfg.ranges {
        match assign_one(store, cfg, req, range, budget, &mut journal).await {
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

fn podref(cfg: &IpamConfig) -> String {
    format!("{}/{}", cfg.pod.namespace, cfg.pod.name)
}

fn seed(req: &Request) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded per process, so concurrent invocations start their searches apart.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(req.container_id.as_bytes());
    h.finish()
}

fn taken_offsets(pool: &IpPool) -> BTreeSet<u128> {
    pool.spec.allocations.keys().filter_map(|k| k.parse().ok()).collect()
}

/// The entry of `pool` this attachment already holds, if any (a retried or repeated ADD).
fn held_by(pool: &IpPool, podref: &str, ifname: &str) -> Option<(u128, IpAllocation)> {
    pool.spec.allocations.iter().find_map(|(k, a)| {
        (a.podref == podref && a.ifname == ifname).then(|| k.parse().ok().map(|o| (o, a.clone()))).flatten()
    })
}

/// What a step of the protocol decided.
enum Step {
    /// The attachment holds this address now.
    Done(IpAddr),
    /// The pool changed under us: read it again and pick again.
    Reread,
}

/// What claiming an address cluster-wide came to.
enum Claim {
    /// This call created the reservation of that name.
    Created(String),
    /// Nothing to create: overlapping ranges are off, or the reservation is ours from an earlier ADD.
    NotNeeded,
    /// Another pod holds the address.
    HeldElsewhere,
}

/// One range's share of an ADD: the pool, who asks, and what to write.
struct RangeAssignment<'a> {
    store: &'a Store,
    cfg: &'a IpamConfig,
    req: &'a Request,
    range: &'a IpRange,
    budget: &'a Budget,
    pool_name: String,
    cidr: String,
    podref: String,
    requested: Option<IpAddr>,
    allocation: IpAllocation,
}

async fn assign_one(
    store: &Store,
    cfg: &IpamConfig,
    req: &Request,
    range: &IpRange,
    budget: &Budget,
    journal: &mut Journal,
) -> Result<IpAddr, IpamError> {
    let podref = podref(cfg);
    let assignment = RangeAssignment {
        store,
        cfg,
        req,
        range,
        budget,
        pool_name: names::pool_name(&cfg.network_name, range.cidr()),
        cidr: range.cidr().to_string(),
        requested: cfg.requested.iter().copied().find(|ip| range.offset_of(*ip).is_some()),
        allocation: IpAllocation {
            id: req.container_id.clone(),
            podref: podref.clone(),
            ifname: req.ifname.clone(),
            poduid: cfg.pod.uid.clone(),
            allocated: Some(k8s_openapi::jiff::Timestamp::now().to_string()),
            node: Some(req.node.clone()).filter(|n| !n.is_empty()),
            network: Some(cfg.name.clone()).filter(|n| !n.is_empty()),
        },
        podref,
    };
    assignment.run(journal).await
}

impl RangeAssignment<'_> {
    async fn run(&self, journal: &mut Journal) -> Result<IpAddr, IpamError> {
        // Offsets found held cluster-wide by a reservation of another pod: not in this pool, but not free either.
        let mut claimed_elsewhere = BTreeSet::new();
        let mut seed = seed(self.req);
        // After a lost race, the writers that raced for the lowest free address would all race again for the
        // next one: the loser picks at random instead, which spreads them apart.
        let mut strategy = self.cfg.strategy;
        loop {
            let pool = self.read_pool().await?;
            if let Some(step) = self.reuse_held(&pool).await? {
                match step {
                    Step::Done(ip) => return Ok(ip),
                    Step::Reread => continue,
                }
            }
            // Pick, claim cluster-wide, then claim in the pool; a lost race on either picks again.
            loop {
                let offset = self.candidate(&pool, &claimed_elsewhere, strategy, seed)?;
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let reserved = match self.reserve(offset).await? {
                    Claim::HeldElsewhere => {
                        claimed_elsewhere.insert(offset);
                        strategy = Strategy::Random;
                        continue;
                    }
                    Claim::NotNeeded => None,
                    Claim::Created(name) => {
                        journal.record(Written::Reservation {
                            name: name.clone(),
                            podref: self.podref.clone(),
                            containerid: self.req.container_id.clone(),
                        });
                        Some(name)
                    }
                };
                match self.claim(offset, reserved, journal).await? {
                    Step::Done(ip) => return Ok(ip),
                    Step::Reread => {
                        strategy = Strategy::Random;
                        break;
                    }
                }
            }
        }
    }

    async fn read_pool(&self) -> Result<IpPool, IpamError> {
        self.budget
            .retry(StoreError::is_transient, || self.store.get_or_create_pool(&self.pool_name, &self.cidr))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {}: get", self.pool_name), e))
    }

    /// An attachment that already holds an address here keeps it (DESIGN §4); a new sandbox of it takes the
    /// entry and the reservation over.
    async fn reuse_held(&self, pool: &IpPool) -> Result<Option<Step>, IpamError> {
        let held = held_by(pool, &self.podref, &self.req.ifname)
            .and_then(|(offset, entry)| Some((offset, self.range.checked_addr_at(offset)?, entry)));
        let Some((offset, ip, held)) = held.filter(|(_, ip, _)| self.requested.is_none_or(|r| r == *ip)) else {
            return Ok(None);
        };
        if held.id == self.req.container_id {
            return Ok(Some(Step::Done(ip)));
        }
        let renewed = IpAllocation { allocated: held.allocated.clone(), ..self.allocation.clone() };
        let pool = &self.pool_name;
        let replaced = self
            .budget
            .retry(StoreError::is_transient, || self.store.replace_allocation(pool, offset, &held, &renewed))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {pool}: replace allocation {offset}"), e))?;
        if !replaced {
            return Ok(Some(Step::Reread));
        }
        if self.cfg.overlapping_ranges {
            let name = names::reservation_name(&self.cfg.network_name, ip);
            self.budget
                .retry(StoreError::is_transient, || {
                    self.store.move_reservation(&name, &self.podref, &held.id, &self.req.container_id)
                })
                .await
                .map_err(|e| IpamError::from_retry(&format!("reservation {name}: move"), e))?;
        }
        tracing::info!(pool = %pool, %ip, "attachment already held this address; container id updated");
        Ok(Some(Step::Done(ip)))
    }

    /// The offset to try next: the requested address (which must be free and usable), else the allocator's pick.
    fn candidate(
        &self,
        pool: &IpPool,
        claimed_elsewhere: &BTreeSet<u128>,
        strategy: Strategy,
        seed: u64,
    ) -> Result<u128, IpamError> {
        if let Some(ip) = self.requested {
            let offset = self.range.offset_of(ip).expect("requested address lies in this range");
            if !self.range.is_usable(offset) {
                return Err(IpamError::RequestedUnusable { ip, range: self.cidr.clone() });
            }
            if let Some(holder) = pool.spec.allocations.get(&offset.to_string()) {
                return Err(IpamError::RequestedTaken { ip, holder: holder.podref.clone() });
            }
            return Ok(offset);
        }
        let mut taken = taken_offsets(pool);
        taken.extend(claimed_elsewhere);
        allocator::pick(self.range, &taken, strategy, seed)
            .ok_or_else(|| IpamError::Exhausted { pool: self.pool_name.clone(), range: self.cidr.clone() })
    }

    /// Claims the address cluster-wide, when overlapping ranges are on.
    async fn reserve(&self, offset: u128) -> Result<Claim, IpamError> {
        if !self.cfg.overlapping_ranges {
            return Ok(Claim::NotNeeded);
        }
        let ip = self.range.addr_at(offset);
        let name = names::reservation_name(&self.cfg.network_name, ip);
        let spec = OverlappingRangeIpReservationSpec {
            containerid: self.req.container_id.clone(),
            ifname: self.req.ifname.clone(),
            podref: self.podref.clone(),
        };
        let outcome = self
            .budget
            .retry(StoreError::is_transient, || self.store.reserve(&name, &spec))
            .await
            .map_err(|e| IpamError::from_retry(&format!("reservation {name}: create"), e))?;
        match outcome {
            ReserveOutcome::Created => Ok(Claim::Created(name)),
            // a leftover of an earlier ADD of this same attachment
            ReserveOutcome::Exists(held) if held.podref == self.podref && held.ifname == self.req.ifname => {
                Ok(Claim::NotNeeded)
            }
            ReserveOutcome::Exists(held) => {
                if self.requested.is_some() {
                    return Err(IpamError::RequestedTaken { ip, holder: held.podref });
                }
                tracing::debug!(%ip, holder = %held.podref, "address reserved through an overlapping range");
                Ok(Claim::HeldElsewhere)
            }
        }
    }

    /// The guarded patch that claims `offset` in the pool.
    async fn claim(&self, offset: u128, reserved: Option<String>, journal: &mut Journal) -> Result<Step, IpamError> {
        let pool = &self.pool_name;
        let outcome = self
            .budget
            .retry(StoreError::is_transient, || self.store.add_allocation(pool, offset, &self.allocation))
            .await
            .map_err(|e| IpamError::from_retry(&format!("pool {pool}: add allocation {offset}"), e))?;
        let ip = self.range.addr_at(offset);
        if outcome == AddOutcome::Added {
            journal.record(Written::Allocation { pool: pool.clone(), offset, held: self.allocation.clone() });
            tracing::info!(pool = %pool, %ip, "assigned");
            return Ok(Step::Done(ip));
        }
        // A real collision with a writer that reserved nothing (overlap off, or Whereabouts): give back our
        // reservation and pick again from a fresh read.
        tracing::debug!(pool = %pool, offset, "offset taken concurrently; picking again");
        if let Some(name) = reserved {
            self.budget
                .retry(StoreError::is_transient, || {
                    self.store.release_reservation(&name, &self.podref, &self.req.container_id)
                })
                .await
                .map_err(|e| IpamError::from_retry(&format!("reservation {name}: delete"), e))?;
            journal.forget_reservation(&name);
        }
        match self.requested {
            Some(ip) => Err(IpamError::RequestedTaken { ip, holder: "a concurrent ADD".into() }),
            None => Ok(Step::Reread),
        }
    }
}
