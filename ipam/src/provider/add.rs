//! ADD in IaaS provider mode: the config's ranges are the interface's *candidates*. They are narrowed to the
//! highest class among them (from the config alone, so every node decides alike; the rest are named in a warning
//! and a Warning Event on the pod, and never fallen back to). Then, for each IP family, the kept candidates that
//! apply to this node (node-warm pools of other nodes do not) are tried in order, node-warm first, until one gives
//! an address; a paired dual-stack candidate gives both families at once. A candidate with nothing to give here is
//! passed over having written nothing; any other failure fails the ADD, all or nothing across the families.

use std::collections::BTreeSet;

use std::net::IpAddr;

use super::place::{At, Placer};
use super::placement::{Candidate, Mode, Narrowed, Placement, narrow};
use crate::budget::Budget;
use crate::claim::decide;
use crate::claim::{Claim, Claimant, Journal, Policy, Steer, Target};
use crate::config::{IpamConfig, Provider};
use crate::crd::{IpAllocation, IpPool, SubInterfaceRecord};
use crate::error::IpamError;
use crate::names;
use crate::range::IpRange;
use crate::request::{Assigned, Request};
use crate::store::{CoreStore, PodEvent, PoolStore, ReservationStore, StoreError, SubInterfaceStore};

/// The reason of the Warning Event on a pod whose config's candidate ranges mixed classes.
pub const IGNORED_CANDIDATES_REASON: &str = "HereaboutsIgnoredCandidates";

/// Assigns the attachment `req` one address per IP family of the candidates of `cfg` (see the module
/// documentation). A provider's CA and certificates are read before anything is written.
pub(crate) async fn add<S>(
    store: &S,
    cfg: &IpamConfig,
    mode: &Provider,
    req: &Request,
    budget: &Budget,
) -> Result<Vec<Assigned>, IpamError>
where
    S: PoolStore + ReservationStore + SubInterfaceStore + CoreStore,
{
    let placer = Placer::new(cfg, &mode.provider, &req.node)?;
    let podref = cfg.pod.to_string();
    let who = Claimant::new(cfg, &mode.kube, req, &podref);
    CandidateAdd { store, cfg, mode, req, budget, who: &who, placer: &placer }.run().await
}

/// The indices of the ranges of `mode` that are candidates, narrowed to the highest class among them (decided from
/// the config alone, so alike on every node).
pub fn candidates(mode: &Provider) -> Narrowed<usize> {
    let candidates = mode.placements.iter().enumerate().filter(|(_, p)| p.is_candidate());
    narrow(candidates.map(|(i, p)| Candidate { class: p.class(), warm: p.bound_node().is_some(), item: i }).collect())
}

/// The ranges of `ranges` (the config's) an ADD of `mode` tries: the candidates of the highest class (with the IPv6
/// half of each kept pair), in the order it tries them.
pub fn kept_ranges<'r>(mode: &Provider, ranges: &'r [IpRange]) -> Vec<&'r IpRange> {
    let mut out = Vec::new();
    for i in candidates(mode).kept {
        out.push(&ranges[i]);
        if let Placement::Paired { v6 } = mode.placements[i] {
            out.push(&ranges[v6]);
        }
    }
    out
}

/// What the provider's mode adds to the claim in a candidate's pool: the pool's fixed shape (bound to a node or
/// not), and for a provider-backed range which free address to prefer and the placement of its sub-interface.
struct Placing<'a> {
    /// The node the pool must be bound to (`None`: no node).
    bound: Option<&'a str>,
    /// For a provider-backed range, the client and the pool's placement mode.
    placer: Option<(&'a Placer<'a>, &'a Mode)>,
    /// Whether the address is placed once claimed; `false` for the IPv4 half of a dual-stack pair, placed with its
    /// IPv6 partner once both are claimed.
    place: bool,
}

impl<S: PoolStore + SubInterfaceStore> Policy<S> for Placing<'_> {
    fn create(&self) -> Option<Option<&str>> {
        Some(self.bound)
    }

    /// A pool found in another shape is refused, since its mode is fixed for its life.
    fn check(&self, pool: IpPool, name: &str) -> Result<IpPool, IpamError> {
        let found = pool.spec.node_name.as_deref();
        if found == self.bound {
            return Ok(pool);
        }
        let say = |n: Option<&str>| n.map_or("a global pool (no node)".to_string(), |n| format!("node-warm on {n}"));
        Err(IpamError::PoolPlacement {
            pool: name.to_string(),
            message: format!(
                "the pool is {} but the config makes it {}: a pool's placement is fixed for its life",
                say(found),
                say(self.bound)
            ),
        })
    }

    /// Sub-interfaces the provider is unbinding are avoided; a global pool prefers one cached here, a node-warm
    /// pool hands out only what is warm on this node (no provider call, no other address).
    fn steer(&self, pool: &IpPool, range: &IpRange, excluded: &BTreeSet<u128>) -> Steer {
        let Some((placer, mode)) = self.placer else { return Steer::default() };
        let (avoid, prefer) = placer.prefer(mode, pool, range, excluded);
        Steer { avoid, prefer, only: matches!(mode, Mode::NodeWarm { .. }) }
    }

    fn nothing_here(&self, pool: &str, range: &IpRange) -> IpamError {
        match self.placer {
            Some((placer, _)) => IpamError::NoWarmAddress { pool: pool.to_string(), node: placer.node().to_string() },
            None => IpamError::Exhausted { pool: pool.to_string(), range: range.cidr().to_string() },
        }
    }

    /// The claim is guarded on the sub-interface record as read, so one the provider marked unbinding (or moved)
    /// since is not taken.
    fn guard_record(&self, pool: &IpPool, offset: u128) -> Option<SubInterfaceRecord> {
        self.placer.and_then(|_| pool.spec.sub_interfaces.get(&offset.to_string()).cloned())
    }

    /// A provider-backed address is placed on this node (a provider call unless its sub-interface is cached or
    /// warm here).
    async fn claimed(
        &self,
        store: &S,
        pool: &IpPool,
        range: &IpRange,
        offset: u128,
        budget: &Budget,
    ) -> Result<(), IpamError> {
        if let Some((placer, mode)) = self.placer
            && self.place
        {
            let at = At { pool, range, offset, paired: None };
            placer.place(store, mode, &at, budget).await?;
        }
        Ok(())
    }
}

/// One provider-mode ADD: the attachment, its config, the store, the budget and the provider's client.
struct CandidateAdd<'a, S> {
    store: &'a S,
    cfg: &'a IpamConfig,
    mode: &'a Provider,
    req: &'a Request,
    budget: &'a Budget,
    who: &'a Claimant<'a>,
    placer: &'a Placer<'a>,
}

impl<S> CandidateAdd<'_, S>
where
    S: PoolStore + ReservationStore + SubInterfaceStore + CoreStore,
{
    async fn run(&self) -> Result<Vec<Assigned>, IpamError> {
        let (cfg, mode) = (self.cfg, self.mode);
        let narrowed = candidates(mode);
        if !narrowed.ignored.is_empty() {
            self.warn_ignored(&narrowed).await;
        }
        if narrowed.kept.first().is_some_and(|i| matches!(mode.placements[*i], Placement::Paired { .. })) {
            return self.pair(&narrowed.kept).await;
        }
        let mut families: Vec<bool> = Vec::new();
        for index in &narrowed.kept {
            let v4 = cfg.ranges[*index].cidr().addr().is_ipv4();
            if !families.contains(&v4) {
                families.push(v4);
            }
        }
        let mut journal = Journal::default();
        let mut assigned: Vec<Assigned> = Vec::with_capacity(families.len());
        for v4 in families {
            let mut here: Vec<usize> = narrowed
                .kept
                .iter()
                .copied()
                .filter(|i| cfg.ranges[*i].cidr().addr().is_ipv4() == v4)
                .filter(|i| mode.placements[*i].bound_node().is_none_or(|n| n == self.req.node))
                .collect();
            // an address asked for (runtimeConfig ips, CNI_ARGS IP) comes from its own range, or from none
            if here.iter().any(|i| cfg.requested_for(*i).is_some()) {
                here.retain(|i| cfg.requested_for(*i).is_some());
            }
            let family = if v4 { "IPv4" } else { "IPv6" };
            match self.one_of(family, here, &assigned, &mut journal).await {
                Ok(a) => assigned.push(a),
                Err(e) => return Err(self.rolled_back(journal, e).await),
            }
        }
        Ok(assigned)
    }

    /// One address of `family` from the first of `here` that gives one; what it wrote goes to `journal`.
    async fn one_of(
        &self,
        family: &'static str,
        here: Vec<usize>,
        assigned: &[Assigned],
        journal: &mut Journal,
    ) -> Result<Assigned, IpamError> {
        let cfg = self.cfg;
        let (order, mut held) = self.holding_first(here).await?;
        let mut tried = Vec::new();
        for index in order {
            let (range, placement) = (&cfg.ranges[index], &self.mode.placements[index]);
            let mut target = Target::new(names::pool_name(&cfg.network_name, range.cidr()), range);
            target.read = held.take();
            target.requested = cfg.requested_for(index);
            target.given = assigned.iter().filter_map(|a| range.offset_of(a.ip)).collect();
            let placer = match placement {
                Placement::Provider(mode) => Some((self.placer, mode)),
                _ => None,
            };
            let policy = Placing { bound: placement.bound_node(), placer, place: true };
            let mut written = Journal::default();
            match Claim::new(self.store, self.who, target, &policy, self.budget).run(&mut written).await {
                Ok(ip) => {
                    journal.extend(written);
                    return Ok(self.assigned(ip, range));
                }
                Err(
                    e @ (IpamError::Exhausted { .. } | IpamError::NoWarmAddress { .. } | IpamError::CoolingDown { .. }),
                ) => {
                    self.pass_over(range, written, &e).await;
                    tried.push(e);
                }
                Err(e) => {
                    journal.extend(written);
                    return Err(e);
                }
            }
        }
        Err(IpamError::NoCandidate { family, node: self.req.node.clone(), tried })
    }

    /// The candidates `here` in the order to try them: when several apply, the one whose pool already holds this
    /// attachment's entry (an ADD retried after its first try was killed) comes first, with that pool as read, so
    /// a retry gets its address back rather than a second one from an earlier candidate. (Otherwise the first
    /// candidate's pool, as read, if it exists.)
    async fn holding_first(&self, mut here: Vec<usize>) -> Result<(Vec<usize>, Option<IpPool>), IpamError> {
        if here.len() < 2 {
            return Ok((here, None));
        }
        let mut first = None;
        for (at, index) in here.iter().enumerate() {
            let name = names::pool_name(&self.cfg.network_name, self.cfg.ranges[*index].cidr());
            let pool = self
                .budget
                .retry(StoreError::is_transient, || self.store.get_pool(&name))
                .await
                .map_err(|e| IpamError::from_retry(&format!("pool {name}: get"), e))?;
            match pool {
                Some(pool) if decide::held_by(&pool, &self.who.me).is_some() => {
                    let index = here.remove(at);
                    here.insert(0, index);
                    return Ok((here, Some(pool)));
                }
                Some(pool) if at == 0 => first = Some(pool),
                _ => {}
            }
        }
        Ok((here, first))
    }

    /// A paired dual-stack candidate (the highest class): an IPv4 address and an IPv6 one on one sub-interface,
    /// both or neither, from the first of `kept` that gives a pair.
    async fn pair(&self, kept: &[usize]) -> Result<Vec<Assigned>, IpamError> {
        let mut tried = Vec::new();
        for &v4 in kept {
            let Placement::Paired { v6 } = self.mode.placements[v4] else { continue };
            let mut written = Journal::default();
            match self.add_pair(v4, v6, &mut written).await {
                Ok(pair) => return Ok(pair),
                Err(e @ (IpamError::Exhausted { .. } | IpamError::CoolingDown { .. })) => {
                    self.pass_over(&self.cfg.ranges[v4], written, &e).await;
                    tried.push(e);
                }
                Err(e) => return Err(self.rolled_back(written, e).await),
            }
        }
        Err(IpamError::NoCandidate { family: "IPv4+IPv6 pair", node: self.req.node.clone(), tried })
    }

    /// One paired candidate: the IPv4 address (preferring a sub-interface cached here, as in any global pool),
    /// then its IPv6 partner — the one recorded with the sub-interface (`pairedAddress`), which stays for its
    /// life, or for a new sub-interface one that no other pairs — then the placement of both.
    async fn add_pair(&self, v4: usize, v6: usize, journal: &mut Journal) -> Result<Vec<Assigned>, IpamError> {
        let (cfg, range4, range6) = (self.cfg, &self.cfg.ranges[v4], &self.cfg.ranges[v6]);
        let global = Mode::Global;
        let policy4 = Placing { bound: None, placer: Some((self.placer, &global)), place: false };
        let target4 = Target::new(names::pool_name(&cfg.network_name, range4.cidr()), range4);
        let add4 = Claim::new(self.store, self.who, target4, &policy4, self.budget);
        let ip4 = add4.run(journal).await?;
        let offset4 = range4.offset_of(ip4).expect("a claim in a range gives an address of that range");
        // the pool as it is now: the claim is ours, its record what the provider and other nodes last wrote
        let pool4 = add4.read_pool().await?;
        let paired_of = |r: &SubInterfaceRecord| r.paired_address.as_deref().and_then(|a| a.parse::<IpAddr>().ok());
        let sticky = pool4.spec.sub_interfaces.get(&offset4.to_string()).and_then(paired_of);
        let mut target6 = Target::new(names::pool_name(&cfg.network_name, range6.cidr()), range6);
        match sticky {
            Some(ip6) => target6.requested = Some(ip6),
            None => {
                let paired = pool4.spec.sub_interfaces.values().filter_map(paired_of);
                target6.given = paired.filter_map(|a| range6.offset_of(a)).collect();
            }
        }
        let policy6 = Placing { bound: None, placer: None, place: false };
        let ip6 = Claim::new(self.store, self.who, target6, &policy6, self.budget).run(journal).await?;
        let pool6 = names::pool_name(&cfg.network_name, range6.cidr());
        let at = At { pool: &pool4, range: range4, offset: offset4, paired: Some((ip6, &pool6)) };
        self.placer.place(self.store, &Mode::Global, &at, self.budget).await?;
        Ok(vec![self.assigned(ip4, range4), self.assigned(ip6, range6)])
    }

    fn assigned(&self, ip: IpAddr, range: &IpRange) -> Assigned {
        let gateway = self.cfg.gateway.filter(|gw| range.cidr().contains(gw));
        Assigned { ip, prefix_len: range.cidr().prefix_len(), gateway }
    }

    /// Takes back what a candidate that gave nothing wrote (a claim its pick lost, nothing else), before the next.
    async fn pass_over(&self, range: &IpRange, written: Journal, why: &IpamError) {
        tracing::info!(range = %range.cidr(), error = %why, "candidate range gave no address; trying the next");
        for e in written.roll_back(self.store, self.budget).await {
            tracing::error!(error = %e, "roll-back of a passed-over candidate");
        }
    }

    /// `err`, once what `journal` holds is taken back.
    async fn rolled_back(&self, journal: Journal, err: IpamError) -> IpamError {
        for e in journal.roll_back(self.store, self.budget).await {
            tracing::error!(error = %e, "roll-back of a failed ADD");
        }
        err
    }

    /// Says which candidates of a lower class this ADD leaves out: a warning in the log and a Warning Event on
    /// the pod (best effort, and briefly: the ADD goes on without it).
    async fn warn_ignored(&self, narrowed: &Narrowed<usize>) {
        let (cfg, req) = (self.cfg, self.req);
        let list = |items: &[usize]| {
            let each =
                items.iter().map(|i| format!("{} ({:?})", cfg.ranges[*i].cidr(), self.mode.placements[*i].class()));
            each.collect::<Vec<_>>().join(", ")
        };
        let message = format!(
            "network {}: candidate ranges of a lower class ignored: {}; only {} are used, with no fallback",
            cfg.name,
            list(&narrowed.ignored),
            list(&narrowed.kept)
        );
        tracing::warn!(pod = %cfg.pod, container = %req.container_id, ifname = %req.ifname, "{message}");
        let pod = PodEvent {
            namespace: &cfg.pod.namespace,
            name: &cfg.pod.name,
            uid: cfg.pod.uid.as_deref(),
            node: &req.node,
        };
        let wait = (self.budget.remaining() / 4).min(std::time::Duration::from_secs(2));
        match tokio::time::timeout(wait, self.store.warn_pod(&pod, IGNORED_CANDIDATES_REASON, &message)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(pod = %cfg.pod, error = %e, "could not put the Warning Event on the pod"),
            Err(_) => tracing::warn!(pod = %cfg.pod, "no answer in time to the Warning Event on the pod"),
        }
    }
}

/// CHECK of a provider config, whose ranges are candidates: for each IP family among the candidates an ADD tries
/// ([`kept_ranges`]), one of their pools holds the attachment's entry.
pub(crate) async fn check<S: PoolStore>(
    store: &S,
    cfg: &IpamConfig,
    mode: &Provider,
    req: &Request,
    budget: &Budget,
) -> Result<(), IpamError> {
    let kept = kept_ranges(mode, &cfg.ranges);
    let mine = |a: &IpAllocation| a.id == req.container_id && a.ifname == req.ifname;
    for v4 in [true, false] {
        let family: Vec<&IpRange> = kept.iter().copied().filter(|r| r.cidr().addr().is_ipv4() == v4).collect();
        let Some(first) = family.first() else { continue };
        let mut found = false;
        for range in &family {
            let name = names::pool_name(&cfg.network_name, range.cidr());
            let pool = crate::claim::read_pool(store, &name, budget).await?;
            if pool.is_some_and(|p| p.spec.allocations.values().any(mine)) {
                found = true;
                break;
            }
        }
        if !found {
            return Err(IpamError::Missing {
                pool: names::pool_name(&cfg.network_name, first.cidr()),
                container_id: req.container_id.clone(),
                ifname: req.ifname.clone(),
            });
        }
    }
    Ok(())
}
