//! Measures a provider-backed ADD (IaaS provider mode, global pool) against the reference provider on the test
//! control plane: N ADDs on one node that each need a provider call (fresh addresses), then, after DEL of all,
//! N ADDs that take the sub-interfaces cached on the node (no call). One ADD at a time, the compiled plugin run as
//! a runtime runs it. Prints median and p99 of each, and the reference provider's cloud delay.
//!
//! `cargo run --release -p hereabouts-tests --bin provider_latency [N]` (after `make build`; default N = 100).

use std::time::{Duration, Instant};

use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::provider::{ProviderOptions, ReferenceProvider};
use serde_json::json;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summary(what: &str, mut times: Vec<Duration>) {
    times.sort();
    println!(
        "{what:<36} n={:<4} median {:>6.1} ms   p99 {:>6.1} ms",
        times.len(),
        percentile(&times, 50.0).as_secs_f64() * 1000.0,
        percentile(&times, 99.0).as_secs_f64() * 1000.0
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(100);
    let fx = CniFixture::new("iaas-latency").await;
    let options = ProviderOptions::default();
    let provider = ReferenceProvider::start(options.clone()).await;
    let section = json!({"url": provider.url(), "ca_file": provider.ca_file(), "parent_interface": "lo"});
    let cfg = fx.netconf("1.0.0", "iaas", json!({"range": "198.18.48.0/22", "iaas_provider": section}));
    let plain = fx.netconf("1.0.0", "plain", json!({"range": "198.18.52.0/22"}));
    let run = |command: &'static str, cfg: &serde_json::Value, pod: String| {
        fx.invocation(command, cfg, &pod, &format!("c-{pod}")).with_env("NODENAME", "node-a")
    };
    // `n` invocations of `command`, one at a time, for pods `<prefix>0`…; how long each took
    let each = async |command: &'static str, cfg: &serde_json::Value, prefix: &str| -> anyhow::Result<Vec<Duration>> {
        let mut took = Vec::with_capacity(n);
        for i in 0..n {
            let t0 = Instant::now();
            let out = run(command, cfg, format!("{prefix}{i}")).run().await;
            took.push(t0.elapsed());
            anyhow::ensure!(out.success, "{command} {prefix}{i}: {}", out.stdout);
        }
        Ok(took)
    };
    let called = each("ADD", &cfg, "p").await?;
    each("DEL", &cfg, "p").await?;
    let calls_before = provider.calls().len();
    let cached = each("ADD", &cfg, "q").await?;
    anyhow::ensure!(provider.calls().len() == calls_before, "the cached ADDs called the provider");
    let ordinary = each("ADD", &plain, "r").await?;
    println!(
        "reference provider: cloud delay {:?}, queue wait up to {:?}",
        options.cloud_delay, options.max_queue_wait
    );
    summary("ADD with a provider call", called);
    summary("ADD from the node's cache (no call)", cached);
    summary("ADD of an ordinary range", ordinary);
    Ok(())
}
