//! `bench`: hereabouts against upstream Whereabouts (v0.9.2, built by `hack/testenv.sh`), side by side on one real
//! kube-apiserver and etcd. Both compiled CNI binaries run as processes exactly as a container runtime runs them
//! (CNI_* in the environment, the network config on stdin), with the same kubeconfig identity (admin: Whereabouts
//! needs Lease rights), the same ranges and the same CRD schema (Whereabouts' own, installed for the whole run).
//! Run it with `make bench`; `--quick` is a short smoke run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::StreamExt as _;
use hereabouts_ipam::crd::{IpAllocation, IpPool, IpPoolSpec, OverlappingRangeIpReservation};
use hereabouts_tests::{Identity, TestCluster, testenv};
use kube::Client;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

/// hereabouts vs Whereabouts: burst, churn, growth, no-overlap burst and start-up.
#[derive(Parser, Debug)]
struct Args {
    /// Rounds per workload and plugin (run alternately: hereabouts, Whereabouts, hereabouts, ...).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A short smoke run: 1 round, smaller workloads.
    #[arg(long)]
    quick: bool,
    /// The hereabouts binary (default: target/release/hereabouts).
    #[arg(long)]
    hereabouts: Option<PathBuf>,
    /// Wall-time cap of one round (either plugin), in seconds; what has not finished by then is a failure.
    #[arg(long, default_value_t = 420)]
    round_timeout: u64,
    /// Time after which one invocation is killed and counted as failed, in seconds.
    #[arg(long, default_value_t = 150)]
    op_timeout: u64,
    /// Also write the API server's metric lines that mention the Whereabouts group to results/metrics-sample.txt.
    #[arg(long)]
    dump_metrics: bool,
    /// Only these workloads (comma-separated of w1,w2,w3,w4,startup).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Plugin {
    Hereabouts,
    Whereabouts,
}

impl Plugin {
    const BOTH: [Plugin; 2] = [Plugin::Hereabouts, Plugin::Whereabouts];

    fn name(self) -> &'static str {
        match self {
            Plugin::Hereabouts => "hereabouts",
            Plugin::Whereabouts => "whereabouts",
        }
    }
}

/// Sizes of the workloads (full or `--quick`).
#[derive(Debug, Clone)]
struct Sizes {
    burst_adds: usize,
    burst_parallel: usize,
    nodes: usize,
    churn_ops: usize,
    churn_parallel: usize,
    churn_live: usize,
    growth_levels: Vec<usize>,
    growth_adds: usize,
}

struct Bench {
    cluster: &'static TestCluster,
    admin: Client,
    programs: HashMap<Plugin, PathBuf>,
    round_timeout: Duration,
    op_timeout: Duration,
    sizes: Sizes,
}

/// One round's namespace and network config.
#[derive(Debug)]
struct Round {
    ns: String,
    config: String,
    program: PathBuf,
}

#[derive(Debug, Clone)]
struct Op {
    command: &'static str,
    pod: String,
    node: String,
}

#[derive(Debug, Clone)]
struct OpResult {
    command: &'static str,
    pod: String,
    start: Duration,
    end: Duration,
    ip: Option<Ipv4Addr>,
    error: Option<String>,
    sample: Option<String>,
}

impl OpResult {
    fn ms(&self) -> f64 {
        (self.end - self.start).as_secs_f64() * 1000.0
    }
}

/// What one round measured and verified.
#[derive(Debug, Default, Clone)]
struct RoundResult {
    wall: f64,
    ops: usize,
    adds: usize,
    lat_all: Vec<f64>,
    lat_add: Vec<f64>,
    failures: BTreeMap<String, u64>,
    samples: BTreeMap<String, String>,
    requests: BTreeMap<String, f64>,
    /// Addresses handed out twice according to the results.
    dup_results: u64,
    /// Results the pool objects contradict (an address recorded for another pod, a reservation for another pod).
    pool_conflicts: u64,
    /// Pool entries plus reservations left after the round (W2: after the final DELs).
    left: u64,
    /// Pool entries not held by any successful ADD of the round (W1, W4: leaks of failed ADDs).
    orphans: u64,
    /// W3: the harness's own GET and PATCH of the pool, ms.
    server_ms: Option<(f64, f64)>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let root = testenv::repo_root();
    let hereabouts = args.hereabouts.clone().unwrap_or_else(|| root.join("target/release/hereabouts"));
    let whereabouts = testenv::bin_dir().join("whereabouts");
    for p in [&hereabouts, &whereabouts] {
        if !p.is_file() {
            bail!("{} is missing: run `make bench` (it builds it and runs hack/testenv.sh)", p.display());
        }
    }
    let rounds = if args.quick { 1 } else { args.rounds.max(1) };
    let sizes = if args.quick {
        Sizes {
            burst_adds: 64,
            burst_parallel: 32,
            nodes: 8,
            churn_ops: 200,
            churn_parallel: 16,
            churn_live: 60,
            growth_levels: vec![0, 5000],
            growth_adds: 5,
        }
    } else {
        Sizes {
            burst_adds: 200,
            burst_parallel: 32,
            nodes: 8,
            churn_ops: 1000,
            churn_parallel: 16,
            churn_live: 300,
            growth_levels: vec![0, 1000, 5000, 10000],
            growth_adds: 20,
        }
    };
    let want = |w: &str| args.only.is_empty() || args.only.iter().any(|o| o.eq_ignore_ascii_case(w));

    let machine = machine();
    eprintln!("bench: machine: {machine}");
    let cluster = TestCluster::get();
    let admin = cluster.admin().await;
    let crds = testenv::bin_dir().join("whereabouts-crds");
    cluster.replace_crds(&crds).await.context("install Whereabouts' CRDs")?;
    // A replaced CRD's storage re-initialises for a moment (429): wait until both resources list again.
    let t0 = Instant::now();
    let mut ok = 0;
    while ok < 5 {
        let lp = ListParams::default().limit(1);
        let pools = Api::<IpPool>::all(admin.clone()).list(&lp).await.is_ok();
        let rsv = Api::<OverlappingRangeIpReservation>::all(admin.clone()).list(&lp).await.is_ok();
        ok = if pools && rsv { ok + 1 } else { 0 };
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("the Whereabouts CRDs did not become servable within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let versions = versions(&admin, &hereabouts).await;
    eprintln!("bench: versions: {versions}");
    let bench = Bench {
        cluster,
        admin,
        programs: HashMap::from([(Plugin::Hereabouts, hereabouts), (Plugin::Whereabouts, whereabouts)]),
        round_timeout: Duration::from_secs(args.round_timeout),
        op_timeout: Duration::from_secs(args.op_timeout),
        sizes: sizes.clone(),
    };

    let mut results: BTreeMap<&'static str, BTreeMap<Plugin, Vec<RoundResult>>> = BTreeMap::new();
    let mut growth: BTreeMap<Plugin, BTreeMap<usize, Vec<RoundResult>>> = BTreeMap::new();
    let started = Instant::now();
    for round in 0..rounds {
        for plugin in Plugin::BOTH {
            if want("w1") {
                let r = bench.burst(plugin, round, "w1", "198.18.4.0/22", true, json!({})).await?;
                log_round("W1", plugin, round, &r);
                results.entry("W1").or_default().entry(plugin).or_default().push(r);
            }
        }
        if want("w1r") {
            // diagnostic, hereabouts only (Whereabouts has no such option): W1 with the `random` strategy
            let r = bench
                .burst(
                    Plugin::Hereabouts,
                    round,
                    "w1r",
                    "198.18.4.0/22",
                    true,
                    json!({"allocation_strategy": "random"}),
                )
                .await?;
            log_round("W1r", Plugin::Hereabouts, round, &r);
            results.entry("W1r").or_default().entry(Plugin::Hereabouts).or_default().push(r);
        }
        for plugin in Plugin::BOTH {
            if want("w4") {
                let r = bench.burst(plugin, round, "w4", "198.18.8.0/22", false, json!({})).await?;
                log_round("W4", plugin, round, &r);
                results.entry("W4").or_default().entry(plugin).or_default().push(r);
            }
        }
        for plugin in Plugin::BOTH {
            if want("w2") {
                let r = bench.churn(plugin, round, "198.18.12.0/22").await?;
                log_round("W2", plugin, round, &r);
                results.entry("W2").or_default().entry(plugin).or_default().push(r);
            }
        }
        for &level in &sizes.growth_levels {
            for plugin in Plugin::BOTH {
                if want("w3") {
                    let r = bench.growth(plugin, round, level).await?;
                    log_round(&format!("W3@{level}"), plugin, round, &r);
                    growth.entry(plugin).or_default().entry(level).or_default().push(r);
                }
            }
        }
    }
    if args.dump_metrics {
        let text = bench.cluster.metrics().await;
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("whereabouts")).collect();
        std::fs::create_dir_all(root.join("hack/bench/results"))?;
        std::fs::write(root.join("hack/bench/results/metrics-sample.txt"), lines.join("\n"))?;
    }
    let startup = if want("startup") { Some(bench.startup().await?) } else { None };
    let total = started.elapsed().as_secs_f64();

    let report = Report { machine, versions, rounds, sizes, results, growth, startup, total };
    let (text, doc) = report.render();
    println!("{text}");
    let dir = root.join("hack/bench/results");
    std::fs::create_dir_all(&dir)?;
    let stamp = utc_stamp();
    let md = format!("# hereabouts vs Whereabouts ({stamp})\n\n```\n{text}\n```\n");
    let json = serde_json::to_string_pretty(&doc)?;
    for (name, body) in [
        (format!("{stamp}.md"), &md),
        ("latest.md".to_string(), &md),
        (format!("{stamp}.json"), &json),
        ("latest.json".to_string(), &json),
    ] {
        std::fs::write(dir.join(&name), body).with_context(|| format!("write {name}"))?;
    }
    eprintln!("bench: results in {}/{stamp}.{{md,json}} and latest.{{md,json}}", dir.display());
    Ok(())
}

fn log_round(workload: &str, plugin: Plugin, round: usize, r: &RoundResult) {
    let fails: u64 = r.failures.values().sum();
    let reqs: f64 = r.requests.iter().filter(|(k, _)| k.starts_with("req ")).fold(0.0, |a, (_, v)| a + v);
    eprintln!(
        "bench: {workload} {} round {}: {:.2} s, {} ops, {} failed, {:.2} req/op, dup {}, conflicts {}, left {}",
        plugin.name(),
        round + 1,
        r.wall,
        r.ops,
        fails,
        reqs / r.ops.max(1) as f64,
        r.dup_results,
        r.pool_conflicts,
        r.left
    );
    for (k, n) in &r.failures {
        eprintln!("bench:     {n} × {k}");
    }
}

impl Bench {
    /// A fresh namespace and the network config of `plugin` for it: same identity, range and options for both.
    async fn round(&self, plugin: Plugin, prefix: &str, ipam: Value) -> anyhow::Result<Round> {
        let ns = self.cluster.namespace(&format!("{prefix}-{}", &plugin.name()[..1])).await;
        let kubeconfig = self.cluster.kubeconfig(Identity::Admin, &ns);
        let mut full = json!({"type": plugin.name(), "kubernetes": {"kubeconfig": kubeconfig}});
        if let (Some(full), Some(extra)) = (full.as_object_mut(), ipam.as_object()) {
            full.extend(extra.clone());
        }
        if plugin == Plugin::Whereabouts {
            // Whereabouts refuses to run without a flat file; give it one beside the kubeconfig.
            let flat = self.cluster.dir().join(format!("whereabouts-{ns}.conf"));
            std::fs::write(
                &flat,
                json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": kubeconfig}}).to_string(),
            )?;
            full["configuration_path"] = json!(flat);
        }
        let config = json!({"cniVersion": "1.0.0", "name": "bench", "type": "macvlan", "ipam": full}).to_string();
        Ok(Round { ns, config, program: self.programs[&plugin].clone() })
    }

    /// Runs one CNI invocation as a runtime does; a failure is keyed by its CNI error code and message.
    async fn invoke(&self, r: &Round, op: &Op, t0: Instant, deadline: Instant) -> OpResult {
        let start = t0.elapsed();
        let mut res = OpResult {
            command: op.command,
            pod: op.pod.clone(),
            start,
            end: start,
            ip: None,
            error: None,
            sample: None,
        };
        let now = Instant::now();
        if now >= deadline {
            res.error = Some("harness: round timeout, not started".into());
            return res;
        }
        let limit = self.op_timeout.min(deadline - now);
        let mut cmd = tokio::process::Command::new(&r.program);
        cmd.env_clear()
            .env("CNI_COMMAND", op.command)
            .env("CNI_CONTAINERID", format!("{}-c", op.pod))
            .env("CNI_NETNS", format!("/var/run/netns/{}", op.pod))
            .env("CNI_IFNAME", "net1")
            .env("CNI_ARGS", format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={}", r.ns, op.pod))
            .env("CNI_PATH", "/opt/cni/bin")
            .env("NODENAME", &op.node)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let run = async {
            let mut child = cmd.spawn()?;
            let mut pipe = child.stdin.take().context("stdin")?;
            pipe.write_all(r.config.as_bytes()).await?;
            drop(pipe);
            anyhow::Ok(child.wait_with_output().await?)
        };
        let out = tokio::time::timeout(limit, run).await;
        res.end = t0.elapsed();
        match out {
            Err(_) => {
                res.error = Some(if limit < self.op_timeout {
                    "harness: round timeout, killed".to_string()
                } else {
                    format!("harness: killed after {} s", self.op_timeout.as_secs())
                })
            }
            Ok(Err(e)) => res.error = Some(format!("harness: {e}")),
            Ok(Ok(out)) => {
                let stdout = String::from_utf8_lossy(&out.stdout);
                let doc: Option<Value> = serde_json::from_str(stdout.trim()).ok();
                if out.status.success() {
                    if op.command == "ADD" {
                        let addr = doc.as_ref().and_then(|d| d["ips"][0]["address"].as_str().map(str::to_string));
                        match addr.and_then(|a| a.split('/').next().and_then(|ip| ip.parse().ok())) {
                            Some(ip) => res.ip = Some(ip),
                            None => res.error = Some(format!("harness: no IPv4 address in {}", clip(&stdout, 200))),
                        }
                    }
                } else {
                    let key = match &doc {
                        Some(d) => format!(
                            "code {}: {}",
                            d["code"].as_u64().map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
                            normalise(d["msg"].as_str().unwrap_or(""))
                        ),
                        None => format!("exit {}: {}", out.status, normalise(stdout.lines().next().unwrap_or(""))),
                    };
                    res.error = Some(key);
                    res.sample = Some(format!(
                        "stdout: {}\nstderr (tail): {}",
                        clip(&stdout, 600),
                        tail(&String::from_utf8_lossy(&out.stderr), 600)
                    ));
                }
            }
        }
        res
    }

    async fn snapshot(&self) -> BTreeMap<String, f64> {
        api_counters(&self.cluster.metrics().await)
    }

    /// W1 (overlapping on) and W4 (off): distinct pods over the nodes, `burst_parallel` at a time.
    async fn burst(
        &self,
        plugin: Plugin,
        round: usize,
        prefix: &str,
        range: &str,
        overlapping: bool,
        extra: Value,
    ) -> anyhow::Result<RoundResult> {
        let mut ipam = json!({"range": range, "enable_overlapping_ranges": overlapping});
        if let (Some(ipam), Some(extra)) = (ipam.as_object_mut(), extra.as_object()) {
            ipam.extend(extra.clone());
        }
        let r = self.round(plugin, prefix, ipam).await?;
        let ops: Vec<Op> = (0..self.sizes.burst_adds)
            .map(|i| Op {
                command: "ADD",
                pod: format!("r{round}-p{i}"),
                node: format!("node-{}", i % self.sizes.nodes),
            })
            .collect();
        let before = self.snapshot().await;
        let t0 = Instant::now();
        let deadline = t0 + self.round_timeout;
        let outs: Vec<OpResult> = futures::stream::iter(ops.iter())
            .map(|op| self.invoke(&r, op, t0, deadline))
            .buffer_unordered(self.sizes.burst_parallel)
            .collect()
            .await;
        let wall = t0.elapsed().as_secs_f64();
        let after = self.snapshot().await;
        let mut res = summarise(&outs, wall, delta(&before, &after));
        self.verify(&r, range, &outs, &mut res, false).await?;
        Ok(res)
    }

    /// W2: ADD and DEL mixed, about `churn_live` addresses live, `churn_parallel` workers; everything DELeted.
    async fn churn(&self, plugin: Plugin, round: usize, range: &str) -> anyhow::Result<RoundResult> {
        let r = self.round(plugin, "w2", json!({"range": range})).await?;
        let s = &self.sizes;
        let workers = s.churn_parallel;
        let target = s.churn_live / workers;
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (round as u64 + 1);
        let mut next_pod = 0usize;
        let plans: Vec<Vec<Op>> = (0..workers)
            .map(|w| {
                // in ADD/DEL pairs, so that every worker can end with nothing live
                let pairs = s.churn_ops / 2;
                let budget = 2 * (pairs / workers + usize::from(w < pairs % workers));
                let node = format!("node-{}", w % s.nodes);
                let mut live: Vec<String> = Vec::new();
                let mut plan = Vec::with_capacity(budget);
                for i in 0..budget {
                    let remaining = budget - i;
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let add = if live.len() + 1 >= remaining {
                        false
                    } else if live.is_empty() || live.len() < target.saturating_sub(target / 5) {
                        true
                    } else if live.len() > target + target / 5 {
                        false
                    } else {
                        rng.is_multiple_of(2)
                    };
                    if add {
                        let pod = format!("r{round}-p{next_pod}");
                        next_pod += 1;
                        live.push(pod.clone());
                        plan.push(Op { command: "ADD", pod, node: node.clone() });
                    } else {
                        let pod = live.swap_remove((rng >> 32) as usize % live.len());
                        plan.push(Op { command: "DEL", pod, node: node.clone() });
                    }
                }
                plan
            })
            .collect();
        let before = self.snapshot().await;
        let t0 = Instant::now();
        let deadline = t0 + self.round_timeout;
        let round_ref = &r;
        let per_worker = futures::future::join_all(plans.iter().map(|plan| async move {
            let mut outs = Vec::with_capacity(plan.len());
            for op in plan {
                outs.push(self.invoke(round_ref, op, t0, deadline).await);
            }
            outs
        }))
        .await;
        let wall = t0.elapsed().as_secs_f64();
        let after = self.snapshot().await;
        let outs: Vec<OpResult> = per_worker.into_iter().flatten().collect();
        let mut res = summarise(&outs, wall, delta(&before, &after));
        self.verify(&r, range, &outs, &mut res, true).await?;
        Ok(res)
    }

    /// W3: single ADDs into a /18 pre-filled (in the plugin's own format) to `level` allocations; overlapping
    /// ranges off for both plugins, so the fill needs no reservations.
    async fn growth(&self, plugin: Plugin, round: usize, level: usize) -> anyhow::Result<RoundResult> {
        let range = "198.18.64.0/18";
        let r = self
            .round(plugin, &format!("w3-{level}"), json!({"range": range, "enable_overlapping_ranges": false}))
            .await?;
        let allocations: BTreeMap<String, IpAllocation> = (1..=level)
            .map(|off| {
                let pod = format!("fill-{off}");
                let entry = IpAllocation {
                    id: format!("{pod}-c"),
                    podref: format!("{}/{pod}", r.ns),
                    ifname: "net1".into(),
                    ..Default::default()
                };
                (off.to_string(), entry)
            })
            .collect();
        let pool = IpPool {
            metadata: ObjectMeta { name: Some(pool_name(range)), ..Default::default() },
            spec: IpPoolSpec { range: range.into(), allocations },
        };
        Api::<IpPool>::namespaced(self.admin.clone(), &r.ns)
            .create(&PostParams::default(), &pool)
            .await
            .with_context(|| format!("pre-fill the pool with {level} allocations"))?;
        let before = self.snapshot().await;
        let t0 = Instant::now();
        let deadline = t0 + self.round_timeout;
        let mut outs = Vec::new();
        for i in 0..self.sizes.growth_adds {
            let op =
                Op { command: "ADD", pod: format!("r{round}-g{i}"), node: format!("node-{}", i % self.sizes.nodes) };
            outs.push(self.invoke(&r, &op, t0, deadline).await);
        }
        let wall = t0.elapsed().as_secs_f64();
        let after = self.snapshot().await;
        let mut res = summarise(&outs, wall, delta(&before, &after));
        self.verify(&r, range, &outs, &mut res, false).await?;
        // the fill itself is not a leak
        res.orphans = res.orphans.saturating_sub(level as u64);
        res.server_ms = Some(self.server_cost(&r.ns, &pool_name(range)).await?);
        Ok(res)
    }

    /// Where an ADD's time goes on the server: the harness's own GET of the pool and a merge patch adding (then
    /// removing) one entry, each timed from this process (median of 3), after the measured ADDs.
    async fn server_cost(&self, ns: &str, name: &str) -> anyhow::Result<(f64, f64)> {
        let api = Api::<IpPool>::namespaced(self.admin.clone(), ns);
        let (mut gets, mut patches) = (Vec::new(), Vec::new());
        for i in 0..3 {
            let t0 = Instant::now();
            retry(|| api.get(name)).await?;
            gets.push(t0.elapsed().as_secs_f64() * 1000.0);
            let key = (16000 + i).to_string();
            let add = json!({"spec": {"allocations": {&key: {"id": "probe-c", "podref": format!("{ns}/probe"), "ifname": "net1"}}}});
            let t0 = Instant::now();
            api.patch(name, &PatchParams::default(), &Patch::Merge(&add)).await?;
            patches.push(t0.elapsed().as_secs_f64() * 1000.0);
            let remove = json!({"spec": {"allocations": {&key: null}}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&remove)).await?;
        }
        Ok((median(gets), median(patches)))
    }

    /// Verification reads, after the second metrics snapshot: addresses held twice (results and pool objects),
    /// entries left over.
    async fn verify(
        &self,
        r: &Round,
        range: &str,
        outs: &[OpResult],
        res: &mut RoundResult,
        churn: bool,
    ) -> anyhow::Result<()> {
        let lp = ListParams::default();
        let pool_api = Api::<IpPool>::namespaced(self.admin.clone(), &r.ns);
        let rsv_api = Api::<OverlappingRangeIpReservation>::namespaced(self.admin.clone(), &r.ns);
        let pools = retry(|| pool_api.list(&lp)).await?.items;
        let reservations = retry(|| rsv_api.list(&lp)).await?.items;
        let net: Ipv4Addr = range.split('/').next().unwrap().parse()?;
        let mut pool_owner: HashMap<Ipv4Addr, String> = HashMap::new();
        for pool in &pools {
            let pnet: Ipv4Addr = pool.spec.range.split('/').next().unwrap_or("0.0.0.0").parse().unwrap_or(net);
            for (off, entry) in &pool.spec.allocations {
                let ip = Ipv4Addr::from(u32::from(pnet).wrapping_add(off.parse::<u32>().unwrap_or(0)));
                pool_owner.insert(ip, entry.podref.clone());
            }
        }
        res.left = (pool_owner.len() + reservations.len()) as u64;

        // From the results: intervals in which an address was certainly held (ADD returned .. DEL started).
        let del_start: HashMap<&str, Duration> =
            outs.iter().filter(|o| o.command == "DEL").map(|o| (o.pod.as_str(), o.start)).collect();
        let mut held: BTreeMap<Ipv4Addr, Vec<(Duration, Duration)>> = BTreeMap::new();
        for o in outs.iter().filter(|o| o.command == "ADD") {
            if let Some(ip) = o.ip {
                let until = del_start.get(o.pod.as_str()).copied().unwrap_or(Duration::MAX);
                held.entry(ip).or_default().push((o.end, until));
            }
        }
        for spans in held.values_mut() {
            spans.sort();
            let mut latest_end = Duration::ZERO;
            for (i, (from, until)) in spans.iter().enumerate() {
                if i > 0 && *from < latest_end {
                    res.dup_results += 1;
                }
                latest_end = latest_end.max(*until);
            }
        }

        // From the objects: every live result is recorded for its pod, and no reservation names another pod.
        if !churn {
            let mut live_pods = BTreeSet::new();
            for o in outs.iter().filter(|o| o.command == "ADD") {
                if let Some(ip) = o.ip {
                    let me = format!("{}/{}", r.ns, o.pod);
                    if pool_owner.get(&ip) != Some(&me) {
                        res.pool_conflicts += 1;
                    }
                    live_pods.insert(me);
                }
            }
            res.orphans = pool_owner.values().filter(|p| !live_pods.contains(*p)).count() as u64;
        }
        for rsv in &reservations {
            let name = rsv.metadata.name.clone().unwrap_or_default();
            if let Ok(ip) = name.parse::<Ipv4Addr>()
                && let Some(owner) = pool_owner.get(&ip)
                && *owner != rsv.spec.podref
            {
                res.pool_conflicts += 1;
            }
        }
        Ok(())
    }

    /// Start-up: wall time of one VERSION invocation (median of 10) and its peak RSS (`/usr/bin/time -v`).
    async fn startup(&self) -> anyhow::Result<BTreeMap<Plugin, (f64, Option<f64>)>> {
        let mut out = BTreeMap::new();
        let time = Path::new("/usr/bin/time");
        for plugin in Plugin::BOTH {
            let program = &self.programs[&plugin];
            let version = |wrap: bool| {
                let mut cmd = if wrap {
                    let mut c = std::process::Command::new(time);
                    c.arg("-v").arg(program);
                    c
                } else {
                    std::process::Command::new(program)
                };
                cmd.env_clear()
                    .env("CNI_COMMAND", "VERSION")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                let mut child = cmd.spawn()?;
                std::io::Write::write_all(&mut child.stdin.take().context("stdin")?, br#"{"cniVersion":"1.0.0"}"#)?;
                let out = child.wait_with_output()?;
                if !out.status.success() {
                    bail!("{} VERSION failed: {}", plugin.name(), String::from_utf8_lossy(&out.stdout));
                }
                anyhow::Ok(out)
            };
            let mut walls = Vec::new();
            for _ in 0..10 {
                let t0 = Instant::now();
                version(false)?;
                walls.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
            walls.sort_by(f64::total_cmp);
            let rss = if time.is_file() {
                let mut peak: Option<f64> = None;
                for _ in 0..3 {
                    let out = version(true)?;
                    let text = String::from_utf8_lossy(&out.stderr).into_owned();
                    let kb = text
                        .lines()
                        .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
                        .and_then(|v| v.trim().parse::<f64>().ok());
                    peak = match (peak, kb) {
                        (Some(p), Some(k)) => Some(p.max(k)),
                        (p, k) => p.or(k),
                    };
                }
                peak.map(|kb| kb / 1024.0)
            } else {
                None
            };
            out.insert(plugin, (walls[walls.len() / 2], rss));
        }
        Ok(out)
    }
}

/// The harness's own reads, retried a few times (a 429 while storage re-initialises is not the plugins' fault).
async fn retry<T, F, Fut>(f: F) -> anyhow::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut last = None;
    for _ in 0..20 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last.map(anyhow::Error::from).unwrap_or_else(|| anyhow::anyhow!("no attempt")))
}

fn summarise(outs: &[OpResult], wall: f64, requests: BTreeMap<String, f64>) -> RoundResult {
    let mut res = RoundResult { wall, ops: outs.len(), requests, ..Default::default() };
    for o in outs {
        res.lat_all.push(o.ms());
        if o.command == "ADD" {
            res.adds += 1;
            res.lat_add.push(o.ms());
        }
        if let Some(e) = &o.error {
            *res.failures.entry(format!("{} {e}", o.command)).or_default() += 1;
            if let Some(s) = &o.sample {
                res.samples.entry(format!("{} {e}", o.command)).or_insert_with(|| s.clone());
            }
        }
    }
    res
}

/// Request counts (`req VERB resource`) and request/response body bytes (`reqbytes`, `respbytes`) for the
/// Whereabouts group and for Leases, from the API server's metrics.
fn api_counters(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some((head, value)) = line.rsplit_once(' ') else { continue };
        let Some((name, labels)) = head.split_once('{') else { continue };
        let label = |key: &str| {
            let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
            let end = labels[start..].find('"')? + start;
            Some(labels[start..end].to_string())
        };
        let ours = |group: &str, resource: &str| {
            group == hereabouts_ipam::crd::GROUP || (group == "coordination.k8s.io" && resource == "leases")
        };
        let key = match name {
            "apiserver_request_total" => {
                let (g, r) = (label("group").unwrap_or_default(), label("resource").unwrap_or_default());
                if !ours(&g, &r) {
                    continue;
                }
                format!("req {} {r}", label("verb").unwrap_or_default())
            }
            "apiserver_response_sizes_sum" => {
                let (g, r) = (label("group").unwrap_or_default(), label("resource").unwrap_or_default());
                if !ours(&g, &r) {
                    continue;
                }
                format!("respbytes {} {r}", label("verb").unwrap_or_default())
            }
            "apiserver_request_duration_seconds_sum" => {
                let (g, r) = (label("group").unwrap_or_default(), label("resource").unwrap_or_default());
                if !ours(&g, &r) {
                    continue;
                }
                format!("srvsec {} {r}", label("verb").unwrap_or_default())
            }
            "apiserver_request_body_size_bytes_sum" => {
                let (g, r) = (label("group").unwrap_or_default(), label("resource").unwrap_or_default());
                if !ours(&g, &r) {
                    continue;
                }
                format!("reqbytes {} {r}", label("verb").unwrap_or_default().to_uppercase())
            }
            _ => continue,
        };
        *out.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    out
}

fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// The IPPool name both plugins use for `range` (no network name).
fn pool_name(range: &str) -> String {
    range.replace(['/', ':'], "-")
}

/// A CNI error message with its variable parts (numbers, names with numbers) folded, to group failures.
fn normalise(msg: &str) -> String {
    let mut out = String::new();
    let mut digits = false;
    for c in msg.chars() {
        if c.is_ascii_digit() {
            if !digits {
                out.push('#');
            }
            digits = true;
        } else {
            digits = false;
            out.push(c);
        }
    }
    clip(&out, 160)
}

fn clip(s: &str, n: usize) -> String {
    let s = s.trim();
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

fn tail(s: &str, n: usize) -> String {
    let s = s.trim();
    let count = s.chars().count();
    if count <= n { s.to_string() } else { format!("…{}", s.chars().skip(count - n).collect::<String>()) }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 50.0)
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .current_dir(testenv::repo_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

fn utc_stamp() -> String {
    command_line("date", &["-u", "+%Y%m%dT%H%M%SZ"])
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "?".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    format!("nproc {cpus}, {model}, {:.1} GiB RAM, {}", mem_kb / 1024.0 / 1024.0, command_line("uname", &["-sr"]))
}

async fn versions(admin: &Client, hereabouts: &Path) -> String {
    let rev = command_line("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = if command_line("git", &["status", "--porcelain"]).is_empty() { "" } else { "+dirty" };
    let gomod =
        std::fs::read_to_string(testenv::repo_root().join("hack/testenv/whereabouts/go.mod")).unwrap_or_default();
    let wb = gomod
        .lines()
        .find_map(|l| l.trim().strip_prefix("github.com/k8snetworkplumbingwg/whereabouts "))
        .map(|v| v.split_whitespace().next().unwrap_or("?").to_string())
        .unwrap_or_else(|| "?".into());
    let apiserver = admin.apiserver_version().await.map(|v| v.git_version).unwrap_or_else(|_| "?".into());
    format!(
        "hereabouts {} ({rev}{dirty}, {}), Whereabouts {wb}, kube-apiserver {apiserver}, {}",
        env!("CARGO_PKG_VERSION"),
        hereabouts.display(),
        command_line("rustc", &["--version"])
    )
}

/// Everything measured, rendered as a side-by-side table and JSON.
#[derive(Debug)]
struct Report {
    machine: String,
    versions: String,
    rounds: usize,
    sizes: Sizes,
    results: BTreeMap<&'static str, BTreeMap<Plugin, Vec<RoundResult>>>,
    growth: BTreeMap<Plugin, BTreeMap<usize, Vec<RoundResult>>>,
    startup: Option<BTreeMap<Plugin, (f64, Option<f64>)>>,
    total: f64,
}

/// Across rounds: medians of wall time and throughput, percentiles over every operation of every round, sums of
/// failures and checks, requests per operation over all rounds.
#[derive(Debug, Default, Clone)]
struct Summary {
    rounds: usize,
    ops: usize,
    adds: usize,
    wall: f64,
    adds_per_s: f64,
    ops_per_s: f64,
    lat: [f64; 4],
    add_lat: [f64; 4],
    failed: u64,
    failures: BTreeMap<String, u64>,
    samples: BTreeMap<String, String>,
    per_op: BTreeMap<String, f64>,
    req_per_op: f64,
    dup_results: u64,
    pool_conflicts: u64,
    left: u64,
    orphans: u64,
    server_ms: (f64, f64),
    per_round: Vec<Value>,
}

fn summary(rounds: &[RoundResult]) -> Summary {
    let mut s = Summary { rounds: rounds.len(), ..Default::default() };
    let mut all = Vec::new();
    let mut adds = Vec::new();
    let mut totals: BTreeMap<String, f64> = BTreeMap::new();
    for r in rounds {
        s.ops += r.ops;
        s.adds += r.adds;
        all.extend(r.lat_all.iter().copied());
        adds.extend(r.lat_add.iter().copied());
        for (k, n) in &r.failures {
            *s.failures.entry(k.clone()).or_default() += n;
            s.failed += n;
        }
        for (k, v) in &r.samples {
            s.samples.entry(k.clone()).or_insert_with(|| v.clone());
        }
        for (k, v) in &r.requests {
            *totals.entry(k.clone()).or_default() += v;
        }
        s.dup_results += r.dup_results;
        s.pool_conflicts += r.pool_conflicts;
        s.left += r.left;
        s.orphans += r.orphans;
        s.per_round.push(json!({
            "wall_s": r.wall, "ops": r.ops, "adds": r.adds, "adds_per_s": r.adds as f64 / r.wall,
            "failed": r.failures.values().sum::<u64>(), "requests": r.requests,
            "dup_results": r.dup_results, "pool_conflicts": r.pool_conflicts, "left": r.left, "orphans": r.orphans,
        }));
    }
    s.server_ms = (
        median(rounds.iter().filter_map(|r| r.server_ms.map(|m| m.0)).collect()),
        median(rounds.iter().filter_map(|r| r.server_ms.map(|m| m.1)).collect()),
    );
    s.wall = median(rounds.iter().map(|r| r.wall).collect());
    s.adds_per_s = median(rounds.iter().map(|r| r.adds as f64 / r.wall).collect());
    s.ops_per_s = median(rounds.iter().map(|r| r.ops as f64 / r.wall).collect());
    all.sort_by(f64::total_cmp);
    adds.sort_by(f64::total_cmp);
    let pct = |v: &[f64]| {
        [percentile(v, 50.0), percentile(v, 95.0), percentile(v, 99.0), v.last().copied().unwrap_or(f64::NAN)]
    };
    s.lat = pct(&all);
    s.add_lat = pct(&adds);
    s.per_op = totals.into_iter().map(|(k, v)| (k, v / s.ops.max(1) as f64)).collect();
    s.req_per_op = s.per_op.iter().filter(|(k, _)| k.starts_with("req ")).fold(0.0, |a, (_, v)| a + v);
    s
}

fn summary_json(s: &Summary) -> Value {
    json!({
        "rounds": s.rounds, "ops": s.ops, "adds": s.adds, "wall_s_median": s.wall,
        "adds_per_s_median": s.adds_per_s, "ops_per_s_median": s.ops_per_s,
        "latency_ms": {"p50": s.lat[0], "p95": s.lat[1], "p99": s.lat[2], "max": s.lat[3]},
        "add_latency_ms": {"p50": s.add_lat[0], "p95": s.add_lat[1], "p99": s.add_lat[2], "max": s.add_lat[3]},
        "failed": s.failed, "failures": s.failures, "failure_samples": s.samples,
        "per_op": s.per_op, "requests_per_op": s.req_per_op,
        "dup_results": s.dup_results, "pool_conflicts": s.pool_conflicts, "left_allocated": s.left,
        "orphans": s.orphans, "per_round": s.per_round,
        "w3_harness_get_pool_ms": s.server_ms.0, "w3_harness_patch_pool_ms": s.server_ms.1,
    })
}

struct Table {
    rows: Vec<[String; 4]>,
}

impl Table {
    fn new() -> Self {
        Self { rows: vec![["".into(), "hereabouts".into(), "Whereabouts".into(), "H/W".into()]] }
    }

    fn num(&mut self, label: &str, h: f64, w: f64, digits: usize) {
        let ratio = if w != 0.0 && h.is_finite() && w.is_finite() { format!("{:.2}", h / w) } else { "-".into() };
        self.rows.push([label.into(), fmt(h, digits), fmt(w, digits), ratio]);
    }

    fn text(&mut self, label: &str, h: String, w: String) {
        self.rows.push([label.into(), h, w, String::new()]);
    }

    fn section(&mut self, title: &str) {
        self.rows.push([format!("== {title}"), String::new(), String::new(), String::new()]);
    }

    fn render(&self) -> String {
        let mut widths = [0usize; 4];
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                if !r[0].starts_with("== ") || i > 0 {
                    widths[i] = widths[i].max(c.chars().count());
                }
            }
        }
        let mut out = String::new();
        for r in &self.rows {
            if r[0].starts_with("== ") {
                out.push_str(&format!("{}\n", r[0]));
                continue;
            }
            out.push_str(&format!(
                "{:<w0$}  {:>w1$}  {:>w2$}  {:>w3$}\n",
                r[0],
                r[1],
                r[2],
                r[3],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
                w3 = widths[3]
            ));
        }
        out
    }
}

fn fmt(v: f64, digits: usize) -> String {
    if v.is_finite() { format!("{v:.digits$}") } else { "-".into() }
}

impl Report {
    fn render(&self) -> (String, Value) {
        let mut t = Table::new();
        let mut doc = json!({
            "machine": self.machine, "versions": self.versions, "rounds": self.rounds,
            "crd_schema": "Whereabouts v0.9.2 (doc/crds), installed for the whole run",
            "identity": "admin (system:masters) kubeconfig for both",
            "sizes": format!("{:?}", self.sizes), "total_s": self.total,
        });
        let mut failure_text = String::new();
        let titles = [
            (
                "W1",
                format!(
                    "W1 burst: {} ADDs, {} at a time, {} nodes, 198.18.4.0/22, overlapping on",
                    self.sizes.burst_adds, self.sizes.burst_parallel, self.sizes.nodes
                ),
            ),
            (
                "W1r",
                "W1r diagnostic, hereabouts only: W1 with allocation_strategy \"random\" (not a target measurement)"
                    .to_string(),
            ),
            (
                "W4",
                format!(
                    "W4 burst, enable_overlapping_ranges false: {} ADDs, {} at a time, 198.18.8.0/22",
                    self.sizes.burst_adds, self.sizes.burst_parallel
                ),
            ),
            (
                "W2",
                format!(
                    "W2 churn: {} ops ADD/DEL, ~{} live, {} at a time, 198.18.12.0/22, all DELeted at the end",
                    self.sizes.churn_ops, self.sizes.churn_live, self.sizes.churn_parallel
                ),
            ),
        ];
        for (key, title) in titles {
            let Some(by) = self.results.get(key) else { continue };
            let h = summary(by.get(&Plugin::Hereabouts).map(Vec::as_slice).unwrap_or(&[]));
            let w = summary(by.get(&Plugin::Whereabouts).map(Vec::as_slice).unwrap_or(&[]));
            t.section(&format!("{title} ({} rounds each)", h.rounds));
            t.num("wall time, s (median of rounds)", h.wall, w.wall, 2);
            t.num("ADDs/s (median of rounds)", h.adds_per_s, w.adds_per_s, 1);
            if key == "W2" {
                t.num("ops/s (median of rounds)", h.ops_per_s, w.ops_per_s, 1);
            }
            let lab = if key == "W2" { "op" } else { "ADD" };
            for (i, p) in ["p50", "p95", "p99", "max"].iter().enumerate() {
                t.num(&format!("{lab} latency {p}, ms"), h.lat[i], w.lat[i], 0);
            }
            if key == "W2" {
                t.num("ADD latency p99, ms", h.add_lat[2], w.add_lat[2], 0);
            }
            t.text("failed ops / all ops", format!("{} / {}", h.failed, h.ops), format!("{} / {}", w.failed, w.ops));
            t.num("API requests per op (whereabouts group + leases)", h.req_per_op, w.req_per_op, 2);
            let keys: BTreeSet<&String> =
                h.per_op.keys().chain(w.per_op.keys()).filter(|k| k.starts_with("req ")).collect();
            for k in keys {
                let g = |s: &Summary| s.per_op.get(k).copied().unwrap_or(0.0);
                t.num(&format!("  {}", &k[4..]), g(&h), g(&w), 2);
            }
            for (prefix, label) in [("reqbytes ", "request body bytes per op"), ("respbytes ", "response bytes per op")]
            {
                let g =
                    |s: &Summary| s.per_op.iter().filter(|(k, _)| k.starts_with(prefix)).fold(0.0, |a, (_, v)| a + v);
                t.num(label, g(&h), g(&w), 0);
            }
            // the API server's own time: where a plugin's requests wait on each other
            let g =
                |s: &Summary| s.per_op.iter().filter(|(k, _)| k.starts_with("srvsec ")).fold(0.0, |a, (_, v)| a + v);
            t.num("API server time per op, ms", 1000.0 * g(&h), 1000.0 * g(&w), 0);
            let each = |s: &Summary, key: &str| {
                let n = s.per_op.get(&format!("req {key}")).copied().unwrap_or(0.0);
                (n > 0.0).then(|| 1000.0 * s.per_op.get(&format!("srvsec {key}")).copied().unwrap_or(0.0) / n)
            };
            t.num(
                "  per PATCH ippools, ms",
                each(&h, "PATCH ippools").unwrap_or(0.0),
                each(&w, "PATCH ippools").unwrap_or(0.0),
                0,
            );
            t.text(
                "held twice: results / pool objects",
                format!("{} / {}", h.dup_results, h.pool_conflicts),
                format!("{} / {}", w.dup_results, w.pool_conflicts),
            );
            if key == "W2" {
                t.text("left allocated (pool entries + reservations)", h.left.to_string(), w.left.to_string());
            } else {
                t.text("pool entries no live pod holds (leaks)", h.orphans.to_string(), w.orphans.to_string());
            }
            for (name, s) in [("hereabouts", &h), ("Whereabouts", &w)] {
                for (k, n) in &s.failures {
                    failure_text.push_str(&format!("{key} {name}: {n} × {k}\n"));
                }
            }
            doc[key] = json!({"title": title, "hereabouts": summary_json(&h), "whereabouts": summary_json(&w)});
        }

        if !self.growth.is_empty() {
            t.section(&format!(
                "W3 growth: {} single ADDs into 198.18.64.0/18 pre-filled to N allocations, overlapping off for both",
                self.sizes.growth_adds
            ));
            let mut w3 = serde_json::Map::new();
            let mut base: BTreeMap<Plugin, f64> = BTreeMap::new();
            for &level in &self.sizes.growth_levels {
                let get = |p: Plugin| {
                    summary(self.growth.get(&p).and_then(|m| m.get(&level)).map(Vec::as_slice).unwrap_or(&[]))
                };
                let (h, w) = (get(Plugin::Hereabouts), get(Plugin::Whereabouts));
                if level == self.sizes.growth_levels[0] {
                    base.insert(Plugin::Hereabouts, h.lat[0]);
                    base.insert(Plugin::Whereabouts, w.lat[0]);
                }
                t.num(&format!("N={level}: ADD p50, ms"), h.lat[0], w.lat[0], 0);
                t.num(&format!("N={level}: ADD p95, ms"), h.lat[1], w.lat[1], 0);
                t.num(&format!("N={level}: ADD max, ms"), h.lat[3], w.lat[3], 0);
                t.num(
                    &format!("N={level}: p50 / p50 at N={}", self.sizes.growth_levels[0]),
                    h.lat[0] / base[&Plugin::Hereabouts],
                    w.lat[0] / base[&Plugin::Whereabouts],
                    2,
                );
                t.num(&format!("N={level}: API requests per ADD"), h.req_per_op, w.req_per_op, 2);
                t.num(&format!("N={level}: harness GET pool, ms"), h.server_ms.0, w.server_ms.0, 0);
                t.num(&format!("N={level}: harness merge-PATCH pool, ms"), h.server_ms.1, w.server_ms.1, 0);
                for (prefix, label) in
                    [("reqbytes ", "request body bytes per ADD"), ("respbytes ", "response bytes per ADD")]
                {
                    let g = |s: &Summary| {
                        s.per_op.iter().filter(|(k, _)| k.starts_with(prefix)).fold(0.0, |a, (_, v)| a + v)
                    };
                    t.num(&format!("N={level}: {label}"), g(&h), g(&w), 0);
                }
                t.text(
                    &format!("N={level}: failed / held twice"),
                    format!("{} / {}", h.failed, h.dup_results + h.pool_conflicts),
                    format!("{} / {}", w.failed, w.dup_results + w.pool_conflicts),
                );
                for (name, s) in [("hereabouts", &h), ("Whereabouts", &w)] {
                    for (k, n) in &s.failures {
                        failure_text.push_str(&format!("W3@{level} {name}: {n} × {k}\n"));
                    }
                }
                w3.insert(level.to_string(), json!({"hereabouts": summary_json(&h), "whereabouts": summary_json(&w)}));
            }
            doc["W3"] = Value::Object(w3);
        }

        if let Some(st) = &self.startup {
            t.section(
                "start-up: one VERSION invocation (wall: median of 10; peak RSS: max of 3 under /usr/bin/time -v)",
            );
            let (hw, hr) = st[&Plugin::Hereabouts];
            let (ww, wr) = st[&Plugin::Whereabouts];
            t.num("wall time, ms", hw, ww, 1);
            t.num("peak RSS, MiB", hr.unwrap_or(f64::NAN), wr.unwrap_or(f64::NAN), 1);
            doc["startup"] = json!({
                "hereabouts": {"wall_ms": hw, "peak_rss_mib": hr},
                "whereabouts": {"wall_ms": ww, "peak_rss_mib": wr},
            });
        }

        let mut text = format!(
            "machine: {}\nversions: {}\nCRD schema: Whereabouts v0.9.2's own (both plugins), identity: admin kubeconfig for both\n\
             rounds: {} per workload and plugin, alternating; total bench time {:.0} s\n\
             H/W = hereabouts value / Whereabouts value. API requests are counted from apiserver_request_total for group\n\
             whereabouts.cni.cncf.io plus coordination.k8s.io leases (the API server's own lease renewals, ~1 per 10 s, are in it).\n\n",
            self.machine, self.versions, self.rounds, self.total
        );
        text.push_str(&t.render());
        if !failure_text.is_empty() {
            text.push_str("\nfailures by CNI error (code: message, numbers folded to #):\n");
            text.push_str(&failure_text);
        }
        (text, doc)
    }
}
