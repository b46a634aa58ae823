//! Tests of the lenient loader of DEL and GC on configs the strict loader accepts, and on mutations of them: what
//! the strict loader accepts reads the same, and nothing fails or invents a range.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::release_tests::{Flat, KUBECONFIG, POD_ARGS, netconf, netconf_with, ranged, release, strict};
use super::*;

/// Configs the strict loader accepts (those of `tests.rs` and the Whereabouts forms), with their flat file.
fn valid() -> Vec<(Vec<u8>, &'static str, Flat)> {
    let static_only = json!({
        "type": "whereabouts",
        "addresses": [{"address": "192.168.100.5/24", "gateway": "192.168.100.1"}],
        "kubernetes": {"kubeconfig": KUBECONFIG},
    });
    vec![
        (netconf(static_only.clone()), "", Flat::None),
        (netconf(ranged(json!({}))), POD_ARGS, Flat::None),
        (netconf(ranged(json!({"network_name": null, "enable_overlapping_ranges": false}))), "", Flat::None),
        (
            netconf(ranged(json!({
                "ipRanges": [{"range": "10.1.0.0/24", "exclude": ["10.1.0.0/28"]}, {"range": "2001:db8::/64"}],
                "gateway": "10.0.0.1",
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.96.0.0/12", "gw": "10.0.0.254", "mtu": 1400}],
                "dns": {"nameservers": ["10.96.0.10", "fe80::1%eth0"], "domain": "cluster.local"},
                "log_file": "/var/log/hereabouts.log",
                "log_level": "VERBOSE",
                "reconciler_cron_expression": "30 4 * * *",
                "allocation_strategy": "random",
                "timeout_seconds": 20,
            }))),
            "FOO=bar;IgnoreUnknown=true;K8S_POD_NAME=p;K8S_POD_NAMESPACE=n",
            Flat::None,
        ),
        (netconf(ranged(json!({"range": "192.168.2.225/28"}))), "", Flat::None),
        (netconf(ranged(json!({"range": "10.0.0.5-10.0.0.20/24", "range_start": "10.0.0.5"}))), "", Flat::None),
        (netconf(ranged(json!({"range": "2001:db8:5422:5::-2001:db8:5422:5:7fff:ffff:ffff:ffff/64"}))), "", Flat::None),
        (netconf(ranged(json!({"range": "10.0.0.0/16", "node_slice_size": "/24"}))), "", Flat::None),
        (
            netconf_with(
                json!({"runtimeConfig": {"ips": ["10.0.0.5/24", "2001:db8::7"]}}),
                ranged(json!({"ipRanges": [{"range": "2001:db8::/64"}]})),
            ),
            "IP=10.0.0.5;K8S_POD_NAME=p",
            Flat::None,
        ),
        (
            netconf(ranged(json!({
                "datastore": "kubernetes",
                "etcd_host": "https://etcd:2379",
                "leader_lease_duration": 1500,
                "kubernetes": {"kubeconfig": KUBECONFIG, "k8s_api_root": "https://10.96.0.1"},
            }))),
            "",
            Flat::None,
        ),
        (
            netconf(ranged(json!({"range": null, "kubernetes": null}))),
            "",
            Flat::Text(
                r#"{"range": "10.5.0.0/16", "range_start": "10.5.1.0", "kubernetes": {"kubeconfig": "/flat/k"},
                    "datastore": "kubernetes", "enable_overlapping_ranges": false}"#,
            ),
        ),
        (netconf(static_only), "", Flat::Text(r#"{"network_name": "from-flat", "log_level": "error"}"#)),
    ]
}

fn assert_same(got: &ReleaseConfig, add: &IpamConfig) {
    assert_eq!(got.ranges, add.ranges);
    assert_eq!((&got.cni_version, &got.name, &got.network_name), (&add.cni_version, &add.name, &add.network_name));
    assert_eq!((&got.mode, got.timeout), (&add.mode.release_mode(), add.timeout));
    assert_eq!((&got.log_file, got.log_level, &got.pod), (&add.log_file, add.log_level, &add.pod));
    assert!(got.warnings.is_empty(), "{:#?}", got.warnings);
}

#[test]
fn configs_the_strict_loader_accepts_read_the_same() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (stdin, args, flat)) in valid().into_iter().enumerate() {
        let paths = flat.paths(dir.path(), &format!("{i}.conf"));
        let add = strict(&stdin, args, &paths).unwrap_or_else(|e| panic!("case {i} refused: {e}"));
        assert_same(&release(&stdin, args, &paths), &add);
    }
}

// --- mutations of valid configs ---

#[derive(Debug, Clone)]
enum Seg {
    Key(String),
    Index(usize),
}

/// Every member and element below `v`, as a path from it.
fn paths(v: &Value, prefix: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    let children: Vec<(Seg, &Value)> = match v {
        Value::Object(map) => map.iter().map(|(k, v)| (Seg::Key(k.clone()), v)).collect(),
        Value::Array(items) => items.iter().enumerate().map(|(i, v)| (Seg::Index(i), v)).collect(),
        _ => return,
    };
    for (seg, child) in children {
        prefix.push(seg);
        out.push(prefix.clone());
        paths(child, prefix, out);
        prefix.pop();
    }
}

/// The parent of `path` in `v` and the last segment.
fn parent<'v>(v: &'v mut Value, path: &[Seg]) -> Option<(&'v mut Value, Seg)> {
    let (last, init) = path.split_last()?;
    let mut cur = v;
    for seg in init {
        cur = match seg {
            Seg::Key(k) => cur.get_mut(k)?,
            Seg::Index(i) => cur.get_mut(*i)?,
        };
    }
    Some((cur, last.clone()))
}

fn camel(k: &str) -> String {
    if !k.contains('_') {
        let mut c = k.chars();
        return c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default();
    }
    let mut out = String::new();
    for (i, part) in k.split('_').enumerate() {
        let mut c = part.chars();
        match c.next() {
            Some(f) if i > 0 => out.extend(f.to_uppercase().chain(c)),
            Some(f) => out.extend(std::iter::once(f).chain(c)),
            None => {}
        }
    }
    out
}

const OTHER_TYPES: [fn() -> Value; 7] =
    [|| Value::Null, || json!(7), || json!(true), || json!("x"), || json!([]), || json!({}), || json!(["a"])];

const BAD_BOUNDS: [&str; 8] =
    ["10.9.9.9", "garbage", "10.0.0.300", "2001:db8::1", "10.0.0.0/33", "10.0.1.5-10.0.0.20/24", "", "10.0.0.255"];

/// Applies mutation `op` (0 drop, 1 camelCase, 2 another type, 3 a bad range bound) at the `pick`th path.
fn mutate(v: &mut Value, op: u8, pick: prop::sample::Index, variant: usize) {
    let mut all = Vec::new();
    paths(v, &mut Vec::new(), &mut all);
    if op == 3 {
        // a range bound: a value under `range`, `range_start`, `range_end`, `exclude` or `gateway`
        let bound = |p: &&Vec<Seg>| {
            p.iter()
                .rev()
                .find_map(|s| match s {
                    Seg::Key(k) => Some(k.clone()),
                    Seg::Index(_) => None,
                })
                .is_some_and(|k| ["range", "range_start", "range_end", "exclude", "gateway"].contains(&k.as_str()))
        };
        all.retain(|p| bound(&p));
    }
    if all.is_empty() {
        return;
    }
    let path = all[pick.index(all.len())].clone();
    let Some((parent, last)) = parent(v, &path) else { return };
    match (op, last, parent) {
        (0, Seg::Key(k), Value::Object(map)) => {
            map.remove(&k);
        }
        (0, Seg::Index(i), Value::Array(items)) => {
            items.remove(i);
        }
        (1, Seg::Key(k), Value::Object(map)) => {
            if let Some(x) = map.remove(&k) {
                map.insert(camel(&k), x);
            }
        }
        (2, seg, parent) => set(parent, &seg, OTHER_TYPES[variant % OTHER_TYPES.len()]()),
        (3, seg, parent) if !matches!(seg, Seg::Key(ref k) if k == "exclude") => {
            set(parent, &seg, json!(BAD_BOUNDS[variant % BAD_BOUNDS.len()]));
        }
        (3, seg, parent) => set(parent, &seg, json!([BAD_BOUNDS[variant % BAD_BOUNDS.len()]])),
        _ => {}
    }
}

fn set(parent: &mut Value, seg: &Seg, x: Value) {
    match seg {
        Seg::Key(k) => parent[k.as_str()] = x,
        Seg::Index(i) => parent[*i] = x,
    }
}

/// The CIDRs written in the `range` of `ipam` and of its `ipRanges` entries: whatever the lenient loader returns
/// must come from one of them.
fn cidrs_in(conf: &Value) -> Vec<ipnet::IpNet> {
    let ipam = &conf["ipam"];
    let mut ranges = vec![&ipam["range"]];
    if let Some(entries) = ipam["ipRanges"].as_array() {
        ranges.extend(entries.iter().map(|e| &e["range"]));
    }
    ranges
        .into_iter()
        .filter_map(Value::as_str)
        .filter_map(|r| r.split_once('-').map_or(r, |(_, cidr)| cidr).parse::<ipnet::IpNet>().ok())
        .map(|n| n.trunc())
        .collect()
}

const ARGS: [&str; 6] = [
    "",
    POD_ARGS,
    "FOO=bar;K8S_POD_NAME=p;K8S_POD_NAMESPACE=n",
    "K8S_POD_NAME",
    "IgnoreUnknown=maybe;K8S_POD_NAME=p",
    "IP=10.9.9.9;K8S_POD_NAME=p",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn mutated_configs_never_fail_and_never_invent_ranges(
        base in 0usize..11,
        mutations in prop::collection::vec((0u8..4, any::<prop::sample::Index>(), 0usize..64), 0..4),
        args in 0usize..ARGS.len(),
    ) {
        let valid: Vec<Vec<u8>> =
            valid().into_iter().filter(|(_, _, flat)| matches!(flat, Flat::None)).map(|(s, _, _)| s).collect();
        let mut conf: Value = serde_json::from_slice(&valid[base % valid.len()]).unwrap();
        for (op, pick, variant) in mutations {
            mutate(&mut conf, op, pick, variant);
        }
        let stdin = serde_json::to_vec(&conf).unwrap();
        let args = ARGS[args];
        let got = release(&stdin, args, &[]);
        match strict(&stdin, args, &[]) {
            Ok(add) => {
                prop_assert_eq!(&got.ranges, &add.ranges);
                prop_assert_eq!(&got.network_name, &add.network_name);
                prop_assert_eq!(&got.mode, &add.mode.release_mode());
                prop_assert_eq!(got.timeout, add.timeout);
                prop_assert!(got.warnings.is_empty(), "{:?}", got.warnings);
            }
            Err(e) => {
                let first = got.warnings.first().map(String::as_str).unwrap_or_default();
                prop_assert!(first.starts_with(&e.to_string()), "{} does not open {:?}", e, got.warnings);
            }
        }
        let written = cidrs_in(&conf);
        for r in &got.ranges {
            prop_assert!(written.contains(&r.cidr()), "{} is not in {:?}", r.cidr(), written);
        }
    }
}
