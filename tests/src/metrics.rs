//! Reading `apiserver_request_total` to count what an operation cost the API server.

use std::collections::BTreeMap;

/// Requests to the hereabouts resources (group `whereabouts.cni.cncf.io`), by `VERB resource`, summed over codes.
pub fn whereabouts_requests(metrics: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in metrics.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let label = |name: &str| {
            let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
            let end = labels[start..].find('"')? + start;
            Some(&labels[start..end])
        };
        if label("group") != Some(hereabouts_ipam::crd::GROUP) {
            continue;
        }
        let key = format!("{} {}", label("verb").unwrap_or("?"), label("resource").unwrap_or("?"));
        *counts.entry(key).or_insert(0) += value.parse::<f64>().map(|v| v as u64).unwrap_or(0);
    }
    counts
}

/// `after - before`, dropping zero entries.
pub fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after.iter().map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0))).filter(|(_, v)| *v > 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_our_group_and_sums_codes() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="201",component="apiserver",dry_run="",group="whereabouts.cni.cncf.io",resource="ippools",scope="resource",subresource="",verb="POST",version="v1alpha1"} 3
apiserver_request_total{code="409",component="apiserver",dry_run="",group="whereabouts.cni.cncf.io",resource="ippools",scope="resource",subresource="",verb="POST",version="v1alpha1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 7
"#;
        let counts = whereabouts_requests(text);
        assert_eq!(counts, BTreeMap::from([("POST ippools".to_string(), 5)]));
    }
}
