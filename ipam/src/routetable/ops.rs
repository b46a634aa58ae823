//! The use cases of the routing-table datastore, and the Kubernetes mode's announcement, over a [`Table`].

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use ipnet::IpNet;

use super::claim::{self, HostRoute, Verdict};
use super::records::{Record, Records};
use super::{LOCAL_TABLE, RouteTableError, Table, TableError};
use crate::budget::Budget;
use crate::config::{HostRoutes, IpamConfig, RouteTable};
use crate::range::IpRange;
use crate::request::{Assigned, Request};

/// What an ADD of the routing-table datastore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// One address per range, in the order of the ranges.
    pub assigned: Vec<Assigned>,
    /// How many of its claims met an earlier (or equally early) claim and were withdrawn.
    pub collisions: u32,
    /// How many propagation waits it took.
    pub rounds: u32,
}

fn host_net(ip: IpAddr) -> IpNet {
    IpNet::new(ip, if ip.is_ipv4() { 32 } else { 128 }).expect("a host prefix is valid")
}

fn now_ms() -> u128 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// The route of a new claim on `ip`.
fn new_route(routes: &HostRoutes, ip: IpAddr) -> HostRoute {
    HostRoute { dst: ip, table: routes.table, protocol: routes.protocol, metric: claim::claim_metric(now_ms()) }
}

fn assigned(cfg: &IpamConfig, range: &IpRange, ip: IpAddr) -> Assigned {
    let cidr = range.cidr();
    Assigned { ip, prefix_len: cidr.prefix_len(), gateway: cfg.gateway.filter(|g| cidr.contains(g)) }
}

/// Deletes routes and then their records, logging what fails (a roll-back must go on).
async fn withdraw(table: &impl Table, records: &Records, claims: impl IntoIterator<Item = HostRoute>) {
    for route in claims {
        if let Err(e) = table.delete(&route).await {
            tracing::error!(ip = %route.dst, error = %e, "roll-back: the route stays; GC or DEL will remove it");
            continue;
        }
        if let Err(e) = records.remove(route.dst) {
            tracing::error!(ip = %route.dst, error = %e, "roll-back: the record stays");
        }
    }
}

/// The cloud metadata services' addresses (AWS, GCP, Azure, OpenStack: 169.254.169.254; AWS over IPv6): a host
/// route to one would hand the node's credentials to a pod.
pub const METADATA_ADDRESSES: [IpAddr; 2] = [
    IpAddr::V4(std::net::Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
];

/// The addresses of one range the host already sends somewhere, which no host route of ours may take over, each
/// with what it is (docs/routetable.md, "Host routes a network's author cannot abuse").
#[derive(Debug, Default)]
struct Reserved(Vec<(IpNet, String)>);

impl Reserved {
    /// What `ip` is, if it is reserved.
    fn why(&self, ip: IpAddr) -> Option<&str> {
        self.0.iter().find(|(net, _)| net.contains(&ip)).map(|(_, why)| why.as_str())
    }

    fn check(&self, ip: IpAddr) -> Result<(), RouteTableError> {
        match self.why(ip) {
            Some(why) => Err(RouteTableError::Reserved { ip, why: why.to_string() }),
            None => Ok(()),
        }
    }
}

/// The reserved addresses of `range`, whose host routes would point at link `link`: the node's own addresses, the
/// metadata services', the node's DNS servers, and those a route of the table at least as specific as the range
/// sends elsewhere (through a gateway or another link). A route less specific than the range (a default route, an
/// aggregate the range is carved out of) is what host routes are for; a host route is a claim, judged as one.
async fn reserved(
    table: &impl Table,
    routes: &HostRoutes,
    range: IpNet,
    link: u32,
    nameservers: &[IpAddr],
) -> Result<Reserved, TableError> {
    let host = |ip: IpAddr| IpNet::from(ip);
    let mut out = Vec::new();
    for local in table.host_routes(LOCAL_TABLE, range).await? {
        out.push((host(local.dst), "an address of this node (local table)".to_string()));
    }
    for ip in METADATA_ADDRESSES.into_iter().filter(|ip| range.contains(ip)) {
        out.push((host(ip), "a cloud metadata service's address".to_string()));
    }
    for ip in nameservers.iter().filter(|ip| range.contains(*ip)) {
        out.push((host(*ip), "a DNS server of this node (/etc/resolv.conf)".to_string()));
    }
    for r in table.routes_over(routes.table, range).await? {
        let ours = r.protocol == routes.protocol;
        let same_place = r.link == Some(link) && r.gateway.is_none();
        if ours || same_place || r.dst.prefix_len() < range.prefix_len() {
            continue;
        }
        let via = match (r.gateway, r.link) {
            (Some(gw), _) => format!("via {gw}"),
            (None, Some(l)) => format!("on link {l}"),
            (None, None) => "nowhere (unreachable, blackhole or prohibit)".to_string(),
        };
        out.push((r.dst, format!("sent {via} by route {} (table {}, proto {})", r.dst, routes.table, r.protocol)));
    }
    Ok(Reserved(out))
}

/// How often one range is tried again at once after losing a race on this node.
const LOCAL_TRIES: u32 = 8;

/// One range's state during an ADD.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Free,
    Pending(HostRoute),
    Held(HostRoute),
}

/// ADD with the routing-table datastore: one address per range, claimed as the module documentation says. None
/// is one the host sends elsewhere already (`nameservers` are the node's DNS servers); a requested one that is
/// is refused before anything is written.
pub async fn assign<T: Table>(
    table: &T,
    cfg: &IpamConfig,
    mode: &RouteTable,
    req: &Request,
    budget: &Budget,
    nameservers: &[IpAddr],
) -> Result<Claimed, RouteTableError> {
    let routes = &mode.routes;
    let mut links = Vec::with_capacity(cfg.ranges.len());
    let mut reserve = Vec::with_capacity(cfg.ranges.len());
    for (i, r) in cfg.ranges.iter().enumerate() {
        let link = table.link_for(routes.device.as_deref(), r.cidr()).await?;
        let reserved = reserved(table, routes, r.cidr(), link, nameservers).await?;
        if let Some(ip) = cfg.requested_for(i) {
            reserved.check(ip)?;
        }
        links.push(link);
        reserve.push(reserved);
    }
    let records = Records::open(&routes.state_dir, &cfg.name)?;
    let pod = cfg.pod.to_string();
    // a runtime that repeats an ADD gets what the attachment holds already
    let mut slots = vec![Slot::Free; cfg.ranges.len()];
    for (ip, rec) in records.of(&req.container_id, &req.ifname)? {
        if let Some(i) = cfg.ranges.iter().position(|r| r.cidr().contains(&ip)) {
            slots[i] = Slot::Held(rec.route);
        }
    }
    let outcome = claim_all(table, cfg, mode, &records, &links, &reserve, &mut slots, req, &pod, budget).await;
    match outcome {
        Ok((collisions, rounds)) => {
            let assigned = slots
                .iter()
                .zip(&cfg.ranges)
                .map(|(s, r)| match s {
                    Slot::Held(route) => assigned(cfg, r, route.dst),
                    _ => unreachable!("claim_all holds every range when it succeeds"),
                })
                .collect();
            Ok(Claimed { assigned, collisions, rounds })
        }
        Err(e) => {
            let made = slots.iter().filter_map(|s| match s {
                Slot::Pending(r) | Slot::Held(r) => Some(*r),
                Slot::Free => None,
            });
            withdraw(table, &records, made.collect::<Vec<_>>()).await;
            Err(e)
        }
    }
}

/// The rounds of an ADD: claim every free range, wait, re-check; until every range is held or the budget is gone.
/// Returns the collisions and rounds.
#[allow(clippy::too_many_arguments)]
async fn claim_all<T: Table>(
    table: &T,
    cfg: &IpamConfig,
    mode: &RouteTable,
    records: &Records,
    links: &[u32],
    reserved: &[Reserved],
    slots: &mut [Slot],
    req: &Request,
    pod: &str,
    budget: &Budget,
) -> Result<(u32, u32), RouteTableError> {
    let (routes, claiming) = (&mode.routes, &mode.claiming);
    let (mut collisions, mut rounds) = (0u32, 0u32);
    let mut salt = 0u64;
    loop {
        let mut waiting_for_requested = None;
        for (i, range) in cfg.ranges.iter().enumerate() {
            if !matches!(slots[i], Slot::Free) {
                continue;
            }
            if budget.expired() {
                return Err(match cfg.requested_for(i) {
                    Some(ip) => RouteTableError::RequestedTaken { ip, table: routes.table },
                    None => RouteTableError::Expired { range: range.cidr(), collisions },
                });
            }
            // a lost race with another ADD of this node is retried at once, not after a propagation wait
            for _ in 0..LOCAL_TRIES {
                let mut taken: HashSet<IpAddr> =
                    table.host_routes(routes.table, range.cidr()).await?.into_iter().map(|r| r.dst).collect();
                taken.extend(records.addresses()?);
                let ip = match cfg.requested_for(i) {
                    Some(ip) if taken.contains(&ip) => {
                        waiting_for_requested = Some(ip);
                        break;
                    }
                    Some(ip) => ip,
                    None => {
                        let random = || {
                            salt += 1;
                            crate::entropy::random(format!("{}/{}/{salt}", req.container_id, req.ifname).as_bytes())
                        };
                        let taken = |ip: &IpAddr| taken.contains(ip) || reserved[i].why(*ip).is_some();
                        claim::pick(range, claiming.exclude_first, claiming.exclude_last, taken, random)
                            .ok_or(RouteTableError::Exhausted { range: range.cidr() })?
                    }
                };
                let route = new_route(routes, ip);
                let record = Record {
                    container_id: req.container_id.clone(),
                    ifname: req.ifname.clone(),
                    pod: pod.to_string(),
                    pod_uid: cfg.pod.uid.clone(),
                    route,
                };
                if !records.create(ip, &record)? {
                    continue; // another ADD on this node took it between the listing and now
                }
                match table.add(&route, links[i]).await {
                    Ok(()) => {
                        slots[i] = Slot::Pending(route);
                        break;
                    }
                    Err(super::TableError::Exists { .. }) => records.remove(ip)?,
                    Err(e) => {
                        records.remove(ip)?;
                        return Err(e.into());
                    }
                }
            }
        }
        if slots.iter().any(|s| matches!(s, Slot::Pending(_))) {
            rounds += 1;
            tokio::time::sleep(claiming.propagation).await;
        }
        for slot in slots.iter_mut() {
            let Slot::Pending(mine) = *slot else { continue };
            let seen = table.host_routes(routes.table, host_net(mine.dst)).await?;
            match claim::verdict(&mine, &seen) {
                Verdict::Keep => *slot = Slot::Held(mine),
                Verdict::Withdraw { competitor } => {
                    collisions += 1;
                    tracing::info!(ip = %mine.dst, ours = mine.metric, theirs = competitor.metric, proto = competitor.protocol, "collision: an earlier claim holds the address; withdrawn");
                    withdraw(table, records, [mine]).await;
                    *slot = Slot::Free;
                }
                Verdict::Lost => {
                    collisions += 1;
                    tracing::warn!(ip = %mine.dst, "our route vanished before the re-check; picking again");
                    records.remove(mine.dst)?;
                    *slot = Slot::Free;
                }
            }
        }
        if slots.iter().all(|s| matches!(s, Slot::Held(_))) {
            return Ok((collisions, rounds));
        }
        if waiting_for_requested.is_some() {
            tokio::time::sleep(claiming.requested_retry.min(budget.remaining())).await;
        }
    }
}

/// Removes one claim: its route, then its record. A route that cannot be removed keeps its record, so that GC and
/// the reconciler find it again.
pub async fn remove<T: Table>(
    table: &T,
    records: &Records,
    ip: IpAddr,
    record: Option<&Record>,
) -> Result<(), RouteTableError> {
    if let Some(rec) = record {
        table.delete(&rec.route).await?;
    }
    records.remove(ip)?;
    Ok(())
}

/// DEL: removes the routes and records of one attachment; returns how many. One that cannot be removed is logged
/// and left to GC and the reconciler: a DEL that fails leaves its pod Terminating, and a retry would fail alike.
/// Fails only when the records cannot be read at all.
pub async fn release<T: Table>(
    table: &T,
    routes: &HostRoutes,
    network: &str,
    container_id: &str,
    ifname: &str,
) -> Result<usize, RouteTableError> {
    let records = Records::open(&routes.state_dir, network)?;
    let held = records.of(container_id, ifname)?;
    let mut removed = 0;
    for (ip, rec) in &held {
        match remove(table, &records, *ip, Some(rec)).await {
            Ok(()) => removed += 1,
            Err(e) => tracing::error!(%ip, error = %e, "DEL: the claim stays; GC or the reconciler removes it"),
        }
    }
    Ok(removed)
}

/// GC: removes the routes and records of attachments not in `valid`, except those younger than `settle` (an ADD
/// under way has made its record before the runtime lists its attachment). Returns how many. As lenient as
/// [`release`].
pub async fn gc<T: Table>(
    table: &T,
    routes: &HostRoutes,
    network: &str,
    valid: &[crate::request::Attachment],
    settle: Duration,
) -> Result<usize, RouteTableError> {
    let records = Records::open(&routes.state_dir, network)?;
    let now = SystemTime::now();
    let mut released = 0;
    for listed in records.list()? {
        if now.duration_since(listed.made).unwrap_or_default() < settle {
            continue;
        }
        let in_use = listed
            .record
            .as_ref()
            .is_some_and(|r| valid.iter().any(|v| v.container_id == r.container_id && v.ifname == r.ifname));
        if in_use {
            continue;
        }
        match remove(table, &records, listed.ip, listed.record.as_ref()).await {
            Ok(()) => released += 1,
            Err(e) => tracing::error!(ip = %listed.ip, error = %e, "GC: the claim stays; the next GC tries again"),
        }
    }
    Ok(released)
}

/// CHECK: the attachment holds one address in every range, and each one's route is in the table.
pub async fn check<T: Table>(
    table: &T,
    cfg: &IpamConfig,
    routes: &HostRoutes,
    req: &Request,
) -> Result<(), RouteTableError> {
    let records = Records::open(&routes.state_dir, &cfg.name)?;
    let held = records.of(&req.container_id, &req.ifname)?;
    for range in &cfg.ranges {
        let Some((ip, rec)) = held.iter().find(|(ip, _)| range.cidr().contains(ip)) else {
            return Err(RouteTableError::Missing(format!(
                "{}/{} holds no address of range {} on this node",
                req.container_id,
                req.ifname,
                range.cidr()
            )));
        };
        let seen = table.host_routes(routes.table, host_net(*ip)).await?;
        match claim::verdict(&rec.route, &seen) {
            Verdict::Keep => {}
            Verdict::Lost => {
                return Err(RouteTableError::Missing(format!(
                    "the host route of {ip} (table {}, proto {}) is gone: the routing daemons no longer advertise it",
                    rec.route.table, rec.route.protocol
                )));
            }
            Verdict::Withdraw { competitor } => {
                return Err(RouteTableError::Conflict { ip: *ip, ours: rec.route.metric, competitor });
            }
        }
    }
    Ok(())
}

/// What the table says of one claim this node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimState {
    /// No other route to the address is as early: the address is the attachment's.
    Held,
    /// Another route to the address is as early or earlier: two pods may use it.
    Conflict {
        /// The earliest competing route.
        competitor: HostRoute,
    },
    /// The claim's route is gone from the table.
    RouteMissing,
    /// The record cannot be read: not a claim of this plugin's.
    Unreadable,
}

/// One record under the state directory, judged.
#[derive(Debug, Clone)]
pub struct Audited {
    /// The network (its directory).
    pub network: String,
    /// The address.
    pub ip: IpAddr,
    /// The record, when it can be read.
    pub record: Option<Record>,
    /// When the record was made.
    pub made: SystemTime,
    /// The verdict.
    pub state: ClaimState,
}

/// Re-runs the claim verdict on every claim under `routes.state_dir` (every network's): the reconciler's check
/// that nothing has come since the ADD, such as a claim another node made while this one could not see it.
pub async fn audit<T: Table>(table: &T, routes: &HostRoutes) -> Result<Vec<Audited>, RouteTableError> {
    let mut out = Vec::new();
    for network in Records::networks(&routes.state_dir)? {
        let records = Records::open(&routes.state_dir, &network)?;
        for listed in records.list()? {
            let state = match &listed.record {
                None => ClaimState::Unreadable,
                Some(rec) => {
                    let seen = table.host_routes(rec.route.table, host_net(listed.ip)).await?;
                    match claim::verdict(&rec.route, &seen) {
                        Verdict::Keep => ClaimState::Held,
                        Verdict::Withdraw { competitor } => ClaimState::Conflict { competitor },
                        Verdict::Lost => ClaimState::RouteMissing,
                    }
                }
            };
            out.push(Audited {
                network: network.clone(),
                ip: listed.ip,
                record: listed.record,
                made: listed.made,
                state,
            });
        }
    }
    Ok(out)
}

/// STATUS: the records can be written and the table read.
pub async fn status<T: Table>(table: &T, routes: &HostRoutes, network: &str) -> Result<(), RouteTableError> {
    Records::open(&routes.state_dir, network)?.list()?;
    table.host_routes(routes.table, "0.0.0.0/0".parse().expect("a CIDR")).await?;
    Ok(())
}

/// The Kubernetes mode's `announce_routes`: a host route (and its record) for each address an ADD assigned. On
/// failure, what it installed is removed again and the error returned (the caller releases the addresses).
pub async fn announce<T: Table>(
    table: &T,
    routes: &HostRoutes,
    network: &str,
    req: &Request,
    pod: &crate::config::PodRef,
    assigned: &[Assigned],
    nameservers: &[IpAddr],
) -> Result<(), RouteTableError> {
    let mut links = Vec::with_capacity(assigned.len());
    for a in assigned {
        let net = IpNet::new(a.ip, a.prefix_len).expect("an assigned prefix is valid").trunc();
        let link = table.link_for(routes.device.as_deref(), net).await?;
        reserved(table, routes, net, link, nameservers).await?.check(a.ip)?;
        links.push(link);
    }
    let records = Records::open(&routes.state_dir, network)?;
    let mut made = Vec::new();
    let outcome = async {
        for (a, link) in assigned.iter().zip(links) {
            // a record left by an earlier attachment of this address (a DEL that never came) is replaced
            for old in records.list()?.into_iter().filter(|l| l.ip == a.ip) {
                if let Some(rec) = old.record {
                    table.delete(&rec.route).await?;
                }
                records.remove(a.ip)?;
            }
            let route = new_route(routes, a.ip);
            let record = Record {
                container_id: req.container_id.clone(),
                ifname: req.ifname.clone(),
                pod: pod.to_string(),
                pod_uid: pod.uid.clone(),
                route,
            };
            records.create(a.ip, &record)?;
            made.push(route);
            table.add(&route, link).await?;
        }
        Ok(())
    }
    .await;
    if outcome.is_err() {
        withdraw(table, &records, made).await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;
    use crate::config::{Input, load_with_paths};
    use crate::routetable::{NetRoute, TableError};

    /// A node's table in memory; `add` fails for the addresses of `refuse` (a kernel that says no half-way).
    #[derive(Debug, Default)]
    struct FakeTable {
        routes: Mutex<Vec<HostRoute>>,
        refuse: Option<IpNet>,
        /// Routes of any prefix in table main.
        nets: Vec<NetRoute>,
        /// Deleting a route fails (a kernel that says no).
        stuck: bool,
    }

    impl Table for FakeTable {
        async fn routes_over(&self, table: u32, net: IpNet) -> Result<Vec<NetRoute>, TableError> {
            let over = |r: &&NetRoute| r.dst.contains(&net) || net.contains(&r.dst);
            Ok(if table == 254 { self.nets.iter().filter(over).copied().collect() } else { Vec::new() })
        }

        async fn host_routes(&self, table: u32, net: IpNet) -> Result<Vec<HostRoute>, TableError> {
            let routes = self.routes.lock().unwrap();
            Ok(routes.iter().filter(|r| r.table == table && net.contains(&r.dst)).copied().collect())
        }

        async fn add(&self, route: &HostRoute, _link: u32) -> Result<(), TableError> {
            if self.refuse.is_some_and(|n| n.contains(&route.dst)) {
                return Err(TableError::Netlink { op: "add a route", detail: "Operation not permitted".into() });
            }
            self.routes.lock().unwrap().push(*route);
            Ok(())
        }

        async fn delete(&self, route: &HostRoute) -> Result<(), TableError> {
            if self.stuck {
                return Err(TableError::Netlink { op: "delete a route", detail: "Operation not permitted".into() });
            }
            self.routes.lock().unwrap().retain(|r| r != route);
            Ok(())
        }

        async fn link_for(&self, _device: Option<&str>, _net: IpNet) -> Result<u32, TableError> {
            Ok(7)
        }
    }

    fn config(state: &std::path::Path) -> (IpamConfig, RouteTable) {
        config_with(state, "")
    }

    /// A routing-table config whose records go under `state` (the node's flat file says so), with `args`.
    fn config_with(state: &std::path::Path, args: &str) -> (IpamConfig, RouteTable) {
        let stdin = json!({"cniVersion": "1.0.0", "name": "net", "type": "macvlan", "ipam": {"type": "hereabouts",
            "datastore": "routetable", "range": "198.18.0.0/29", "ipRanges": [{"range": "2001:db8::/125"}],
            "propagation_timeout_ms": 0, "timeout_seconds": 2}})
        .to_string();
        let flat = state.join("flat.conf");
        std::fs::write(&flat, json!({"route_state_dir": state}).to_string()).unwrap();
        let cni_args = format!("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p{args}");
        let cfg = load_with_paths(&Input { stdin: stdin.as_bytes(), cni_args: &cni_args }, &[flat]).unwrap();
        let crate::config::Mode::RouteTable(mode) = &cfg.mode else { panic!("the routing table: {:?}", cfg.mode) };
        let mode = mode.clone();
        (cfg, mode)
    }

    fn req(c: &str) -> Request {
        Request { container_id: c.into(), ifname: "net1".into(), node: "n".into() }
    }

    #[tokio::test]
    async fn a_failure_half_way_rolls_back_what_the_add_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, mode) = config(dir.path());
        let table = FakeTable { refuse: Some("2001:db8::/125".parse().unwrap()), ..FakeTable::default() };
        let e = assign(&table, &cfg, &mode, &req("a"), &Budget::new(cfg.timeout), &[]).await.unwrap_err();
        assert!(e.to_string().contains("Operation not permitted"), "{e}");
        assert!(table.routes.lock().unwrap().is_empty(), "the IPv4 claim was withdrawn");
        assert!(Records::open(dir.path(), "net").unwrap().list().unwrap().is_empty(), "and its record removed");
    }

    #[tokio::test]
    async fn a_repeated_add_gets_what_the_attachment_holds_and_a_full_range_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, mode) = config(dir.path());
        let table = FakeTable::default();
        let budget = Budget::new(cfg.timeout);
        let first = assign(&table, &cfg, &mode, &req("a"), &budget, &[]).await.unwrap();
        assert_eq!(first.assigned.len(), 2);
        assert_eq!(assign(&table, &cfg, &mode, &req("a"), &budget, &[]).await.unwrap().assigned, first.assigned);
        for c in ["b", "c", "d", "e", "f"] {
            assign(&table, &cfg, &mode, &req(c), &budget, &[]).await.unwrap();
        }
        let before = table.routes.lock().unwrap().len();
        let e = assign(&table, &cfg, &mode, &req("g"), &budget, &[]).await.unwrap_err();
        assert!(matches!(e, RouteTableError::Exhausted { .. }), "{e}");
        assert_eq!(table.routes.lock().unwrap().len(), before, "nothing written");
        assert_eq!(release(&table, &mode.routes, "net", "a", "net1").await.unwrap(), 2);
        assert_eq!(table.routes.lock().unwrap().len(), before - 2);
    }

    fn host(ip: &str, table: u32, protocol: u8, metric: u32) -> HostRoute {
        HostRoute { dst: ip.parse().unwrap(), table, protocol, metric }
    }

    #[tokio::test]
    async fn addresses_the_host_sends_elsewhere_are_never_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let net = |dst: &str, link: Option<u32>, gw: Option<&str>| NetRoute {
            dst: dst.parse().unwrap(),
            protocol: 4,
            link,
            gateway: gw.map(|g| g.parse().unwrap()),
        };
        let table = FakeTable {
            nets: vec![
                // the range's own link (7, link_for's answer): where the host routes point anyway
                net("198.18.0.0/29", Some(7), None),
                // an aggregate the range is carved out of, through a gateway: what host routes are for
                net("198.16.0.0/12", Some(3), Some("10.0.0.1")),
                // as specific as the IPv6 range (/125), elsewhere: every address of it is reserved
                net("2001:db8::/125", Some(3), Some("fe80::1")),
            ],
            ..FakeTable::default()
        };
        // the node's own address, in the local table
        table.routes.lock().unwrap().push(host("198.18.0.1", LOCAL_TABLE, 2, 0));
        let (cfg, mode) = config(dir.path());
        let e = assign(&table, &cfg, &mode, &req("a"), &Budget::new(cfg.timeout), &[]).await.unwrap_err();
        assert_eq!(e.code(), crate::codes::Code::RangeExhausted, "{e}");

        // the IPv4 range alone: the node's address and its DNS server are passed over, the rest handed out
        let (mut cfg, mut mode) = config(dir.path());
        cfg.ranges.truncate(1);
        mode.claiming.propagation = Duration::ZERO;
        let dns: IpAddr = "198.18.0.2".parse().unwrap();
        let mut got = HashSet::new();
        for c in ["a", "b", "c", "d"] {
            let claimed = assign(&table, &cfg, &mode, &req(c), &Budget::new(cfg.timeout), &[dns]).await.unwrap();
            got.insert(claimed.assigned[0].ip);
        }
        let want: HashSet<IpAddr> =
            ["198.18.0.3", "198.18.0.4", "198.18.0.5", "198.18.0.6"].iter().map(|a| a.parse().unwrap()).collect();
        assert_eq!(got, want);

        // a requested one is refused with code 7 before anything is written
        let before = table.routes.lock().unwrap().len();
        let (mut cfg, _) = config_with(dir.path(), ";IP=198.18.0.1");
        cfg.ranges.truncate(1);
        let e = assign(&table, &cfg, &mode, &req("x"), &Budget::new(cfg.timeout), &[dns]).await.unwrap_err();
        assert_eq!(e.code(), crate::codes::Code::InvalidConfig);
        assert_eq!(
            e.to_string(),
            "198.18.0.1 may not be claimed on this node: it is an address of this node (local table)"
        );
        let (mut cfg, _) = config_with(dir.path(), ";IP=198.18.0.2");
        cfg.ranges.truncate(1);
        let e = assign(&table, &cfg, &mode, &req("x"), &Budget::new(cfg.timeout), &[dns]).await.unwrap_err();
        assert!(e.to_string().ends_with("a DNS server of this node (/etc/resolv.conf)"), "{e}");
        assert_eq!(table.routes.lock().unwrap().len(), before, "nothing written");

        // the metadata service, in a range that holds it; and a route as specific as the range, elsewhere
        let routes = &mode.routes;
        let meta = reserved(&table, routes, "169.254.169.0/24".parse().unwrap(), 7, &[]).await.unwrap();
        assert_eq!(meta.why("169.254.169.254".parse().unwrap()), Some("a cloud metadata service's address"));
        let six = reserved(&table, routes, "2001:db8::/125".parse().unwrap(), 7, &[]).await.unwrap();
        assert_eq!(
            six.why("2001:db8::3".parse().unwrap()),
            Some("sent via fe80::1 by route 2001:db8::/125 (table 254, proto 4)")
        );
    }

    #[tokio::test]
    async fn check_fails_on_an_earlier_claim_and_audit_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, mode) = config(dir.path());
        cfg.ranges.truncate(1);
        let table = FakeTable::default();
        let a = assign(&table, &cfg, &mode, &req("a"), &Budget::new(cfg.timeout), &[]).await.unwrap();
        let ip = a.assigned[0].ip;
        check(&table, &cfg, &mode.routes, &req("a")).await.unwrap();
        let audited = audit(&table, &mode.routes).await.unwrap();
        assert_eq!(
            audited.iter().map(|a| (a.network.as_str(), a.ip, a.state)).collect::<Vec<_>>(),
            [("net", ip, ClaimState::Held)]
        );
        assert_eq!(audited[0].record.as_ref().map(|r| r.pod.as_str()), Some("ns/p"));

        // another node's claim, learned with an earlier time (metric 1 + 1)
        let earlier = host(&ip.to_string(), 254, 12, 3);
        table.routes.lock().unwrap().push(earlier);
        let e = check(&table, &cfg, &mode.routes, &req("a")).await.unwrap_err();
        assert_eq!(e.code(), crate::codes::Code::AllocationMissing);
        assert!(e.to_string().contains("another claim as early as ours or earlier holds the address too"), "{e}");
        let audited = audit(&table, &mode.routes).await.unwrap();
        assert_eq!(audited[0].state, ClaimState::Conflict { competitor: earlier });

        let ours = audited[0].record.clone().unwrap().route;
        table.routes.lock().unwrap().retain(|r| *r != ours);
        assert_eq!(audit(&table, &mode.routes).await.unwrap()[0].state, ClaimState::RouteMissing);
    }

    #[tokio::test]
    async fn del_and_gc_leave_what_they_cannot_remove_and_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, mode) = config(dir.path());
        let mut table = FakeTable::default();
        assign(&table, &cfg, &mode, &req("a"), &Budget::new(cfg.timeout), &[]).await.unwrap();
        table.stuck = true;
        assert_eq!(release(&table, &mode.routes, "net", "a", "net1").await.unwrap(), 0);
        assert_eq!(table.routes.lock().unwrap().len(), 2, "the routes stay");
        let records = Records::open(&mode.routes.state_dir, "net").unwrap();
        assert_eq!(records.list().unwrap().len(), 2, "and so do their records, for the next try to find");
        assert_eq!(gc(&table, &mode.routes, "net", &[], Duration::ZERO).await.unwrap(), 0);
        table.stuck = false;
        assert_eq!(gc(&table, &mode.routes, "net", &[], Duration::ZERO).await.unwrap(), 2);
        assert!(table.routes.lock().unwrap().is_empty());
    }

    #[test]
    fn nameservers_are_read_from_resolv_conf() {
        let conf = "# generated\nsearch example.org\nnameserver 10.96.0.10\nnameserver fe80::1%eth0\nnameserver bogus\n  nameserver 2001:db8::53 # x\n";
        let got = crate::routetable::nameservers(conf);
        let want: Vec<IpAddr> = ["10.96.0.10", "fe80::1", "2001:db8::53"].iter().map(|a| a.parse().unwrap()).collect();
        assert_eq!(got, want);
    }
}
