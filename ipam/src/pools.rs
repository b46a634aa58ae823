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

/// The pools that the new pool `name` of `range` for the config `cfg` replaces, listed now: those of [`overlapping`]
/// (its network name's) that are `cfg`'s own — made by an ADD of the same netconf `name`
/// ([`crate::store::CONFIG_ANNOTATION`]), or, made before that was recorded, holding entries all of that network —
/// but, for a slice's pool (`slice`), pools of the very same CIDR (another node's pool of the same slice: a slice
/// that changed hands is not a layout that changed). Another config that shares the network name (overlapping
/// ranges of two networks, kept apart by their reservations) is not a layout this one replaces: its pools are
/// neither moved from nor retired.
///
/// The second list: the overlapping pools of the network that no hereabouts config made (no config recorded, no entry
/// with a network: Whereabouts wrote them), which the new pool keeps off ([`crate::store::KEEPS_OFF_ANNOTATION`])
/// without taking them as its own layout.
pub(crate) async fn replaced<S: PoolStore>(
    store: &S,
    name: &str,
    range: &IpRange,
    cfg: &IpamConfig,
    slice: bool,
    budget: &Budget,
) -> Result<(Vec<String>, Vec<String>), IpamError> {
    let listed = budget
        .retry(crate::store::StoreError::is_transient, || store.list_pools())
        .await
        .map_err(|e| IpamError::from_retry(&format!("pool {name}: list the pools it may replace"), e))?;
    let same = names::range_string(range.cidr());
    let ours = |pool: &crate::crd::IpPool| match crate::store::config_of(pool) {
        Some(config) => config == cfg.name,
        None => {
            let entries = &pool.spec.allocations;
            !entries.is_empty() && entries.values().all(|e| e.network.as_deref() == Some(cfg.name.as_str()))
        }
    };
    let unmade = |pool: &crate::crd::IpPool| {
        crate::store::config_of(pool).is_none() && pool.spec.allocations.values().all(|e| e.network.is_none())
    };
    let found = overlapping(&listed, name, range, &cfg.network_name);
    let (mut replaced, mut kept_off) = (Vec::new(), Vec::new());
    for other in found {
        let Some(pool) = listed.iter().find(|p| p.metadata.name.as_deref() == Some(other.as_str())) else { continue };
        if slice && pool.spec.range == same {
            continue;
        }
        if ours(pool) {
            replaced.push(other);
        } else if unmade(pool) && !pool.spec.allocations.is_empty() {
            kept_off.push(other);
        }
    }
    Ok((replaced, kept_off))
}

/// The pools of `listed` that a new pool `name` of `range` for the network `network_name` replaces: those of the same
/// network (as [`crate::claim::pool_scope`] reads a pool's network) whose ranges overlap `range`, but for node-warm
/// pools (IaaS provider mode: never one range's).
pub(crate) fn overlapping(
    listed: &[crate::crd::IpPool],
    name: &str,
    range: &IpRange,
    network_name: &str,
) -> Vec<String> {
    let mine = range.cidr();
    let mut found: Vec<String> = listed
        .iter()
        .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n != name) && p.spec.node_name.is_none())
        .filter_map(|p| {
            let (theirs, network) = crate::claim::pool_scope(p)?;
            let theirs = theirs.cidr();
            (network == network_name && crate::cut::overlap(mine, theirs)).then(|| p.metadata.name.clone()).flatten()
        })
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewPool;

    #[test]
    fn a_new_pool_replaces_the_overlapping_pools_of_its_own_network_only() {
        let pool = |name: &str, range: &str, network: &str, node: Option<&str>| {
            NewPool { network_name: network, node_name: node, ..NewPool::new(name, range, 0) }.object()
        };
        let listed = [
            pool("198.18.61.0-30", "198.18.61.0/30", "", None),
            pool("198.18.61.4-30", "198.18.61.4/30", "", None),
            pool("198.18.62.0-30", "198.18.62.0/30", "", None),
            pool("blue-198.18.61.0-30", "198.18.61.0/30", "blue", None),
            pool("198.18.61.0-29", "198.18.61.0/29", "", None),
            pool("warm-198.18.61.0-28", "198.18.61.0/28", "", Some("node-a")),
            pool("198.18.0.0-16", "198.18.0.0/16", "", None),
        ];
        let range = IpRange::parse("198.18.61.0/29", None, None, &[]).unwrap();
        assert_eq!(
            overlapping(&listed, "198.18.61.0-29", &range, ""),
            ["198.18.0.0-16", "198.18.61.0-30", "198.18.61.4-30"],
            "its own network's pools inside it and around it; not itself, another network's, a disjoint one or a \
             node-warm pool"
        );
        assert_eq!(overlapping(&listed, "blue-198.18.61.0-29", &range, "blue"), ["blue-198.18.61.0-30"]);
    }

    /// Found by the agents' simulation: two networks sharing the network name with overlapping ranges (one pool and
    /// slices, kept apart by their reservations) are not one layout replacing another: a new pool names only its
    /// own config's pools, so the leader never moves another network's entries into it, nor retires its pools.
    #[tokio::test]
    async fn a_new_pool_replaces_only_its_own_configs_pools() {
        use crate::crd::IpAllocation;
        let store = crate::store::MemoryStore::new("ns");
        let entry = |network: Option<&str>| IpAllocation {
            id: "c".into(),
            podref: "ns/p".into(),
            network: network.map(str::to_string),
            ..Default::default()
        };
        let made_by = |name: &str, range: &str, config: &str, entries: &[Option<&str>]| {
            let mut pool = NewPool { config_name: config, ..NewPool::new(name, range, 0) }.object();
            for (i, network) in entries.iter().enumerate() {
                pool.spec.allocations.insert((i + 1).to_string(), entry(*network));
            }
            store.put_pool(pool);
        };
        made_by("198.18.90.0-30", "198.18.90.0/30", "net", &[]);
        made_by("198.18.90.4-30", "198.18.90.4/30", "other", &[Some("other")]);
        made_by("198.18.90.8-30", "198.18.90.8/30", "", &[Some("net"), Some("net")]);
        made_by("198.18.90.12-30", "198.18.90.12/30", "", &[Some("net"), None]);
        made_by("198.18.90.16-30", "198.18.90.16/30", "", &[]);
        made_by("198.18.90.20-30", "198.18.90.20/30", "", &[None, None]);
        let cfg = crate::config::load_with_paths(
            &crate::config::Input {
                stdin: br#"{"cniVersion":"1.0.0","name":"net","ipam":{"type":"hereabouts","range":"198.18.90.0/27"}}"#,
                cni_args: "",
            },
            &[],
        )
        .unwrap();
        let range = IpRange::parse("198.18.90.0/27", None, None, &[]).unwrap();
        let named =
            replaced(&store, "198.18.90.0-27", &range, &cfg, false, &Budget::new(std::time::Duration::from_secs(5)))
                .await
                .unwrap();
        let (replaced, kept_off) = named;
        assert_eq!(
            replaced,
            ["198.18.90.0-30", "198.18.90.8-30"],
            "made by this config, or holding entries of it only; not another config's, a mixed or an empty unknown one"
        );
        assert_eq!(kept_off, ["198.18.90.20-30"], "kept off: entries no hereabouts config recorded (Whereabouts')");
    }
}
