//! Everything measured, rendered as a side-by-side table and JSON.

mod summary;
mod table;

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::args::{Plugin, Sizes, Variant};
use crate::metrics;
use crate::results::RoundResult;
use crate::stats::p50_p99;
use crate::workloads::fit::FitRound;
use crate::workloads::{CeilingRow, FillResult, ceiling};
use summary::{Summary, WarmSummary, summary, summary_json};
use table::{Table, fmt};

pub type ByVariant = BTreeMap<Variant, Vec<RoundResult>>;
pub type ByLevel = BTreeMap<Variant, BTreeMap<usize, Vec<RoundResult>>>;

#[derive(Debug)]
pub struct Report {
    pub machine: String,
    pub versions: String,
    pub rounds: usize,
    pub sizes: Sizes,
    pub results: BTreeMap<&'static str, ByVariant>,
    pub growth: ByLevel,
    pub sliced_growth: ByLevel,
    pub ceiling: Option<Vec<CeilingRow>>,
    pub fill: Option<FillResult>,
    pub fit: Option<Vec<FitRound>>,
    pub startup: Option<BTreeMap<Plugin, (f64, Option<f64>)>>,
    pub notes: Vec<String>,
    pub total: f64,
}

const BOTH: [&str; 2] = ["hereabouts", "Whereabouts"];
const H_W: [(usize, usize, &str); 1] = [(0, 1, "H/W")];

/// Failures by CNI error, for the text under the table.
#[derive(Debug, Default)]
struct Failures(String);

impl Failures {
    fn add(&mut self, what: &str, who: &str, s: &Summary) {
        for (k, n) in &s.failures {
            self.0.push_str(&format!("{what} {who}: {n} × {k}\n"));
        }
    }
}

impl Report {
    fn get(&self, key: &str, v: Variant) -> Summary {
        summary(self.results.get(key).and_then(|by| by.get(&v)).map(Vec::as_slice).unwrap_or(&[]))
    }

    fn has(&self, key: &str, v: Variant) -> bool {
        self.results.get(key).is_some_and(|by| by.get(&v).is_some_and(|r| !r.is_empty()))
    }

    /// W1s compares with Whereabouts' single-pool W1: its own run of it when W1 did not run, else W1's.
    fn w1s_single(&self) -> Summary {
        if self.has("W1s", Variant::Whereabouts) {
            self.get("W1s", Variant::Whereabouts)
        } else {
            self.get("W1", Variant::Whereabouts)
        }
    }

    pub fn render(&self) -> (String, Value) {
        let mut t = Table::new();
        let mut doc = json!({
            "machine": self.machine, "versions": self.versions, "rounds": self.rounds,
            "crd_schema": "Whereabouts v0.9.2 (doc/crds), installed for the whole run",
            "identity": "admin (system:masters) kubeconfig for both",
            "sizes": format!("{:?}", self.sizes), "total_s": self.total, "notes": self.notes,
        });
        let mut failures = Failures::default();
        let s = &self.sizes;
        let titles = [
            (
                "W1",
                format!(
                    "W1 burst: {} ADDs, {} at a time, {} nodes, 198.18.4.0/22, overlapping on",
                    s.burst_adds, s.burst_parallel, s.nodes
                ),
            ),
            (
                "W1r",
                "W1r diagnostic, hereabouts only: W1 with allocation_strategy \"random\" (not a target measurement)"
                    .to_string(),
            ),
        ];
        let two = |key: &str| {
            vec![
                (Variant::Hereabouts, self.get(key, Variant::Hereabouts)),
                (Variant::Whereabouts, self.get(key, Variant::Whereabouts)),
            ]
        };
        for (key, title) in &titles {
            if self.results.contains_key(key) {
                t.columns(&BOTH, &H_W);
                doc[*key] = burst_section(&mut t, &mut failures, key, title, &two(key));
            }
        }
        if self.results.contains_key("W1s") {
            let title = format!(
                "W1s burst in node slices: W1 ({} ADDs, {} at a time, {} nodes, 198.18.4.0/22, overlapping on) with \
                 node_slice_size {}, by the binary alone, handed to each node's agent, and through the agent with \
                 warm_addresses {}; Whereabouts single-pool W1 beside it",
                s.burst_adds,
                s.burst_parallel,
                s.nodes,
                crate::workloads::W1S_SLICE,
                crate::workloads::W1S_WARM
            );
            t.columns(
                &["hereabouts slice", "+ agent", "+ warm", "Whereabouts", "Wh. fast IPAM"],
                &[(0, 4, "Hs/Wf"), (1, 3, "Ha/W"), (1, 4, "Ha/Wf"), (2, 3, "Hw/W"), (2, 4, "Hw/Wf")],
            );
            let cols = vec![
                (Variant::HereaboutsSlice, self.get("W1s", Variant::HereaboutsSlice)),
                (Variant::HereaboutsAgent, self.get("W1s", Variant::HereaboutsAgent)),
                (Variant::HereaboutsWarm, self.get("W1s", Variant::HereaboutsWarm)),
                (Variant::Whereabouts, self.w1s_single()),
                (Variant::WhereaboutsFast, self.get("W1s", Variant::WhereaboutsFast)),
            ];
            doc["W1s"] = burst_section(&mut t, &mut failures, "W1s", &title, &cols);
        }
        if self.results.contains_key("large") {
            use crate::workloads::large::*;
            let title = format!(
                "Large burst (Spiderpool's benchmark shape): {} ADDs over {LARGE_NODES} nodes, {} at a time, \
                 {LARGE_RANGE}, overlapping on; slices {LARGE_SLICE}; warm_addresses {LARGE_WARM}",
                s.large_adds, s.large_parallel
            );
            t.columns(
                &[
                    "hereabouts",
                    "h. + agent",
                    "h. slice",
                    "h. slice + agent",
                    "h. slice + warm",
                    "Whereabouts",
                    "Wh. fast IPAM",
                ],
                &[(1, 5, "H+a/W"), (3, 5, "Ha/W"), (3, 6, "Ha/Wf"), (4, 5, "Hw/W"), (4, 6, "Hw/Wf")],
            );
            let cols: Vec<(Variant, Summary)> = LARGE_VARIANTS.iter().map(|&v| (v, self.get("large", v))).collect();
            doc["large"] = burst_section(&mut t, &mut failures, "large", &title, &cols);
        }
        if self.has("W1", Variant::Hereabouts) || self.has("W1s", Variant::HereaboutsSlice) {
            doc["time_per_add"] = self.time_per_add(&mut t);
        }
        for (key, title) in [
            (
                "W4",
                format!(
                    "W4 burst, enable_overlapping_ranges false: {} ADDs, {} at a time, 198.18.8.0/22",
                    s.burst_adds, s.burst_parallel
                ),
            ),
            (
                "W2",
                format!(
                    "W2 churn: {} ops ADD/DEL, ~{} live, {} at a time, 198.18.12.0/22, all DELeted at the end",
                    s.churn_ops, s.churn_live, s.churn_parallel
                ),
            ),
        ] {
            if self.results.contains_key(key) {
                t.columns(&BOTH, &H_W);
                doc[key] = burst_section(&mut t, &mut failures, key, &title, &two(key));
            }
        }
        if !self.growth.is_empty() {
            doc["W3"] = self.growth_section(&mut t, &mut failures);
        }
        if !self.sliced_growth.is_empty() {
            doc["W3s"] = self.sliced_growth_section(&mut t, &mut failures);
        }
        if let Some(fill) = &self.fill {
            doc["fill"] = fill_section(&mut t, &mut failures, fill);
        }
        if let Some(fit) = &self.fit {
            doc["fit"] = fit_section(&mut t, &mut failures, fit);
        }
        if let Some(rows) = &self.ceiling {
            doc["ceiling"] = self.ceiling_section(&mut t, rows);
        }
        if let Some(st) = &self.startup {
            t.columns(&BOTH, &H_W);
            t.section(
                "start-up: one VERSION invocation (wall: median of 10; peak RSS: max of 3 under /usr/bin/time -v)",
            );
            let (hw, hr) = st[&Plugin::Hereabouts];
            let (ww, wr) = st[&Plugin::Whereabouts];
            t.num("wall time, ms", &[hw, ww], 1);
            t.num("peak RSS, MiB", &[hr.unwrap_or(f64::NAN), wr.unwrap_or(f64::NAN)], 1);
            doc["startup"] = json!({
                "hereabouts": {"wall_ms": hw, "peak_rss_mib": hr},
                "whereabouts": {"wall_ms": ww, "peak_rss_mib": wr},
            });
        }

        let mut text = format!(
            "machine: {}\nversions: {}\nCRD schema: Whereabouts v0.9.2's own (both plugins), identity: admin kubeconfig for both\n\
             rounds: {} per workload and plugin, alternating; total bench time {:.0} s\n\
             H/W = hereabouts value / Whereabouts value. API requests are counted from apiserver_request_total for group\n\
             whereabouts.cni.cncf.io plus coordination.k8s.io leases (the API server's own lease renewals, ~1 per 10 s, are in it).\n",
            self.machine, self.versions, self.rounds, self.total
        );
        if self.results.contains_key("W1s") || !self.sliced_growth.is_empty() {
            text.push_str(
                "Hs = hereabouts in slice mode (claims its slices), Wf = Whereabouts fast IPAM (node_slice_size; slices\n\
                 assigned by its node-slice controller), W = Whereabouts with one pool per range. Ha (W1s, large) =\n\
                 through each node's agent, which claims its node's slice as the round's NAD appears (while half the\n\
                 range is free), before the timed burst, as Wf's controller assigns them; in W3s its ADDs claim.\n",
            );
        }
        if ["W1s", "large"].iter().any(|k| self.has(k, Variant::HereaboutsWarm)) {
            text.push_str(
                "Hw = hereabouts slice + agent + warm (warm_addresses): before the timed burst, one ADD per node (its pod\n\
                 stays) starts the node's reserve, and the bench waits until every reserve is full. An ADD answered from\n\
                 the reserve sends no request (the agent answers after a local journal fsync): its 'API requests per op'\n\
                 rows, counted over the burst as for the others, are the agents' background hand-over and refill. The\n\
                 hand-over rows count from the burst's start until every burst pod's entry and reservation carries its\n\
                 podref (the refill runs in the same window; the bench's own reads are taken out).\n",
            );
        }
        text.push('\n');
        text.push_str(&t.render());
        if !failures.0.is_empty() {
            text.push_str("\nfailures by CNI error (code: message, numbers folded to #):\n");
            text.push_str(&failures.0);
        }
        if !self.notes.is_empty() {
            text.push_str("\nnotes:\n");
            for n in &self.notes {
                text.push_str(&format!("- {n}\n"));
            }
        }
        (text, doc)
    }

    /// Where an ADD's time goes, for hereabouts in W1 and W1s: the API server's time per request kind (from its
    /// own histograms), against the wall time of the ADD process from spawn to exit. What is not server time is
    /// the process's own: start-up, TLS, the host lock, backoff between retries.
    fn time_per_add(&self, t: &mut Table) -> Value {
        let cols: Vec<(&str, Summary)> = [("W1", Variant::Hereabouts), ("W1s", Variant::HereaboutsSlice)]
            .into_iter()
            .filter(|(k, v)| self.has(k, *v))
            .map(|(k, v)| (k, self.get(k, v)))
            .collect();
        let names: Vec<String> =
            cols.iter().flat_map(|(k, _)| [format!("{k} req/ADD"), format!("{k} server ms/ADD")]).collect();
        t.columns(&names.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        t.section(
            "where an ADD's time goes, hereabouts: API server time per request kind, per ADD (from its own histograms)",
        );
        let kinds = metrics::kinds(cols.iter().map(|(_, s)| &s.per_op));
        let mut doc = json!({});
        for kind in &kinds {
            let values: Vec<f64> = cols
                .iter()
                .flat_map(|(_, s)| [s.per(&format!("req {kind}")), 1000.0 * s.per(&format!("srvsec {kind}"))])
                .collect();
            // two digits for counts, one for milliseconds
            let cells: Vec<String> = values.chunks(2).flat_map(|v| [fmt(v[0], 2), fmt(v[1], 1)]).collect();
            t.text(&format!("  {kind}"), cells);
        }
        let total: Vec<String> =
            cols.iter().flat_map(|(_, s)| [fmt(s.req_per_op, 2), fmt(s.server_ms_per_op(), 1)]).collect();
        t.text("all counted requests", total);
        let both = |f: &dyn Fn(&Summary) -> f64, digits: usize| -> Vec<String> {
            cols.iter().flat_map(|(_, s)| [String::new(), fmt(f(s), digits)]).collect()
        };
        t.text("ADD process, spawn to exit, p50, ms", both(&|s| s.add_lat[0], 0));
        t.text("ADD process, spawn to exit, mean, ms", both(&|s| s.add_mean, 0));
        t.text("  outside the API server (mean - server ms/ADD)", both(&|s| s.add_mean - s.server_ms_per_op(), 0));
        for (k, s) in &cols {
            doc[*k] = json!({
                "requests_per_add": kinds.iter().map(|kind| (kind.clone(), s.per(&format!("req {kind}")))).collect::<BTreeMap<_, _>>(),
                "server_ms_per_add": kinds.iter().map(|kind| (kind.clone(), 1000.0 * s.per(&format!("srvsec {kind}")))).collect::<BTreeMap<_, _>>(),
                "add_wall_ms_p50": s.add_lat[0], "add_wall_ms_mean": s.add_mean,
                "server_ms_per_add_total": s.server_ms_per_op(),
            });
        }
        doc
    }

    fn growth_section(&self, t: &mut Table, failures: &mut Failures) -> Value {
        t.columns(&BOTH, &H_W);
        t.section(&format!(
            "W3 growth: {} single ADDs into {} pre-filled to N allocations, overlapping off for both",
            self.sizes.growth_adds,
            crate::workloads::W3_RANGE
        ));
        let mut w3 = serde_json::Map::new();
        let levels = &self.sizes.growth_levels;
        let at = |v: Variant, level: usize| {
            summary(self.growth.get(&v).and_then(|m| m.get(&level)).map(Vec::as_slice).unwrap_or(&[]))
        };
        let base = (at(Variant::Hereabouts, levels[0]).lat[0], at(Variant::Whereabouts, levels[0]).lat[0]);
        for &level in levels {
            let (h, w) = (at(Variant::Hereabouts, level), at(Variant::Whereabouts, level));
            t.num(&format!("N={level}: ADD p50, ms"), &[h.lat[0], w.lat[0]], 0);
            t.num(&format!("N={level}: ADD p95, ms"), &[h.lat[1], w.lat[1]], 0);
            t.num(&format!("N={level}: ADD max, ms"), &[h.lat[3], w.lat[3]], 0);
            t.num(&format!("N={level}: p50 / p50 at N={}", levels[0]), &[h.lat[0] / base.0, w.lat[0] / base.1], 2);
            t.num(&format!("N={level}: API requests per ADD"), &[h.req_per_op, w.req_per_op], 2);
            t.num(&format!("N={level}: harness GET pool, ms"), &[h.server_ms.0, w.server_ms.0], 0);
            t.num(&format!("N={level}: harness merge-PATCH pool, ms"), &[h.server_ms.1, w.server_ms.1], 0);
            for (prefix, label) in
                [("reqbytes ", "request body bytes per ADD"), ("respbytes ", "response bytes per ADD")]
            {
                t.num(
                    &format!("N={level}: {label}"),
                    &[metrics::sum(&h.per_op, prefix), metrics::sum(&w.per_op, prefix)],
                    0,
                );
            }
            t.text(
                &format!("N={level}: failed / held twice"),
                vec![
                    format!("{} / {}", h.failed, h.dup_results + h.pool_conflicts),
                    format!("{} / {}", w.failed, w.dup_results + w.pool_conflicts),
                ],
            );
            failures.add(&format!("W3@{level}"), "hereabouts", &h);
            failures.add(&format!("W3@{level}"), "Whereabouts", &w);
            w3.insert(level.to_string(), json!({"hereabouts": summary_json(&h), "whereabouts": summary_json(&w)}));
        }
        Value::Object(w3)
    }

    fn sliced_growth_section(&self, t: &mut Table, failures: &mut Failures) -> Value {
        let s = &self.sizes;
        t.columns(&["hereabouts slice", "+ agent", "Wh. fast IPAM"], &[(0, 2, "Hs/Wf"), (1, 2, "Ha/Wf")]);
        t.section(&format!(
            "W3s growth in slices: {} single ADDs into {} in {} slices over {} nodes, N allocations pre-filled {} per \
             slice (slices assigned round-robin); each ADD on a node owning a slice with room; overlapping off; by \
             the binary alone and handed to each node's agent",
            s.growth_adds,
            crate::workloads::W3S_RANGE,
            crate::workloads::W3S_SLICE,
            s.sliced_growth_nodes,
            crate::workloads::W3S_PER_SLICE
        ));
        let mut doc = serde_json::Map::new();
        let levels = &s.sliced_growth_levels;
        let at = |v: Variant, level: usize| {
            summary(self.sliced_growth.get(&v).and_then(|m| m.get(&level)).map(Vec::as_slice).unwrap_or(&[]))
        };
        let variants = [Variant::HereaboutsSlice, Variant::HereaboutsAgent, Variant::WhereaboutsFast];
        let base: Vec<f64> = variants.iter().map(|&v| at(v, levels[0]).lat[0]).collect();
        for &level in levels {
            let r: Vec<_> = variants.iter().map(|&v| at(v, level)).collect();
            let each = |f: &dyn Fn(&_) -> f64| r.iter().map(f).collect::<Vec<f64>>();
            t.num(&format!("N={level}: ADD p50, ms"), &each(&|x: &Summary| x.lat[0]), 0);
            t.num(&format!("N={level}: ADD p99, ms"), &each(&|x: &Summary| x.lat[2]), 0);
            t.num(&format!("N={level}: ADD max, ms"), &each(&|x: &Summary| x.lat[3]), 0);
            let growth: Vec<f64> = r.iter().zip(&base).map(|(x, b)| x.lat[0] / b).collect();
            t.num(&format!("N={level}: p50 / p50 at N={}", levels[0]), &growth, 2);
            t.num(&format!("N={level}: API requests per ADD"), &each(&|x: &Summary| x.req_per_op), 2);
            t.num(&format!("N={level}: API server time per ADD, ms"), &each(&|x: &Summary| x.server_ms_per_op()), 0);
            t.num(
                &format!("N={level}: response bytes per ADD"),
                &each(&|x: &Summary| metrics::sum(&x.per_op, "respbytes ")),
                0,
            );
            if let Some(single) = self.growth.get(&Variant::Hereabouts).and_then(|m| m.get(&level)) {
                let p50 = summary(single).lat[0];
                t.text(
                    &format!("N={level}: hereabouts single pool (W3) ADD p50, ms"),
                    vec![fmt(p50, 0), String::new(), String::new()],
                );
            }
            t.text(
                &format!("N={level}: failed / held twice"),
                r.iter().map(|x| format!("{} / {}", x.failed, x.dup_results + x.pool_conflicts)).collect(),
            );
            let mut row = serde_json::Map::new();
            for (v, x) in variants.iter().zip(&r) {
                failures.add(&format!("W3s@{level}"), v.label(), x);
                row.insert(v.json_key().to_string(), summary_json(x));
            }
            doc.insert(level.to_string(), Value::Object(row));
        }
        Value::Object(doc)
    }

    fn ceiling_section(&self, t: &mut Table, rows: &[CeilingRow]) -> Value {
        t.columns(&["per s", "p50 ms", "p99 ms", "server ms/req", "failed"], &[]);
        t.section(&format!(
            "ceiling, no CNI: the bench's own client, {} guarded JSON patches (test null + add of one small entry, \
             distinct keys) per row, or creates; a bound is a row's rate (objects×writers) over a plugin's writes per ADD",
            self.sizes.ceiling_ops
        ));
        let mut doc = json!({"rows": []});
        for r in rows {
            let (p50, p99) = p50_p99(&r.lat);
            t.text(
                &r.label,
                vec![
                    fmt(r.per_s(), 1),
                    fmt(p50, 0),
                    fmt(p99, 0),
                    fmt(r.server_ms, 1),
                    format!("{} / {}", r.failed, r.ops),
                ],
            );
            doc["rows"].as_array_mut().unwrap().push(json!({
                "label": r.label, "ops": r.ops, "failed": r.failed, "errors": r.errors, "wall_s": r.wall,
                "per_s": r.per_s(), "p50_ms": p50, "p99_ms": p99, "server_ms_per_request": r.server_ms,
            }));
        }
        // a plugin's ADDs/s against the rate the server sustains for its writes
        let rate = |label: &str| rows.iter().find(|r| r.label == label).map(CeilingRow::per_s);
        for (key, v, label, short) in [
            ("W1", Variant::Hereabouts, ceiling::ONE_OBJECT_32, "1×32"),
            ("W1s", Variant::HereaboutsSlice, ceiling::EIGHT_OBJECTS, "8×1"),
        ] {
            let (Some(per_s), true) = (rate(label), self.has(key, v)) else { continue };
            let s = self.get(key, v);
            let writes = metrics::writes(&s.per_op);
            let bound = per_s / writes;
            t.text(&format!("hereabouts {key}: writes (PATCH + POST) per ADD"), vec![fmt(writes, 2)]);
            t.text(&format!("  bound: {short} patches/s / writes, ADDs/s"), vec![fmt(bound, 1)]);
            t.text(&format!("  {key} ADDs/s / bound"), vec![fmt(s.adds_per_s / bound, 2)]);
            let mut entry = json!({"ceiling_row": label, "writes_per_add": writes, "adds_per_s_bound": bound,
                              "adds_per_s": s.adds_per_s, "fraction": s.adds_per_s / bound});
            // In W1 most writes are reservation creates, each to an object of its own, and the writers racing for
            // one reservation reach the pool one at a time: its pool PATCHes alone, in series, are the tighter
            // bound.
            if key == "W1"
                && let Some(series) = rate(ceiling::ONE_OBJECT_SERIES)
            {
                let patches = s.per("req PATCH ippools");
                let bound = series / patches;
                t.text("  bound: 1×1 patches/s / pool PATCHes, ADDs/s", vec![fmt(bound, 1)]);
                t.text(&format!("  {key} ADDs/s / bound"), vec![fmt(s.adds_per_s / bound, 2)]);
                entry["pool_patches_in_series"] = json!({"ceiling_row": ceiling::ONE_OBJECT_SERIES,
                    "patches_per_add": patches, "adds_per_s_bound": bound, "fraction": s.adds_per_s / bound});
            }
            doc[key] = entry;
        }
        doc
    }
}

/// W1, W1r, W1s, W4, W2: one value column per variant, ratios as the table's columns say.
fn burst_section(t: &mut Table, failures: &mut Failures, key: &str, title: &str, cols: &[(Variant, Summary)]) -> Value {
    let w2 = key == "W2";
    t.section(&format!("{title} ({} rounds each)", cols[0].1.rounds));
    let vals = |f: &dyn Fn(&Summary) -> f64| -> Vec<f64> { cols.iter().map(|(_, s)| f(s)).collect() };
    let texts = |f: &dyn Fn(&Summary) -> String| -> Vec<String> { cols.iter().map(|(_, s)| f(s)).collect() };
    t.num("wall time, s (median of rounds)", &vals(&|s| s.wall), 2);
    t.num("ADDs/s (median of rounds)", &vals(&|s| s.adds_per_s), 1);
    if w2 {
        t.num("ops/s (median of rounds)", &vals(&|s| s.ops_per_s), 1);
    }
    let lab = if w2 { "op" } else { "ADD" };
    for (i, p) in ["p50", "p95", "p99", "max"].iter().enumerate() {
        t.num(&format!("{lab} latency {p}, ms"), &vals(&|s| s.lat[i]), 0);
    }
    if w2 {
        t.num("ADD latency p99, ms", &vals(&|s| s.add_lat[2]), 0);
    }
    t.text("failed ops / all ops", texts(&|s| format!("{} / {}", s.failed, s.ops)));
    t.num("API requests per op (whereabouts group + leases)", &vals(&|s| s.req_per_op), 2);
    for kind in metrics::kinds(cols.iter().map(|(_, s)| &s.per_op)) {
        t.num(&format!("  {kind}"), &vals(&|s| s.per(&format!("req {kind}"))), 2);
    }
    for (prefix, label) in [("reqbytes ", "request body bytes per op"), ("respbytes ", "response bytes per op")] {
        t.num(label, &vals(&|s| metrics::sum(&s.per_op, prefix)), 0);
    }
    // the API server's own time: where a plugin's requests wait on each other
    t.num("API server time per op, ms", &vals(&|s| s.server_ms_per_op()), 0);
    t.num("  per PATCH ippools, ms", &vals(&|s| s.server_ms_per_request("PATCH ippools").unwrap_or(0.0)), 0);
    t.text("held twice: results / pool objects", texts(&|s| format!("{} / {}", s.dup_results, s.pool_conflicts)));
    if w2 {
        t.text("left allocated (pool entries + reservations)", texts(&|s| s.left.to_string()));
    } else {
        t.text("pool entries no live pod holds (leaks)", texts(&|s| s.orphans.to_string()));
    }
    if cols.iter().any(|(_, s)| s.warm.is_some()) {
        warm_rows(t, cols);
    }
    let mut doc = json!({"title": title});
    for (v, s) in cols {
        failures.add(key, v.label(), s);
        doc[v.json_key()] = summary_json(s);
    }
    doc
}

/// The warm reserve's rows, beside columns without one: who answered the ADDs, the requests on their path, the
/// hand-over and the refill.
fn warm_rows(t: &mut Table, cols: &[(Variant, Summary)]) {
    let warm = |f: &dyn Fn(&WarmSummary) -> f64| -> Vec<f64> {
        cols.iter().map(|(_, s)| s.warm.as_ref().map_or(f64::NAN, f)).collect()
    };
    let texts = |f: &dyn Fn(&WarmSummary) -> String| -> Vec<String> {
        cols.iter().map(|(_, s)| s.warm.as_ref().map_or_else(|| "-".to_string(), f)).collect()
    };
    t.text(
        "ADDs from the warm reserve / that claimed their own (by the binary itself)",
        texts(&|w| format!("{} / {} ({})", w.served, w.own, w.by_binary)),
    );
    let on_path = cols
        .iter()
        .map(|(_, s)| match &s.warm {
            None => fmt(s.req_per_op, 2),
            Some(w) if w.own == 0 => "0 (by construction)".to_string(),
            Some(w) => format!("0 for {}, ? for {}", w.served, w.own),
        })
        .collect();
    t.text("API requests on the ADDs' path per ADD", on_path);
    t.num("hand-over: API requests per ADD, burst start to all handed over", &warm(&|w| w.handover_per_add()), 2);
    for kind in metrics::kinds(cols.iter().filter_map(|(_, s)| s.warm.as_ref().map(|w| &w.handover))) {
        t.num(&format!("  {kind}"), &warm(&|w| w.handover.get(&format!("req {kind}")).copied().unwrap_or(0.0)), 2);
    }
    t.num("all handed over, s after the burst's end (median)", &warm(&|w| w.handed_after), 2);
    t.num("reserves full again, s after the burst's end (median)", &warm(&|w| w.refilled_after), 2);
    if cols.iter().any(|(_, s)| s.warm.as_ref().is_some_and(|w| w.not_handed + w.not_refilled > 0)) {
        t.text(
            "rounds not handed over / not refilled in time",
            texts(&|w| format!("{} / {}", w.not_handed, w.not_refilled)),
        );
    }
    t.text(
        "agents' logs: takes / hand-over rounds / handed",
        texts(&|w| format!("{} / {} / {}", w.takes, w.rounds, w.handed)),
    );
    t.num("first fill before the burst, s (median)", &warm(&|w| w.fill_s), 1);
    t.num("  API requests per warm slot (the first ADDs' with them)", &warm(&|w| w.fill_per_slot), 2);
}

/// Fit: 64 nodes on a /22, fixed /26 slices beside adaptive ones and Whereabouts' fast IPAM.
fn fit_section(t: &mut Table, failures: &mut Failures, rounds: &[FitRound]) -> Value {
    use crate::workloads::fit::{FIT_MIN_SLICE, FIT_NODES, FIT_PER_NODE, FIT_RANGE, FIT_SLICE};
    let labels: Vec<&str> = rounds.iter().map(|r| r.variant.label()).collect();
    t.columns(&labels, &[]);
    t.section(&format!(
        "fit: {FIT_NODES} nodes on {FIT_RANGE}, {FIT_PER_NODE} ADDs each ({} in all), fixed {FIT_SLICE} slices \
         (16) or adaptive {FIT_MIN_SLICE} first, up to {FIT_SLICE}; overlapping on",
        FIT_NODES * FIT_PER_NODE
    ));
    let sums: Vec<Summary> = rounds.iter().map(|r| summary(std::slice::from_ref(&r.res))).collect();
    let nums = |f: &dyn Fn(&Summary) -> f64| sums.iter().map(f).collect::<Vec<f64>>();
    let texts = |f: &dyn Fn(&FitRound, &Summary) -> String| rounds.iter().zip(&sums).map(|(r, s)| f(r, s)).collect();
    t.text("failed ADDs / all ADDs", texts(&|_, s| format!("{} / {}", s.failed, s.ops)));
    t.text("nodes with a slice of their own", texts(&|r, _| format!("{} / {FIT_NODES}", r.owners)));
    t.text("ADDs given another node's address", texts(&|r, _| r.borrowed.to_string()));
    t.text("slices listed", texts(&|r, _| r.slices.to_string()));
    t.num("wall time, s", &nums(&|s| s.wall), 2);
    t.num("ADDs/s", &nums(&|s| s.adds_per_s), 1);
    t.num("ADD latency p50, ms", &nums(&|s| s.add_lat[0]), 0);
    t.num("ADD latency p99, ms", &nums(&|s| s.add_lat[2]), 0);
    t.num("API requests per ADD", &nums(&|s| s.req_per_op), 2);
    t.text("held twice: results / pool objects", texts(&|_, s| format!("{} / {}", s.dup_results, s.pool_conflicts)));
    t.text("pool entries no live pod holds (leaks)", texts(&|_, s| s.orphans.to_string()));
    let mut doc = json!({});
    for (r, s) in rounds.iter().zip(&sums) {
        // Whereabouts' nodes without a slice fail by design here: that is the row's point, not a harness failure
        if r.variant != crate::workloads::fit::FitVariant::WhereaboutsFast {
            failures.add("fit", r.variant.label(), s);
        }
        doc[r.variant.label()] = json!({
            "owners": r.owners, "slices": r.slices, "borrowed": r.borrowed, "summary": summary_json(s),
        });
    }
    doc
}

fn fill_section(t: &mut Table, failures: &mut Failures, f: &FillResult) -> Value {
    let s = summary(std::slice::from_ref(&f.res));
    t.columns(&["hereabouts slice"], &[]);
    t.section(&format!(
        "fill: {} in {} slices over {} nodes, {} ADDs (every usable address), {} at a time, overlapping on; then one \
         more ADD must fail with code 100",
        f.range, f.slice, f.nodes, f.usable, f.parallel
    ));
    t.num("wall time, s", &[s.wall], 2);
    t.num("ADDs/s", &[s.adds_per_s], 1);
    t.num("ADD latency p50, ms", &[s.add_lat[0]], 0);
    t.num("ADD latency p99, ms", &[s.add_lat[2]], 0);
    t.num("ADD latency max, ms", &[s.add_lat[3]], 0);
    t.text("failed ADDs / all ADDs", vec![format!("{} / {}", s.failed, s.ops)]);
    t.text("addresses given / usable", vec![format!("{} / {}", f.given, f.usable)]);
    let extra = match (&f.extra, f.extra_code) {
        (None, _) => "succeeded (must not)".to_string(),
        (Some(_), Some(100)) => "code 100".to_string(),
        (Some(e), _) => e.chars().take(40).collect(),
    };
    t.text("the ADD after the fill", vec![extra]);
    t.text("filled", vec![if f.filled() { "yes" } else { "NO" }.to_string()]);
    t.text("slices owned / listed, owner nodes", vec![format!("{} / {}, {}", f.slices_owned, f.slices, f.owners)]);
    t.num("API requests per ADD", &[s.req_per_op], 2);
    t.num("API server time per ADD, ms", &[s.server_ms_per_op()], 0);
    t.text("held twice: results / pool objects", vec![format!("{} / {}", s.dup_results, s.pool_conflicts)]);
    t.text("pool entries no live pod holds (leaks)", vec![s.orphans.to_string()]);
    failures.add("fill", Variant::HereaboutsSlice.label(), &s);
    if let Some(e) = f.extra.as_ref().filter(|_| f.extra_code != Some(100)) {
        failures.0.push_str(&format!("fill {}: the ADD after the fill: {e}\n", Variant::HereaboutsSlice.label()));
    }
    json!({
        "range": f.range, "slice": f.slice, "nodes": f.nodes, "usable": f.usable, "given": f.given,
        "extra_add_error": f.extra, "extra_add_code": f.extra_code, "filled": f.filled(),
        "slices": f.slices, "slices_owned": f.slices_owned, "owners": f.owners, "summary": summary_json(&s),
    })
}
