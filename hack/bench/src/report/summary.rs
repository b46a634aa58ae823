//! Rounds of one workload and column, summed up.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::metrics;
use crate::results::RoundResult;
use crate::stats::{mean, median, percentile};

/// Across rounds: medians of wall time and throughput, percentiles over every operation of every round, sums of
/// failures and checks, requests per operation over all rounds.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub rounds: usize,
    pub ops: usize,
    pub adds: usize,
    pub wall: f64,
    pub adds_per_s: f64,
    pub ops_per_s: f64,
    pub lat: [f64; 4],
    pub add_lat: [f64; 4],
    pub add_mean: f64,
    pub failed: u64,
    pub failures: BTreeMap<String, u64>,
    pub samples: BTreeMap<String, String>,
    pub per_op: BTreeMap<String, f64>,
    pub req_per_op: f64,
    pub dup_results: u64,
    pub pool_conflicts: u64,
    pub left: u64,
    pub orphans: u64,
    pub server_ms: (f64, f64),
    pub per_round: Vec<Value>,
    /// The warm reserve's rounds, summed up.
    pub warm: Option<WarmSummary>,
}

/// Warm rounds: counts summed, requests per burst ADD over all rounds, times as medians of the rounds that got
/// there.
#[derive(Debug, Default, Clone)]
pub struct WarmSummary {
    pub warm: usize,
    pub served: u64,
    pub own: u64,
    pub by_binary: u64,
    pub takes: u64,
    pub rounds: u64,
    pub handed: u64,
    /// Counters from the burst's start until all was handed over, per burst ADD.
    pub handover: BTreeMap<String, f64>,
    pub handed_after: f64,
    /// Rounds whose hand-over did not finish within the wait.
    pub not_handed: usize,
    pub refilled_after: f64,
    pub not_refilled: usize,
    pub fill_s: f64,
    pub fill_per_slot: f64,
}

impl WarmSummary {
    /// Requests from the burst's start until all was handed over, per burst ADD.
    pub fn handover_per_add(&self) -> f64 {
        metrics::sum(&self.handover, "req ")
    }
}

fn warm_summary(rounds: &[RoundResult]) -> Option<WarmSummary> {
    let warm: Vec<&crate::results::WarmFigures> = rounds.iter().filter_map(|r| r.warm.as_ref()).collect();
    let first = warm.first()?;
    let adds: usize = rounds.iter().filter(|r| r.warm.is_some()).map(|r| r.adds).sum();
    let mut s = WarmSummary { warm: first.warm, ..Default::default() };
    let (mut fill_requests, mut fill_slots) = (0.0, 0);
    for w in &warm {
        s.served += w.served;
        s.own += w.own;
        s.by_binary += w.by_binary;
        s.takes += w.takes;
        s.rounds += w.rounds;
        s.handed += w.handed;
        for (k, v) in &w.handover {
            *s.handover.entry(k.clone()).or_default() += v;
        }
        fill_requests += w.fill_requests;
        fill_slots += w.fill_slots;
    }
    for v in s.handover.values_mut() {
        *v /= adds.max(1) as f64;
    }
    s.not_handed = warm.iter().filter(|w| w.handed_after.is_none()).count();
    s.not_refilled = warm.iter().filter(|w| w.refilled_after.is_none()).count();
    s.handed_after = median(warm.iter().filter_map(|w| w.handed_after).collect());
    s.refilled_after = median(warm.iter().filter_map(|w| w.refilled_after).collect());
    s.fill_s = median(warm.iter().map(|w| w.fill_s).collect());
    s.fill_per_slot = fill_requests / fill_slots.max(1) as f64;
    Some(s)
}

impl Summary {
    /// The per-op value of counter `key`, 0 when it never counted.
    pub fn per(&self, key: &str) -> f64 {
        self.per_op.get(key).copied().unwrap_or(0.0)
    }

    /// The API server's time per op over every counted request, ms.
    pub fn server_ms_per_op(&self) -> f64 {
        1000.0 * metrics::sum(&self.per_op, "srvsec ")
    }

    /// The API server's time per request of `kind` (`VERB resource`), ms, if there was one.
    pub fn server_ms_per_request(&self, kind: &str) -> Option<f64> {
        let n = self.per(&format!("req {kind}"));
        (n > 0.0).then(|| 1000.0 * self.per(&format!("srvsec {kind}")) / n)
    }
}

pub fn summary(rounds: &[RoundResult]) -> Summary {
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
        let mut round = json!({
            "wall_s": r.wall, "ops": r.ops, "adds": r.adds, "adds_per_s": r.adds as f64 / r.wall,
            "failed": r.failures.values().sum::<u64>(), "requests": r.requests,
            "dup_results": r.dup_results, "pool_conflicts": r.pool_conflicts, "left": r.left, "orphans": r.orphans,
        });
        if let Some(w) = &r.warm {
            round["warm"] = json!({
                "warm_addresses": w.warm, "adds_from_reserve": w.served, "adds_claimed_own": w.own,
                "adds_by_the_binary_itself": w.by_binary, "takes_logged": w.takes, "handover_rounds": w.rounds, "handed_logged": w.handed,
                "requests_burst_start_to_handed_over": w.handover,
                "handed_over_s_after_burst_end": w.handed_after, "reserves_full_s_after_burst_end": w.refilled_after,
                "first_fill_s": w.fill_s, "first_fill_requests": w.fill_requests, "first_fill_slots": w.fill_slots,
            });
        }
        s.per_round.push(round);
    }
    s.warm = warm_summary(rounds);
    s.server_ms = (
        median(rounds.iter().filter_map(|r| r.server_ms.map(|m| m.0)).collect()),
        median(rounds.iter().filter_map(|r| r.server_ms.map(|m| m.1)).collect()),
    );
    s.wall = median(rounds.iter().map(|r| r.wall).collect());
    s.adds_per_s = median(rounds.iter().map(|r| r.adds as f64 / r.wall).collect());
    s.ops_per_s = median(rounds.iter().map(|r| r.ops as f64 / r.wall).collect());
    s.add_mean = mean(&adds);
    all.sort_by(f64::total_cmp);
    adds.sort_by(f64::total_cmp);
    let pct = |v: &[f64]| {
        [percentile(v, 50.0), percentile(v, 95.0), percentile(v, 99.0), v.last().copied().unwrap_or(f64::NAN)]
    };
    s.lat = pct(&all);
    s.add_lat = pct(&adds);
    s.per_op = totals.into_iter().map(|(k, v)| (k, v / s.ops.max(1) as f64)).collect();
    s.req_per_op = metrics::sum(&s.per_op, "req ");
    s
}

pub fn summary_json(s: &Summary) -> Value {
    json!({
        "rounds": s.rounds, "ops": s.ops, "adds": s.adds, "wall_s_median": s.wall,
        "adds_per_s_median": s.adds_per_s, "ops_per_s_median": s.ops_per_s,
        "latency_ms": {"p50": s.lat[0], "p95": s.lat[1], "p99": s.lat[2], "max": s.lat[3]},
        "add_latency_ms": {"p50": s.add_lat[0], "p95": s.add_lat[1], "p99": s.add_lat[2], "max": s.add_lat[3],
                           "mean": s.add_mean},
        "failed": s.failed, "failures": s.failures, "failure_samples": s.samples,
        "per_op": s.per_op, "requests_per_op": s.req_per_op,
        "dup_results": s.dup_results, "pool_conflicts": s.pool_conflicts, "left_allocated": s.left,
        "orphans": s.orphans, "per_round": s.per_round,
        "w3_harness_get_pool_ms": s.server_ms.0, "w3_harness_patch_pool_ms": s.server_ms.1,
        "warm": s.warm.as_ref().map(|w| json!({
            "warm_addresses": w.warm,
            "adds_from_reserve": w.served, "adds_claimed_own": w.own, "adds_by_the_binary_itself": w.by_binary,
            // an ADD answered from the reserve sends none; one that claimed its own is not told apart in the counters
            "requests_on_path_per_add_from_reserve": 0,
            "takes_logged": w.takes, "handover_rounds": w.rounds, "handed_logged": w.handed,
            "requests_per_add_burst_start_to_handed_over": w.handover,
            "requests_per_add_burst_start_to_handed_over_total": w.handover_per_add(),
            "handed_over_s_after_burst_end_median": w.handed_after, "rounds_not_handed_over": w.not_handed,
            "reserves_full_s_after_burst_end_median": w.refilled_after, "rounds_not_refilled": w.not_refilled,
            "first_fill_s_median": w.fill_s, "first_fill_requests_per_slot": w.fill_per_slot,
        })),
    })
}
