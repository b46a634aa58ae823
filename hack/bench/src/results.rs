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
    /// The warm reserve's round: what the agents did around the burst.
    pub warm: Option<WarmFigures>,
}

/// A warm round beyond the burst itself: who answered the ADDs, what the hand-over cost and how long it and the
/// refill took.
#[derive(Debug, Default, Clone)]
pub struct WarmFigures {
    /// The reserve's size per node (`warm_addresses`).
    pub warm: usize,
    /// Burst ADDs the agents answered from their reserves (their "ADD done from the warm reserve" lines).
    pub served: u64,
    /// Successful burst ADDs that were not: they claimed their own address, with requests on their path; of them,
    /// those the binary did itself (its agent did not accept the invocation in time: no "served" line for it).
    pub own: u64,
    pub by_binary: u64,
    /// The agents' "took a warm slot" lines from the burst's start on.
    pub takes: u64,
    /// Hand-over rounds the agents logged ("warm hand-over") from the burst's start on, and the takes they handed.
    pub rounds: u64,
    pub handed: u64,
    /// The API server's request counts from the burst's start until every burst pod's entry and reservation
    /// carried its podref, the harness's own polls taken out: the hand-over, and the refill that runs beside it.
    pub handover: BTreeMap<String, f64>,
    /// Seconds from the burst's end until every entry and reservation was handed over; `None`: not within the wait.
    pub handed_after: Option<f64>,
    /// Seconds from the burst's end until every node's reserve was full again; `None`: not within the wait.
    pub refilled_after: Option<f64>,
    /// The first fill, before the burst: seconds from the nodes' first ADDs until every reserve was full, and the
    /// requests counted over it (the first ADDs' own included, the harness's polls taken out).
    pub fill_s: f64,
    pub fill_requests: f64,
    /// Warm slots the first fill claimed (nodes × `warm`).
    pub fill_slots: usize,
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
    if let Some(w) = &r.warm {
        let secs = |s: Option<f64>| s.map_or_else(|| "not within the wait".to_string(), |s| format!("{s:.2} s"));
        let handover: f64 = w.handover.values().sum();
        eprintln!(
            "bench:     warm: {} ADDs from the reserve, {} claimed their own ({} by the binary itself); {} takes, {} hand-over rounds handed {}; \
             {:.2} req/ADD from the burst's start until handed over; handed over {} and reserves full {} after the \
             burst's end; first fill {:.2} s, {:.2} req/slot",
            w.served,
            w.own,
            w.by_binary,
            w.takes,
            w.rounds,
            w.handed,
            handover / r.adds.max(1) as f64,
            secs(w.handed_after),
            secs(w.refilled_after),
            w.fill_s,
            w.fill_requests / w.fill_slots.max(1) as f64,
        );
    }
}
