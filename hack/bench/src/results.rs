//! What one round measured and verified, from its invocations' results and the API server's counters.

use std::collections::BTreeMap;

use crate::invoke::OpResult;

#[derive(Debug, Default, Clone)]
pub struct RoundResult {
    pub wall: f64,
    pub ops: usize,
    pub adds: usize,
    pub lat_all: Vec<f64>,
    pub lat_add: Vec<f64>,
    pub failures: BTreeMap<String, u64>,
    pub samples: BTreeMap<String, String>,
    pub requests: BTreeMap<String, f64>,
    /// Addresses handed out twice according to the results.
    pub dup_results: u64,
    /// Results the pool objects contradict (an address recorded for another pod or in two pools, a reservation
    /// for another pod, a pool whose range cannot be read).
    pub pool_conflicts: u64,
    /// Pool entries plus reservations left after the round (W2: after the final DELs).
    pub left: u64,
    /// Pool entries not held by any successful ADD of the round (W1, W4: leaks of failed ADDs).
    pub orphans: u64,
    /// W3: the harness's own GET and PATCH of the pool, ms.
    pub server_ms: Option<(f64, f64)>,
}

pub fn summarise(outs: &[OpResult], wall: f64, requests: BTreeMap<String, f64>) -> RoundResult {
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

pub fn log_round(workload: &str, who: &str, round: usize, r: &RoundResult) {
    let fails: u64 = r.failures.values().sum();
    let reqs: f64 = r.requests.iter().filter(|(k, _)| k.starts_with("req ")).fold(0.0, |a, (_, v)| a + v);
    eprintln!(
        "bench: {workload} {who} round {}: {:.2} s, {} ops, {} failed, {:.2} req/op, dup {}, conflicts {}, left {}",
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
