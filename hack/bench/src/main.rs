//! `bench`: hereabouts against upstream Whereabouts (v0.9.2, built by `hack/testenv.sh`), side by side on one real
//! kube-apiserver and etcd. Both compiled CNI binaries run as processes exactly as a container runtime runs them
//! (CNI_* in the environment, the network config on stdin), with the same kubeconfig identity (admin: Whereabouts
//! needs Lease rights), the same ranges and the same CRD schema (Whereabouts' own, installed for the whole run).
//! Run it with `make bench`; `--quick` is a short smoke run.

mod args;
mod cpu;
mod invoke;
mod k8s;
mod machine;
mod metrics;
mod report;
mod results;
mod stats;
mod verify;
mod workloads;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_tests::{TestCluster, testenv};
use kube::api::{Api, ListParams};
use serde_json::json;

use args::{Args, Plugin, Variant};
use report::{ByLevel, ByVariant, Report};
use results::log_round;
use workloads::Bench;

const W1_RANGE: &str = "198.18.4.0/22";

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let root = testenv::repo_root();
    // Beside this executable: the same target directory and profile `make bench` built it with.
    let beside = std::env::current_exe()?.with_file_name("hereabouts");
    let hereabouts = args.hereabouts.clone().unwrap_or(beside);
    let whereabouts = testenv::bin_dir().join("whereabouts");
    for p in [&hereabouts, &whereabouts] {
        if !p.is_file() {
            bail!("{} is missing: run `make bench` (it builds it and runs hack/testenv.sh)", p.display());
        }
    }
    let rounds = if args.quick { 1 } else { args.rounds.max(1) };
    let sizes = args.sizes();
    let want = |w: &str| args.wants(w);

    let machine = machine::machine();
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
    let versions = machine::versions(&admin, &hereabouts).await;
    eprintln!("bench: versions: {versions}");
    let bench = Bench {
        cluster,
        admin,
        programs: HashMap::from([(Plugin::Hereabouts, hereabouts), (Plugin::Whereabouts, whereabouts)]),
        round_timeout: Duration::from_secs(args.round_timeout),
        op_timeout: Duration::from_secs(args.op_timeout),
        sizes: sizes.clone(),
        notes: Default::default(),
    };

    let mut results: BTreeMap<&'static str, ByVariant> = BTreeMap::new();
    let mut growth = ByLevel::new();
    let mut sliced_growth = ByLevel::new();
    let mut keep = |key: &'static str, v: Variant, round: usize, r: results::RoundResult| {
        log_round(key, v.name(), round, &r);
        results.entry(key).or_default().entry(v).or_default().push(r);
    };
    let started = Instant::now();
    for round in 0..rounds {
        if want("w1") {
            for plugin in Plugin::BOTH {
                let r = bench.burst(plugin, round, "w1", W1_RANGE, true, json!({})).await?;
                keep("W1", single(plugin), round, r);
            }
        }
        if want("w1r") {
            // diagnostic, hereabouts only (Whereabouts has no such option): W1 with the `random` strategy
            let extra = json!({"allocation_strategy": "random"});
            let r = bench.burst(Plugin::Hereabouts, round, "w1r", W1_RANGE, true, extra).await?;
            keep("W1r", Variant::Hereabouts, round, r);
        }
        if want("w1s") {
            for v in
                [Variant::HereaboutsSlice, Variant::HereaboutsAgent, Variant::HereaboutsWarm, Variant::WhereaboutsFast]
            {
                let r = bench.burst_sliced(v, round, W1_RANGE).await?;
                keep("W1s", v, round, r);
            }
            if !want("w1") {
                // W1s stands beside Whereabouts' single-pool W1: run it when W1 does not
                let r = bench.burst(Plugin::Whereabouts, round, "w1", W1_RANGE, true, json!({})).await?;
                keep("W1s", Variant::Whereabouts, round, r);
            }
        }
        if want("large") {
            for v in workloads::large::LARGE_VARIANTS {
                let r = bench.large(v, round).await?;
                keep("large", v, round, r);
            }
        }
        if want("w4") {
            for plugin in Plugin::BOTH {
                let r = bench.burst(plugin, round, "w4", "198.18.8.0/22", false, json!({})).await?;
                keep("W4", single(plugin), round, r);
            }
        }
        if want("w2") {
            for plugin in Plugin::BOTH {
                let r = bench.churn(plugin, round, "198.18.12.0/22").await?;
                keep("W2", single(plugin), round, r);
            }
        }
        if want("w3") {
            for &level in &sizes.growth_levels {
                for plugin in Plugin::BOTH {
                    let r = bench.growth(plugin, round, level).await?;
                    log_round(&format!("W3@{level}"), plugin.name(), round, &r);
                    growth.entry(single(plugin)).or_default().entry(level).or_default().push(r);
                }
            }
        }
        if want("w3s") {
            for &level in &sizes.sliced_growth_levels {
                for v in [Variant::HereaboutsSlice, Variant::HereaboutsAgent, Variant::WhereaboutsFast] {
                    let r = bench.growth_sliced(v, round, level).await?;
                    log_round(&format!("W3s@{level}"), v.name(), round, &r);
                    sliced_growth.entry(v).or_default().entry(level).or_default().push(r);
                }
            }
        }
    }
    // once per run: the ceiling measures the server, the fill is a capacity check
    let ceiling = if want("ceiling") { Some(bench.ceiling().await?) } else { None };
    let fit = if want("fit") {
        let mut rounds = Vec::new();
        for v in workloads::fit::FitVariant::ALL {
            let f = bench.fit(v).await?;
            log_round("fit", v.label(), 0, &f.res);
            rounds.push(f);
        }
        Some(rounds)
    } else {
        None
    };
    let fill = if want("fill") {
        let f = bench.fill().await?;
        log_round("fill", "hereabouts-slice", 0, &f.res);
        Some(f)
    } else {
        None
    };
    if args.dump_metrics {
        let text = bench.cluster.metrics().await;
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("whereabouts")).collect();
        std::fs::create_dir_all(root.join("hack/bench/results"))?;
        std::fs::write(root.join("hack/bench/results/metrics-sample.txt"), lines.join("\n"))?;
    }
    let startup = if want("startup") { Some(bench.startup().await?) } else { None };
    let total = started.elapsed().as_secs_f64();

    let notes = bench.notes.lock().unwrap().clone();
    let report = Report {
        machine,
        versions,
        rounds,
        sizes,
        results,
        growth,
        sliced_growth,
        ceiling,
        fill,
        fit,
        startup,
        notes,
        total,
    };
    let (text, doc) = report.render();
    println!("{text}");
    let dir = root.join("hack/bench/results");
    std::fs::create_dir_all(&dir)?;
    let stamp = machine::utc_stamp();
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

/// The single-pool column of `plugin`.
fn single(plugin: Plugin) -> Variant {
    match plugin {
        Plugin::Hereabouts => Variant::Hereabouts,
        Plugin::Whereabouts => Variant::Whereabouts,
    }
}
