//! One IPPool per range ([`Mode::Pools`](crate::config::Mode::Pools)), Whereabouts' way: an ADD claims one
//! address in each range's pool, all or nothing; DEL, CHECK and GC look in the same pools.

use std::future::Future;
use std::net::IpAddr;

use crate::budget::Budget;
use crate::claim::{self, Claim, ClaimRead, Claimant, Journal, Layout, Place, Plain, Scope, Target};
use crate::config::{IpamConfig, Pools};
use crate::error::IpamError;
use crate::names;
use crate::range::IpRange;
use crate::request::{Assigned, Request};
use crate::store::{IpamClaimStore, PoolStore, ReservationStore};

/// Assigns one address from each range of `cfg` to the attachment `req`. An attachment (pod + interface) that
/// already holds an address in a pool gets it back. On any failure, what this call wrote is rolled back first.
///
/// With an IPAMClaim (`claim`), the addresses are the claim's: `cfg` asks for those it records, the entries and
/// reservations name it, and what the ADD holds is recorded on it; another pod of the claim that recorded other
/// addresses meanwhile makes this ADD give its own back.
pub(crate) async fn add<S: PoolStore + ReservationStore + IpamClaimStore>(
    store: &S,
    cfg: &IpamConfig,
    pools: &Pools,
    req: &Request,
    budget: &Budget,
    claim: Option<&ClaimRead>,
    preferred: Option<IpAddr>,
) -> Result<Vec<Assigned>, IpamError> {
    let podref = cfg.pod.to_string();
    let who = Claimant::new(cfg, &pools.kube, req, &podref).for_claim(claim.map(|c| c.name.as_str()));
    let one = InPool { store, who: &who, pools, budget, preferred };
    let Some(claim) = claim else { return each_range(store, cfg, budget, &one).await };
    let (assigned, journal) = each_range_journaled(store, cfg, budget, &one).await?;
    if let Err(e) = claim.record(store, &assigned, &cfg.pod.name, budget).await {
        for back in journal.roll_back(store, budget).await {
            tracing::error!(error = %back, "roll-back of an ADD its IPAMClaim refused");
        }
        return Err(e);
    }
    Ok(assigned)
}

/// The claim of one range's address in that range's pool.
struct InPool<'a, S> {
    store: &'a S,
    who: &'a Claimant<'a>,
    pools: &'a Pools,
    budget: &'a Budget,
    /// The pod's preferred address, taken from the range that contains it when free.
    preferred: Option<IpAddr>,
}

impl<S: PoolStore + ReservationStore> OneRange for InPool<'_, S> {
    async fn claim(
        &self,
        index: usize,
        range: &IpRange,
        given: &[IpAddr],
        journal: &mut Journal,
    ) -> Result<IpAddr, IpamError> {
        let cfg = self.who.cfg;
        let mut target = Target::new(names::pool_name(&cfg.network_name, range.cidr()), range);
        target.requested = cfg.requested_for(index);
        target.preferred = self.preferred.filter(|ip| range.cidr().contains(ip));
        target.given = given.iter().filter_map(|ip| range.offset_of(*ip)).collect();
        target.statefulset = self.pools.sticky_statefulset(&cfg.ranges, range);
        Claim::new(self.store, self.who, target, &Plain { creates: true }, self.budget).run(journal).await
    }
}

/// How an ADD claims the address of one of its ranges.
pub(crate) trait OneRange {
    /// Claims an address of `range` (the config's range `index`), not one of `given` (the addresses earlier
    /// ranges gave: ranges of one config may overlap), recording what it writes in `journal` first.
    fn claim(
        &self,
        index: usize,
        range: &IpRange,
        given: &[IpAddr],
        journal: &mut Journal,
    ) -> impl Future<Output = Result<IpAddr, IpamError>> + Send;
}

/// One address from each range of `cfg`, all or nothing, each claimed by `one`; on any failure, what was written
/// is rolled back first.
pub(crate) async fn each_range<S: PoolStore + ReservationStore>(
    store: &S,
    cfg: &IpamConfig,
    budget: &Budget,
    one: &impl OneRange,
) -> Result<Vec<Assigned>, IpamError> {
    each_range_journaled(store, cfg, budget, one).await.map(|(assigned, _)| assigned)
}

/// [`each_range`], with what it wrote on the way (the warm reserve learns where its entries went from it).
pub(crate) async fn each_range_journaled<S: PoolStore + ReservationStore>(
    store: &S,
    cfg: &IpamConfig,
    budget: &Budget,
    one: &impl OneRange,
) -> Result<(Vec<Assigned>, Journal), IpamError> {
    let mut journal = Journal::default();
    let mut assigned = Vec::with_capacity(cfg.ranges.len());
    for (index, range) in cfg.ranges.iter().enumerate() {
        let given: Vec<IpAddr> = assigned.iter().map(|a: &Assigned| a.ip).collect();
        match one.claim(index, range, &given, &mut journal).await {
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
    Ok((assigned, journal))
}

/// Where the entries of this mode (and of the provider's candidates) live: the range's one pool.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OnePool;

impl<S: PoolStore> Layout<S> for OnePool {
    fn places(
        &self,
        _store: &S,
        scope: &Scope<'_>,
        range: &IpRange,
        _node: &str,
        _budget: &Budget,
    ) -> impl Future<Output = Result<Vec<Place>, IpamError>> + Send {
        let place = Place { pool: names::pool_name(scope.network_name, range.cidr()), range: range.clone(), own: true };
        async move { Ok(vec![place]) }
    }

    fn missing_in(&self, scope: &Scope<'_>, range: &IpRange) -> String {
        names::pool_name(scope.network_name, range.cidr())
    }
}

/// The objects an invocation of `cfg` on a node writes, for the host lock: each range's pool.
pub(crate) fn locked(cfg: &IpamConfig) -> Vec<String> {
    cfg.ranges.iter().map(|r| names::pool_name(&cfg.network_name, r.cidr())).collect()
}

/// Verifies that the attachment `req` holds an address in every range of `cfg`.
pub(crate) async fn check<S: PoolStore>(
    store: &S,
    scope: &Scope<'_>,
    req: &Request,
    budget: &Budget,
) -> Result<(), IpamError> {
    claim::check(store, &OnePool, scope, req, budget).await
}
