//! The use cases of the routing-table datastore, and the Kubernetes mode's announcement, over a [`Table`].

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use ipnet::IpNet;

use super::claim::{self, HostRoute, Verdict};
use super::records::{Record, Records};
use super::{RouteTableError, Table};
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

/// How often one range is tried again at once after losing a race on this node.
const LOCAL_TRIES: u32 = 8;

/// One range's state during an ADD.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Free,
    Pending(HostRoute),
    Held(HostRoute),
}

/// ADD with the routing-table datastore: one address per range, claimed as the module documentation says.
pub async fn assign<T: Table>(
    table: &T,
    cfg: &IpamConfig,
    mode: &RouteTable,
    req: &Request,
    budget: &Budget,
) -> Result<Claimed, RouteTableError> {
    let routes = &mode.routes;
    let records = Records::open(&routes.state_dir, &cfg.name)?;
    let pod = cfg.pod.to_string();
    let mut links = Vec::with_capacity(cfg.ranges.len());
    for r in &cfg.ranges {
        links.push(table.link_for(routes.device.as_deref(), r.cidr()).await?);
    }
    // a runtime that repeats an ADD gets what the attachment holds already
    let mut slots = vec![Slot::Free; cfg.ranges.len()];
    for (ip, rec) in records.of(&req.container_id, &req.ifname)? {
        if let Some(i) = cfg.ranges.iter().position(|r| r.cidr().contains(&ip)) {
            slots[i] = Slot::Held(rec.route);
        }
    }
    let outcome = claim_all(table, cfg, mode, &records, &links, &mut slots, req, &pod, budget).await;
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
                        claim::pick(range, claiming.exclude_first, claiming.exclude_last, &taken, random)
                            .ok_or(RouteTableError::Exhausted { range: range.cidr() })?
                    }
                };
                let route = new_route(routes, ip);
                let record = Record {
                    container_id: req.container_id.clone(),
                    ifname: req.ifname.clone(),
                    pod: pod.to_string(),
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

/// DEL: removes the routes and records of one attachment; returns how many.
pub async fn release<T: Table>(
    table: &T,
    routes: &HostRoutes,
    network: &str,
    container_id: &str,
    ifname: &str,
) -> Result<usize, RouteTableError> {
    let records = Records::open(&routes.state_dir, network)?;
    let held = records.of(container_id, ifname)?;
    for (ip, rec) in &held {
        table.delete(&rec.route).await?;
        records.remove(*ip)?;
    }
    Ok(held.len())
}

/// GC: removes the routes and records of attachments not in `valid`, except those younger than `settle` (an ADD
/// under way has made its record before the runtime lists its attachment). Returns how many.
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
        if let Some(rec) = &listed.record {
            table.delete(&rec.route).await?;
        }
        records.remove(listed.ip)?;
        released += 1;
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
        if !seen.contains(&rec.route) {
            return Err(RouteTableError::Missing(format!(
                "the host route of {ip} (table {}, proto {}) is gone: the routing daemons no longer advertise it",
                rec.route.table, rec.route.protocol
            )));
        }
    }
    Ok(())
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
    pod: &str,
    assigned: &[Assigned],
) -> Result<(), RouteTableError> {
    let records = Records::open(&routes.state_dir, network)?;
    let mut made = Vec::new();
    let outcome = async {
        for a in assigned {
            let net = IpNet::new(a.ip, a.prefix_len).expect("an assigned prefix is valid").trunc();
            let link = table.link_for(routes.device.as_deref(), net).await?;
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
    use crate::routetable::TableError;

    /// A node's table in memory; `add` fails for the addresses of `refuse` (a kernel that says no half-way).
    #[derive(Debug, Default)]
    struct FakeTable {
        routes: Mutex<Vec<HostRoute>>,
        refuse: Option<IpNet>,
    }

    impl Table for FakeTable {
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
            self.routes.lock().unwrap().retain(|r| r != route);
            Ok(())
        }

        async fn link_for(&self, _device: Option<&str>, _net: IpNet) -> Result<u32, TableError> {
            Ok(7)
        }
    }

    fn config(state: &std::path::Path) -> (IpamConfig, RouteTable) {
        let stdin = json!({"cniVersion": "1.0.0", "name": "net", "type": "macvlan", "ipam": {"type": "hereabouts",
            "datastore": "routetable", "range": "198.18.0.0/29", "ipRanges": [{"range": "2001:db8::/125"}],
            "route_state_dir": state, "propagation_timeout_ms": 0, "timeout_seconds": 2}})
        .to_string();
        let cfg =
            load_with_paths(&Input { stdin: stdin.as_bytes(), cni_args: "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p" }, &[])
                .unwrap();
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
        let e = assign(&table, &cfg, &mode, &req("a"), &Budget::new(cfg.timeout)).await.unwrap_err();
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
        let first = assign(&table, &cfg, &mode, &req("a"), &budget).await.unwrap();
        assert_eq!(first.assigned.len(), 2);
        assert_eq!(assign(&table, &cfg, &mode, &req("a"), &budget).await.unwrap().assigned, first.assigned);
        for c in ["b", "c", "d", "e", "f"] {
            assign(&table, &cfg, &mode, &req(c), &budget).await.unwrap();
        }
        let before = table.routes.lock().unwrap().len();
        let e = assign(&table, &cfg, &mode, &req("g"), &budget).await.unwrap_err();
        assert!(matches!(e, RouteTableError::Exhausted { .. }), "{e}");
        assert_eq!(table.routes.lock().unwrap().len(), before, "nothing written");
        assert_eq!(release(&table, &mode.routes, "net", "a", "net1").await.unwrap(), 2);
        assert_eq!(table.routes.lock().unwrap().len(), before - 2);
    }
}
