//! The API server's own counters for the requests the plugins make: how many, how large, how long the server
//! spent on them.

use std::collections::BTreeMap;

/// Request counts (`req VERB resource`), request/response body bytes (`reqbytes`, `respbytes`) and the server's
/// time (`srvsec`) for the Whereabouts group and for Leases, from the API server's metrics.
pub fn api_counters(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some((head, value)) = line.rsplit_once(' ') else { continue };
        let Some((name, labels)) = head.split_once('{') else { continue };
        let label = |key: &str| {
            let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
            let end = labels[start..].find('"')? + start;
            Some(labels[start..end].to_string())
        };
        let prefix = match name {
            "apiserver_request_total" => "req",
            "apiserver_response_sizes_sum" => "respbytes",
            "apiserver_request_duration_seconds_sum" => "srvsec",
            "apiserver_request_body_size_bytes_sum" => "reqbytes",
            _ => continue,
        };
        let (g, r) = (label("group").unwrap_or_default(), label("resource").unwrap_or_default());
        if !(g == hereabouts_ipam::crd::GROUP || (g == "coordination.k8s.io" && r == "leases")) {
            continue;
        }
        let mut verb = label("verb").unwrap_or_default();
        // this one metric labels verbs in lower case; the others' upper case is what the table prints
        if prefix == "reqbytes" {
            verb = verb.to_uppercase();
        }
        *out.entry(format!("{prefix} {verb} {r}")).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    out
}

pub fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// The sum of the counters starting with `prefix` (e.g. `"req "`, `"srvsec "`).
pub fn sum(counters: &BTreeMap<String, f64>, prefix: &str) -> f64 {
    counters.iter().filter(|(k, _)| k.starts_with(prefix)).fold(0.0, |a, (_, v)| a + v)
}

/// Writes (PATCH and POST, any resource) among the counted requests.
pub fn writes(counters: &BTreeMap<String, f64>) -> f64 {
    sum(counters, "req PATCH ") + sum(counters, "req POST ")
}

/// The request kinds (`VERB resource`) the counters saw.
pub fn kinds<'a>(counters: impl IntoIterator<Item = &'a BTreeMap<String, f64>>) -> Vec<String> {
    let mut kinds: Vec<String> = counters
        .into_iter()
        .flat_map(|c| c.keys().filter_map(|k| k.strip_prefix("req ").map(str::to_string)))
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}
