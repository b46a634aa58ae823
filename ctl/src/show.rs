//! `ipam show`: per pool, its capacity and what is allocated and free; `--ip`: who holds one address.

use std::net::IpAddr;

use anyhow::Context as _;
use hereabouts_ipam::claim::{pool_scope, reservation_of};
use hereabouts_ipam::cooldown;
use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_ipam::store::capacity;
use kube::Api;
use serde::Serialize;

use crate::KubeFlags;
use crate::output::Format;

#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    /// Who holds this address, in every pool whose range has it.
    #[arg(long)]
    ip: Option<IpAddr>,
    /// `table`, `json` or `yaml`.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: Format,
    /// The pools of every namespace (a NAMESPACE column), not only hereabouts' own.
    #[arg(short = 'A', long, conflicts_with = "ip")]
    all_namespaces: bool,
}

/// One pool's numbers.
#[derive(Debug, Serialize)]
pub struct PoolRow {
    pub namespace: String,
    pub pool: String,
    pub range: String,
    pub network: String,
    /// The node a node-warm pool is bound to (IaaS provider mode).
    pub node: Option<String>,
    pub capacity: String,
    pub allocated: usize,
    pub free: String,
}

/// One address as a pool has it.
#[derive(Debug, Serialize)]
pub struct Holding {
    pub ip: IpAddr,
    pub pool: String,
    /// `None`: free in this pool.
    pub podref: Option<String>,
    pub container_id: Option<String>,
    pub ifname: Option<String>,
    pub node: Option<String>,
    /// When the ADD took it (RFC 3339), for entries hereabouts wrote.
    pub since: Option<String>,
    /// The OverlappingRangeIPReservation of the address, if any: `namespace/name` of its pod.
    pub reservation: Option<String>,
    /// The StatefulSet a sticky entry records.
    pub statefulset: Option<String>,
    /// The IPAMClaim an entry of a VM's persistent address records.
    pub ipamclaim: Option<String>,
    /// For a free address released within the pool's reuse cooldown: when it may be handed out again.
    pub cooling_until: Option<String>,
}

pub async fn run(flags: &KubeFlags, args: &ShowArgs) -> anyhow::Result<bool> {
    let (client, namespace) = crate::client::connect(flags).await?;
    if args.all_namespaces {
        let mut rows = Vec::new();
        for (_, pools) in crate::client::pools_by_namespace(&client).await? {
            rows.extend(pools.iter().map(row));
        }
        if args.output.structured() {
            args.output.emit(&rows)?;
        } else if rows.is_empty() {
            eprintln!("no IPPools in any namespace");
        } else {
            print_rows(&rows, true);
        }
        return Ok(true);
    }
    let mut all = crate::client::pools_of(&client, &namespace).await?;
    all.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let Some(ip) = args.ip else {
        let rows: Vec<PoolRow> = all.iter().map(row).collect();
        if args.output.structured() {
            args.output.emit(&rows)?;
        } else if rows.is_empty() {
            eprintln!("{}", crate::client::no_pools_hint(&namespace));
        } else {
            print_rows(&rows, false);
        }
        return Ok(true);
    };
    let reservations: Api<OverlappingRangeIpReservation> = Api::namespaced(client, &namespace);
    let mut found = Vec::new();
    for pool in &all {
        let Some((range, _)) = pool_scope(pool) else { continue };
        let Some(offset) = range.offset_of(ip) else { continue };
        let entry = pool.spec.allocations.get(&offset.to_string());
        let reservation = match reservation_of(pool, offset) {
            Some(name) => reservations.get_opt(&name).await.with_context(|| format!("get reservation {name}"))?,
            None => None,
        };
        found.push(Holding {
            ip,
            pool: pool.metadata.name.clone().unwrap_or_default(),
            podref: entry.map(|e| e.podref.clone()),
            container_id: entry.map(|e| e.id.clone()),
            ifname: entry.map(|e| e.ifname.clone()).filter(|i| !i.is_empty()),
            node: entry.and_then(|e| e.node.clone()),
            since: entry.and_then(|e| e.allocated.clone()),
            reservation: reservation.map(|r| r.spec.podref),
            statefulset: entry.and_then(|e| e.statefulset.clone()),
            ipamclaim: entry.and_then(|e| e.ipamclaim.clone()),
            cooling_until: match entry {
                Some(_) => None,
                None => cooldown::cooling(pool, hereabouts_ipam::clock::now()).get(&offset).map(ToString::to_string),
            },
        });
    }
    if args.output.structured() {
        args.output.emit(&found)?;
    } else if found.is_empty() {
        println!("{ip}: in no pool of namespace {namespace}");
    } else {
        for h in &found {
            println!("{}", describe(h));
        }
    }
    Ok(true)
}

fn row(pool: &IpPool) -> PoolRow {
    let cap = capacity(pool);
    let allocated = pool.spec.allocations.len();
    let network = pool_scope(pool).map(|(_, n)| n).unwrap_or_default();
    PoolRow {
        namespace: pool.metadata.namespace.clone().unwrap_or_default(),
        pool: pool.metadata.name.clone().unwrap_or_default(),
        range: pool.spec.range.clone(),
        network,
        node: pool.spec.node_name.clone(),
        // u128 does not fit a JSON number for the largest IPv6 ranges
        capacity: cap.to_string(),
        allocated,
        free: cap.saturating_sub(allocated as u128).to_string(),
    }
}

fn print_rows(rows: &[PoolRow], with_namespace: bool) {
    let header = ["NAMESPACE", "POOL", "RANGE", "NETWORK", "NODE", "CAPACITY", "ALLOCATED", "FREE"];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.namespace.clone(),
                r.pool.clone(),
                r.range.clone(),
                if r.network.is_empty() { "-".into() } else { r.network.clone() },
                r.node.clone().unwrap_or_else(|| "-".into()),
                r.capacity.clone(),
                r.allocated.to_string(),
                r.free.clone(),
            ]
        })
        .collect();
    let shown: Vec<usize> = (usize::from(!with_namespace)..header.len()).collect();
    let width = |i: usize| cells.iter().map(|c| c[i].len()).chain([header[i].len()]).max().unwrap_or(0);
    let line = |cols: &[&str]| {
        let padded: Vec<String> = shown.iter().map(|&i| format!("{:<w$}", cols[i], w = width(i))).collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(&header);
    for c in &cells {
        line(&c.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

fn describe(h: &Holding) -> String {
    let Some(podref) = &h.podref else {
        return match &h.cooling_until {
            Some(until) => format!("{} is free in pool {}, cooling until {until} (reuse cooldown)", h.ip, h.pool),
            None => format!("{} is free in pool {}", h.ip, h.pool),
        };
    };
    let mut s = format!("{} is held by {podref} in pool {}", h.ip, h.pool);
    if let Some(c) = &h.container_id {
        s.push_str(&format!(", container {c}"));
    }
    if let Some(i) = &h.ifname {
        s.push_str(&format!(", interface {i}"));
    }
    if let Some(n) = &h.node {
        s.push_str(&format!(", on node {n}"));
    }
    if let Some(t) = &h.since {
        s.push_str(&format!(", since {t}"));
    }
    if let Some(set) = &h.statefulset {
        s.push_str(&format!(", sticky for StatefulSet {set}"));
    }
    if let Some(claim) = &h.ipamclaim {
        s.push_str(&format!(", IPAMClaim {claim}'s"));
    }
    match &h.reservation {
        Some(r) if r == podref => s.push_str("; reserved cluster-wide"),
        Some(r) => s.push_str(&format!("; its reservation names {r}")),
        None => s.push_str("; no reservation"),
    }
    s
}
