//! The warm reserve's rounds (`warm_addresses`, in W1s and the large burst): each node's agent answers ADDs from
//! addresses it claimed in advance, after a local journal fsync, and hands entry and reservation over to the pod in
//! the background.
//!
//! Before the timed burst, one ADD per node (its pod stays: it is one of the round's live pods) starts that node's
//! reserve, and the round waits until every reserve is full. The burst is then timed exactly as the other variants'.
//! After it, the harness reads the pools until every burst pod's entry and reservation carries its podref (the
//! hand-over is done) and every reserve is full again (the refill is done), and counts what the agents logged.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_tests::Identity;
use kube::Client;
use kube::api::{Api, ListParams};

use super::Bench;
use super::agents::{Agents, Warm};
use crate::invoke::{self, Limits, Op, OpResult, Round};
use crate::k8s::{parse_cidr, retry};
use crate::metrics::{self, delta};
use crate::results::{RoundResult, WarmFigures, summarise};

/// How often the harness reads the pools while it waits.
const POLL: Duration = Duration::from_millis(100);

/// Where the agents' warm journals go (a directory per round): on this machine's disk, as a node's journal is on
/// its own. Not in the control plane's state directory, which may be a tmpfs (/dev/shm), where the fsync every take
/// makes before its ADD answers would cost nothing.
const JOURNALS: &str = "/var/tmp/hereabouts-bench-warm";

/// The agents' lines the bench counts (`hereabouts_ipam::verbs` and `hereabouts_ipam::warm`).
const SERVED: &str = "ADD done from the warm reserve";
const TOOK: &str = "took a warm slot";
const HANDED: &str = "warm hand-over";

/// How long the agents' logs may lag the hand-over the API server shows.
const LOGGED_WITHIN: Duration = Duration::from_secs(5);
const REFUSED: &str = "warm reserve refused";
/// `hereabouts_reconciler::agent`'s line for each invocation it did: an ADD that succeeded.
const SERVED_ADD: [&str; 3] = ["served", "command=ADD", "ok=true"];
const NODE_MISSING: &str = "the Node is missing";

/// What a warm round runs.
#[derive(Debug, Clone, Copy)]
pub struct WarmBurst<'a> {
    /// The workload, for the notes.
    pub what: &'a str,
    pub round: usize,
    pub nodes: &'a [String],
    /// `warm_addresses`: the reserve per node.
    pub warm: usize,
    /// The timed ADDs, and how many are under way at once.
    pub ops: &'a [Op],
    pub parallel: usize,
}

impl Bench {
    /// One warm round: agents keeping `b.warm` addresses per node, their reserves started and full, then `b.ops`
    /// timed as the other variants' bursts are; then the hand-over and the refill.
    pub async fn warm_burst(&self, r: &mut Round, b: WarmBurst<'_>) -> anyhow::Result<RoundResult> {
        let WarmBurst { what, nodes, .. } = b;
        if let Some(why) = whereabouts_reconciler(&self.admin).await? {
            bail!("{what}: the warm variant cannot run here: {why}; the agents would refuse the reserve");
        }
        // an agent takes from its reserve only while its Node exists
        self.ensure_nodes(nodes).await?;
        let identity = self.cluster.kubeconfig(Identity::Admin, &r.ns);
        let journals = Path::new(JOURNALS).join(&r.ns);
        std::fs::create_dir_all(&journals).with_context(|| format!("create {}", journals.display()))?;
        self.note(format!(
            "the warm agents' journals, and their logs once they stop, are in {JOURNALS}/<namespace> ({}): every take \
             fsyncs there before its ADD answers",
            filesystem(&journals).unwrap_or_else(|| "file system unknown".into())
        ));
        let warm_agents = Warm { identity: &identity, journals: &journals };
        let agents = Agents::start(
            &self.cluster.dir().join(format!("agents-{}", r.ns)),
            nodes,
            &self.cluster.kubeconfig(hereabouts_tests::Identity::Admin, &r.ns),
            None,
            Some(warm_agents),
        )
        .await?;
        r.agents = Some(agents.dir.clone());
        let res = self.warm_in(r, &agents, b).await;
        let logs = journals.display().to_string();
        if let Some(mib) = agents.stop() {
            self.note(format!(
                "{what}: the warm agents' peak resident memory, the largest of {}: {mib:.1} MiB",
                nodes.len()
            ));
        }
        res.with_context(|| format!("{what}, warm reserve (the agents' logs are in {logs}/)"))
    }

    async fn warm_in(&self, r: &Round, agents: &Agents, b: WarmBurst<'_>) -> anyhow::Result<RoundResult> {
        let WarmBurst { nodes, warm, ops, parallel, .. } = b;
        let (first, fill_s, fill_requests) = self.first_fill(r, agents, b).await?;
        // from here on, only what the agents log during and after the burst counts
        let offsets: Vec<u64> = nodes.iter().map(|n| std::fs::metadata(agents.log(n)).map_or(0, |m| m.len())).collect();
        let before = self.snapshot().await;
        let limits = self.limits();
        let cpu = crate::cpu::sample(&agents.pids());
        let outs = invoke::parallel(r, ops, parallel, limits).await;
        let spent = cpu.until(&crate::cpu::sample(&agents.pids()));
        let wall = limits.t0.elapsed().as_secs_f64();
        self.note(spent.line(&format!("{} warm", b.what), ops.len()));
        let after = self.snapshot().await;
        let mut res = summarise(&outs, wall, delta(&before, &after));
        let mut figures = self.after_burst(r, b, &outs, limits, wall, &before).await?;
        // an agent logs its hand-over round once the round's journal records are written, a little after the API
        // server shows its writes
        let logged_by = Instant::now() + LOGGED_WITHIN;
        let mut lines = Lines::read(agents, nodes, &offsets);
        while lines.handed < lines.takes && Instant::now() < logged_by {
            tokio::time::sleep(POLL).await;
            lines = Lines::read(agents, nodes, &offsets);
        }
        if let Some(line) = lines.refused.as_ref().or(lines.node_missing.as_ref()) {
            self.note(format!("a warm agent did not use its reserve during the round: {line}"));
        }
        let ok = outs.iter().filter(|o| o.ip.is_some()).count() as u64;
        figures.served = lines.served;
        figures.own = ok.saturating_sub(lines.served);
        figures.by_binary = ok.saturating_sub(lines.agent_adds);
        figures.takes = lines.takes;
        figures.rounds = lines.rounds;
        figures.handed = lines.handed;
        figures.fill_s = fill_s;
        figures.fill_requests = fill_requests;
        figures.fill_slots = nodes.len() * warm;
        // the first ADDs' pods are live too: their entries are checked with the burst's
        let all: Vec<OpResult> = first.into_iter().chain(outs).collect();
        crate::verify::verify(&self.admin, r, &all, &mut res, false).await?;
        res.warm = Some(figures);
        Ok(res)
    }

    /// One ADD per node (its pod stays), then waits until every node's reserve holds `b.warm` addresses; returns
    /// the first ADDs, the time from their start until the reserves were full, and the requests counted meanwhile.
    async fn first_fill(
        &self,
        r: &Round,
        agents: &Agents,
        b: WarmBurst<'_>,
    ) -> anyhow::Result<(Vec<OpResult>, f64, f64)> {
        let WarmBurst { round, nodes, warm, .. } = b;
        let ops: Vec<Op> = nodes.iter().map(|n| Op::add(format!("r{round}-first-{n}"), n.clone())).collect();
        let polls = Polls::default();
        let before = self.snapshot().await;
        let limits = self.limits();
        let first = invoke::parallel(r, &ops, ops.len(), limits).await;
        if let Some(failed) = first.iter().find(|o| o.ip.is_none()) {
            bail!(
                "the first ADD {} failed: {}\n{}",
                failed.pod,
                failed.error.as_deref().unwrap_or("no address"),
                failed.sample.as_deref().unwrap_or("")
            );
        }
        let live = podrefs(&r.ns, &first);
        let deadline = Instant::now() + self.round_timeout;
        loop {
            let lines = Lines::read(agents, nodes, &vec![0; nodes.len()]);
            if let Some(line) = lines.refused.or(lines.node_missing) {
                bail!("an agent does not use its warm reserve: {line}");
            }
            let seen = look(&self.admin, &r.ns, &live, &polls).await?;
            if nodes.iter().all(|n| seen.reserve(n) >= warm) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "the warm reserves were not full within {} s: {:?} of {warm} each",
                    self.round_timeout.as_secs(),
                    seen.reserves
                );
            }
            tokio::time::sleep(POLL).await;
        }
        let fill_s = limits.t0.elapsed().as_secs_f64();
        let mut counted = delta(&before, &self.snapshot().await);
        polls.take_out(&mut counted);
        Ok((first, fill_s, metrics::sum(&counted, "req ")))
    }

    /// After the burst: reads the pools until every burst pod's entry and reservation is its own and every reserve
    /// is full again (or the round's time is up), and counts the requests from the burst's start until the first.
    async fn after_burst(
        &self,
        r: &Round,
        b: WarmBurst<'_>,
        outs: &[OpResult],
        limits: Limits,
        wall: f64,
        before: &BTreeMap<String, f64>,
    ) -> anyhow::Result<WarmFigures> {
        let WarmBurst { nodes, warm, .. } = b;
        let live = podrefs(&r.ns, outs);
        // the harness read nothing during the burst: its reads from here on are the only ones to take out
        let polls = Polls::default();
        let deadline = Instant::now() + self.round_timeout;
        let mut figures = WarmFigures { warm, ..Default::default() };
        let mut counted = None;
        loop {
            let seen = look(&self.admin, &r.ns, &live, &polls).await?;
            let since_end = limits.t0.elapsed().as_secs_f64() - wall;
            if counted.is_none() && seen.pending == 0 {
                figures.handed_after = Some(since_end);
                let mut window = delta(before, &self.snapshot().await);
                polls.take_out(&mut window);
                counted = Some(window);
            }
            if figures.refilled_after.is_none() && nodes.iter().all(|n| seen.reserve(n) >= warm) {
                figures.refilled_after = Some(since_end);
            }
            if counted.is_some() && figures.refilled_after.is_some() {
                break;
            }
            if Instant::now() > deadline {
                self.note(format!(
                    "warm round {}: after {} s, {} burst pods' entries or reservations not handed over, reserves {:?} \
                     of {warm} each",
                    r.ns,
                    self.round_timeout.as_secs(),
                    seen.pending,
                    seen.reserves
                ));
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        figures.handover = match counted {
            Some(window) => window,
            None => {
                let mut window = delta(before, &self.snapshot().await);
                polls.take_out(&mut window);
                window
            }
        };
        Ok(figures)
    }
}

/// `namespace/pod` of each address the ADDs of `outs` were given.
fn podrefs(ns: &str, outs: &[OpResult]) -> HashMap<Ipv4Addr, String> {
    outs.iter().filter_map(|o| Some((o.ip?, format!("{ns}/{}", o.pod)))).collect()
}

/// The harness's own reads while it waits (every attempt), to take out of the API server's counters.
#[derive(Debug, Default)]
struct Polls {
    pools: AtomicU64,
    reservations: AtomicU64,
}

impl Polls {
    /// Keeps the request counts of `counters` (`req VERB resource`) with the harness's reads taken out; their bytes
    /// and server time cannot be, so they go.
    fn take_out(&self, counters: &mut BTreeMap<String, f64>) {
        for (key, n) in
            [("req LIST ippools", &self.pools), ("req LIST overlappingrangeipreservations", &self.reservations)]
        {
            if let Some(v) = counters.get_mut(key) {
                *v -= n.load(Ordering::Relaxed) as f64;
            }
        }
        counters.retain(|k, v| k.starts_with("req ") && *v > 0.0);
    }
}

/// What the namespace's objects say of a warm round.
#[derive(Debug)]
struct Look {
    /// Per node, its warm entries that are no live pod's address: the reserve proper (a taken slot keeps the
    /// node's podref until its hand-over).
    reserves: BTreeMap<String, usize>,
    /// Live pods whose entry or reservation does not carry their podref yet.
    pending: usize,
}

impl Look {
    fn reserve(&self, node: &str) -> usize {
        self.reserves.get(node).copied().unwrap_or(0)
    }
}

/// Reads the round's pools and reservations: the reserves, and which of `live` (address → podref) wait for their
/// hand-over.
async fn look(admin: &Client, ns: &str, live: &HashMap<Ipv4Addr, String>, polls: &Polls) -> anyhow::Result<Look> {
    let lp = ListParams::default();
    let pool_api = Api::<IpPool>::namespaced(admin.clone(), ns);
    let rsv_api = Api::<OverlappingRangeIpReservation>::namespaced(admin.clone(), ns);
    let pools = retry(|| {
        polls.pools.fetch_add(1, Ordering::Relaxed);
        pool_api.list(&lp)
    })
    .await?
    .items;
    let reservations: HashMap<String, String> = retry(|| {
        polls.reservations.fetch_add(1, Ordering::Relaxed);
        rsv_api.list(&lp)
    })
    .await?
    .items
    .into_iter()
    .map(|r| (r.metadata.name.unwrap_or_default(), r.spec.podref))
    .collect();
    let mut holder: HashMap<Ipv4Addr, &str> = HashMap::new();
    let mut reserves: BTreeMap<String, usize> = BTreeMap::new();
    for pool in &pools {
        let Ok((net, _)) = parse_cidr(&pool.spec.range) else { continue };
        for (off, entry) in &pool.spec.allocations {
            let ip = Ipv4Addr::from(u32::from(net).wrapping_add(off.parse::<u32>().unwrap_or(0)));
            holder.insert(ip, &entry.podref);
            if let Some(node) = hereabouts_ipam::warm::node_of(&entry.podref)
                && !live.contains_key(&ip)
            {
                *reserves.entry(node.to_string()).or_default() += 1;
            }
        }
    }
    let pending = live
        .iter()
        .filter(|(ip, podref)| {
            let reservation = hereabouts_ipam::names::reservation_name("", IpAddr::V4(**ip));
            holder.get(ip) != Some(&podref.as_str()) || reservations.get(&reservation) != Some(*podref)
        })
        .count();
    Ok(Look { reserves, pending })
}

/// What the agents logged from the given offsets on.
#[derive(Debug, Default)]
struct Lines {
    served: u64,
    takes: u64,
    rounds: u64,
    handed: u64,
    /// ADDs the agents did (the rest, their binaries did themselves).
    agent_adds: u64,
    refused: Option<String>,
    node_missing: Option<String>,
}

impl Lines {
    fn read(agents: &Agents, nodes: &[String], offsets: &[u64]) -> Self {
        let mut lines = Lines::default();
        for (node, &offset) in nodes.iter().zip(offsets) {
            let bytes = std::fs::read(agents.log(node)).unwrap_or_default();
            let text = String::from_utf8_lossy(bytes.get(offset as usize..).unwrap_or_default());
            for line in text.lines() {
                if line.contains(SERVED) {
                    lines.served += 1;
                } else if line.contains(TOOK) {
                    lines.takes += 1;
                } else if line.contains(HANDED) {
                    lines.rounds += 1;
                    lines.handed += field(line, "handed").unwrap_or(0);
                } else if SERVED_ADD.iter().all(|w| line.contains(w)) {
                    lines.agent_adds += 1;
                } else if line.contains(REFUSED) && lines.refused.is_none() {
                    lines.refused = Some(format!("{node}: {}", line.trim()));
                } else if line.contains(NODE_MISSING) && lines.node_missing.is_none() {
                    lines.node_missing = Some(format!("{node}: {}", line.trim()));
                }
            }
        }
        lines
    }
}

/// The number after `name=` in a log line.
fn field(line: &str, name: &str) -> Option<u64> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// What names Whereabouts' reconciler in the cluster, as the agents' own check reads it (the same function): where
/// one runs, they refuse the reserve.
async fn whereabouts_reconciler(admin: &Client) -> anyhow::Result<Option<String>> {
    // the listing's own failure names what failed; the retries are the harness's
    let found = retry(|| async { hereabouts_ipam::warm::whereabouts_reconciler(admin).await.map_err(|(_, e)| e) });
    found.await.context("list DaemonSets and CronJobs")
}

/// The type of the file system `path` is on, and its device, from the longest mount point above it.
fn filesystem(path: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let path = path.canonicalize().ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (device, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            path.starts_with(point).then(|| (point.len(), format!("{kind} on {device}")))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, what)| what)
}

#[cfg(test)]
mod tests {
    use super::field;

    #[test]
    fn reads_a_hand_over_lines_fields() {
        let line =
            "2026-12-05T23:40:01.123Z  INFO hereabouts_ipam::warm::reserve: warm hand-over takes=12 handed=11 ms=40";
        assert_eq!(field(line, "takes"), Some(12));
        assert_eq!(field(line, "handed"), Some(11));
        assert_eq!(field(line, "ms"), Some(40));
        assert_eq!(field(line, "slots"), None);
    }
}
