//! Tests of the lenient loader of DEL and GC: configs upstream Whereabouts accepted and the strict loader refuses
//! still give their ranges (configs the strict loader accepts: `release_props.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::names::pool_name;

pub(super) const KUBECONFIG: &str = "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig";
pub(super) const POD_ARGS: &str =
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod-0;K8S_POD_INFRA_CONTAINER_ID=c1";

pub(super) use super::tests::{merge_into, netconf, netconf_with};

/// A named network with one range.
pub(super) fn ranged(patch: Value) -> Value {
    let mut ipam = json!({
        "type": "whereabouts",
        "range": "10.0.0.0/24",
        "network_name": "net-a",
        "kubernetes": {"kubeconfig": KUBECONFIG},
    });
    merge_into(&mut ipam, patch);
    ipam
}

pub(super) fn release(stdin: &[u8], cni_args: &str, paths: &[PathBuf]) -> ReleaseConfig {
    load_for_release_with_paths(&Input { stdin, cni_args }, paths)
}

pub(super) fn strict(stdin: &[u8], cni_args: &str, paths: &[PathBuf]) -> Result<IpamConfig, ConfigError> {
    load_with_paths(&Input { stdin, cni_args }, paths)
}

fn pool_names(network_name: &str, ranges: &[IpRange]) -> Vec<String> {
    ranges.iter().map(|r| pool_name(network_name, r.cidr())).collect()
}

/// The flat file of a case.
#[derive(Debug, Clone, Copy)]
pub(super) enum Flat {
    None,
    Text(&'static str),
    /// A directory where the file should be: it exists and cannot be read.
    Dir,
}

impl Flat {
    pub(super) fn paths(self, dir: &Path, name: &str) -> Vec<PathBuf> {
        match self {
            Flat::None => vec![],
            Flat::Text(text) => {
                let path = dir.join(name);
                std::fs::write(&path, text).unwrap();
                vec![path]
            }
            Flat::Dir => vec![dir.to_path_buf()],
        }
    }
}

/// A config Whereabouts v0.9.2 accepted, as given and as corrected so that the strict loader accepts it.
struct Upstream {
    what: &'static str,
    stdin: Vec<u8>,
    args: &'static str,
    flat: Flat,
    corrected: Vec<u8>,
    corrected_args: &'static str,
    corrected_flat: Flat,
    /// A part of a warning: the key passed over.
    key: &'static str,
}

fn case(what: &'static str, stdin: Vec<u8>, corrected: Vec<u8>, key: &'static str) -> Upstream {
    Upstream {
        what,
        stdin,
        args: POD_ARGS,
        flat: Flat::None,
        corrected,
        corrected_args: POD_ARGS,
        corrected_flat: Flat::None,
        key,
    }
}

fn with_version(version: Option<&str>) -> Vec<u8> {
    let top = match version {
        Some(v) => json!({"cniVersion": v}),
        None => json!({"cniVersion": null}),
    };
    netconf_with(top, ranged(json!({})))
}

fn upstream_accepted() -> Vec<Upstream> {
    let plain = || netconf(ranged(json!({})));
    let two = |entry: Value| netconf(ranged(json!({"ipRanges": [{"range": "10.1.0.0/24"}, entry]})));
    let mut cases = vec![
        case("camelCase rangeStart", netconf(ranged(json!({"rangeStart": "10.0.0.10"}))), plain(), "ipam.rangeStart"),
        // Whereabouts ignored these too, so ADD never used them: the pool stays unnamed, overlapping stays on
        case(
            "camelCase networkName",
            netconf(ranged(json!({"network_name": null, "networkName": "net-b"}))),
            netconf(ranged(json!({"network_name": null}))),
            "ipam.networkName",
        ),
        case(
            "camelCase enableOverlappingRanges",
            netconf(ranged(json!({"enableOverlappingRanges": false}))),
            plain(),
            "ipam.enableOverlappingRanges",
        ),
        case(
            "camelCase in an ipRanges entry",
            two(json!({"range": "10.2.0.0/24", "rangeEnd": "10.2.0.9"})),
            two(json!({"range": "10.2.0.0/24"})),
            "ipam.ipRanges[1].rangeEnd",
        ),
        case(
            "camelCase next to the kubeconfig",
            netconf(ranged(json!({"kubernetes": {"kubeconfig": KUBECONFIG, "kubeConfigPath": "/x"}}))),
            plain(),
            "ipam.kubernetes.kubeConfigPath",
        ),
        case("cniVersion 0.1.0", with_version(Some("0.1.0")), plain(), "cniVersion"),
        case("cniVersion 0.2.0", with_version(Some("0.2.0")), plain(), "cniVersion"),
        case("cniVersion missing", with_version(None), plain(), "cniVersion"),
        case(
            "runtimeConfig ips outside the range",
            netconf_with(json!({"runtimeConfig": {"ips": ["10.9.0.5/24"]}}), ranged(json!({}))),
            plain(),
            "runtimeConfig.ips[0]",
        ),
        case("range_start outside", netconf(ranged(json!({"range_start": "10.0.1.5"}))), plain(), "ipam.range_start"),
        case(
            "range_end before range_start",
            netconf(ranged(json!({"range_start": "10.0.0.50", "range_end": "10.0.0.10"}))),
            plain(),
            "ipam.range_end",
        ),
        case(
            "ipRanges range_start outside",
            two(json!({"range": "10.2.0.0/24", "range_start": "10.3.0.1"})),
            two(json!({"range": "10.2.0.0/24"})),
            "ipam.ipRanges[1].range_start",
        ),
        case(
            "first-last/len with another range_start",
            netconf(ranged(json!({"range": "10.0.0.5-10.0.0.20/24", "range_start": "10.0.0.6"}))),
            netconf(ranged(json!({"range": "10.0.0.5-10.0.0.20/24"}))),
            "ipam.range_start",
        ),
        case(
            "unparsable exclude",
            netconf(ranged(json!({"exclude": ["10.0.0.0/28", "x"]}))),
            netconf(ranged(json!({"exclude": ["10.0.0.0/28"]}))),
            "ipam.exclude[1]",
        ),
        case(
            "exclude of the other family",
            netconf(ranged(json!({"exclude": ["2001:db8::/64"]}))),
            plain(),
            "ipam.exclude[0]",
        ),
        case(
            "exclude elsewhere",
            two(json!({"range": "10.2.0.0/24", "exclude": ["192.168.0.0/24"]})),
            two(json!({"range": "10.2.0.0/24"})),
            "ipam.ipRanges[1].exclude[0]",
        ),
        case("gateway outside", netconf(ranged(json!({"gateway": "10.9.0.1"}))), plain(), "ipam.gateway"),
        case(
            "route with host bits",
            netconf(ranged(json!({"routes": [{"dst": "10.9.0.1/16"}]}))),
            plain(),
            "ipam.routes[0].dst",
        ),
        case(
            "dns with a misspelt key",
            netconf(ranged(json!({"dns": {"nameserver": ["10.96.0.10"]}}))),
            plain(),
            "ipam.dns.nameserver",
        ),
        case(
            "node_slice_size wider than the range",
            netconf(ranged(json!({"node_slice_size": "/16"}))),
            plain(),
            "ipam.node_slice_size",
        ),
        case(
            "configuration_path that does not exist",
            netconf(ranged(json!({"configuration_path": "/nonexistent/whereabouts.conf"}))),
            plain(),
            "ipam.configuration_path",
        ),
        case("unknown ipam key", netconf(ranged(json!({"foo": 1}))), plain(), "ipam.foo"),
        case("ipam.name", netconf(ranged(json!({"name": "other"}))), plain(), "ipam.name"),
        case(
            "legacy etcd keys next to a relative log_file",
            netconf(ranged(json!({
                "datastore": "etcd",
                "etcd_host": "https://etcd:2379",
                "etcd_password": "secret",
                "leader_lease_duration": 1500,
                "log_file": "whereabouts.log",
            }))),
            plain(),
            "ipam.etcd_host",
        ),
    ];
    cases.extend([
        Upstream {
            args: "K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod-0;FOO=bar",
            ..case("unknown CNI_ARGS", plain(), plain(), "FOO")
        },
        Upstream {
            args: "IP=10.9.0.5;K8S_POD_NAME=pod-0;K8S_POD_NAMESPACE=ns1",
            ..case("IP= outside", plain(), plain(), "CNI_ARGS IP")
        },
        Upstream { flat: Flat::Dir, ..case("unreadable flat file", plain(), plain(), "flat file") },
        Upstream {
            flat: Flat::Text("{\"kubernetes\": "),
            ..case("malformed flat file", plain(), plain(), "flat file")
        },
        Upstream {
            flat: Flat::Text(
                r#"{"kubernetes": {"kubeconfig": "/flat/k"}, "rangeStart": "10.0.0.9", "network_name": "flat"}"#,
            ),
            corrected_flat: Flat::Text(r#"{"kubernetes": {"kubeconfig": "/flat/k"}, "network_name": "flat"}"#),
            ..case(
                "flat file with a camelCase key gives the kubeconfig",
                netconf(ranged(json!({"kubernetes": null, "network_name": null}))),
                netconf(ranged(json!({"kubernetes": null, "network_name": null}))),
                "rangeStart (flat file",
            )
        },
    ]);
    cases
}

#[test]
fn configs_upstream_accepted_release_their_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (i, c) in upstream_accepted().iter().enumerate() {
        let paths = c.flat.paths(dir.path(), &format!("given-{i}.conf"));
        let corrected_paths = c.corrected_flat.paths(dir.path(), &format!("corrected-{i}.conf"));
        let refusal = match strict(&c.stdin, c.args, &paths) {
            Ok(_) => {
                failures.push(format!("{}: the strict loader accepts it", c.what));
                continue;
            }
            Err(e) => e.to_string(),
        };
        let add = strict(&c.corrected, c.corrected_args, &corrected_paths)
            .unwrap_or_else(|e| panic!("{}: corrected config refused: {e}", c.what));
        let got = release(&c.stdin, c.args, &paths);
        let mut wrong = Vec::new();
        if pool_names(&got.network_name, &got.ranges) != pool_names(&add.network_name, &add.ranges) {
            wrong.push(format!("pools {:?}", pool_names(&got.network_name, &got.ranges)));
        }
        if (&got.network_name, &got.mode) != (&add.network_name, &add.mode.release_mode()) {
            wrong.push(format!("network {:?}, mode {:?}", got.network_name, got.mode));
        }
        if got.pod != add.pod || got.name != add.name {
            wrong.push(format!("pod {}, name {:?}", got.pod, got.name));
        }
        if !got.warnings.first().is_some_and(|w| w.starts_with(&refusal)) {
            wrong.push("the strict refusal does not open the first warning".to_string());
        }
        if !got.warnings.iter().any(|w| w.contains(c.key)) {
            wrong.push(format!("no warning names {:?}", c.key));
        }
        if !wrong.is_empty() {
            failures.push(format!("{}: {}; warnings {:#?}", c.what, wrong.join(", "), got.warnings));
        }
    }
    assert!(failures.is_empty(), "{} cases failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn warnings_name_every_key_passed_over_and_no_secret() {
    let conf = netconf_with(
        json!({"cniVersion": "0.2.0"}),
        ranged(json!({"rangeStart": "10.0.0.5", "etcd_password": "secret", "timeout_seconds": 0})),
    );
    let c = release(&conf, "FOO=bar;K8S_POD_NAME=p", &[]);
    assert_eq!(c.cni_version, "0.2.0");
    assert_eq!(c.timeout, DEFAULT_TIMEOUT);
    assert_eq!(c.pod.name, "p");
    for key in ["cniVersion", "ipam.rangeStart", "ipam.etcd_password", "ipam.timeout_seconds", "CNI_ARGS FOO"] {
        assert!(c.warnings.iter().any(|w| w.contains(key)), "{key}: {:#?}", c.warnings);
    }
    assert!(!format!("{c:?}").contains("secret"));
    let mut unique = c.warnings.clone();
    unique.dedup();
    assert_eq!(unique.len(), c.warnings.len(), "each warning once: {:#?}", c.warnings);
}

#[test]
fn nothing_to_read_is_an_empty_config_with_a_warning() {
    for (stdin, key) in [
        (&b"cniVersion=1.0.0"[..], "stdin"),
        (b"[1, 2]", "stdin"),
        (br#"{"cniVersion": "1.0.0", "name": "n", "type": "macvlan"}"#, "ipam: missing"),
        (br#"{"cniVersion": "1.0.0", "name": "n", "ipam": "whereabouts"}"#, "ipam: expected an object"),
        (br#"{"cniVersion": 1, "name": 2, "ipam": {"type": "whereabouts"}}"#, "ipam.range"),
    ] {
        let c = release(stdin, POD_ARGS, &[]);
        assert!(c.ranges.is_empty());
        assert_eq!((c.mode, c.timeout), (ReleaseMode::default(), Duration::from_secs(90)));
        assert_eq!(c.pod.to_string(), "ns1/pod-0", "the pod is read all the same");
        assert!(c.warnings.iter().any(|w| w.contains(key)), "{key}: {:#?}", c.warnings);
    }
}

#[test]
fn ranges_are_their_whole_cidr_or_skipped() {
    let conf = netconf_with(
        json!({"cniVersion": "0.2.0"}),
        ranged(json!({
            "range": "10.0.1.5-10.0.0.20/24",
            "ipRanges": [
                {"range": "10.0.0.0/33"},
                {"range_start": "10.5.0.1"},
                "10.6.0.0/24",
                {"range": "2001:db8::-2001:db8::ffff/64", "range_end": "2001:db8::1"},
                {"range": 7},
                {"range": "10.7.0.0/24", "exclude": "10.7.0.1"},
            ],
        })),
    );
    let c = release(&conf, "", &[]);
    let cidrs: Vec<String> = c.ranges.iter().map(|r| r.cidr().to_string()).collect();
    // `A-B/len` whose first address is outside: the CIDR of `B/len`; an exclude of the wrong type is passed over
    // as the key it is, leaving the entry whole
    assert_eq!(cidrs, ["10.0.0.0/24", "2001:db8::/64", "10.7.0.0/24"]);
    assert_eq!(c.ranges[1], IpRange::parse("2001:db8::/64", None, None, &[]).unwrap());
    for key in [
        "ipam.range: ",
        "ipam.ipRanges[0]",
        "ipam.ipRanges[1].range: missing",
        "ipam.ipRanges[2]: expected an object",
        "ipam.ipRanges[3].range_end",
        "ipam.ipRanges[4].range: expected a string",
        "ipam.ipRanges[5].exclude: expected an array",
    ] {
        assert!(c.warnings.iter().any(|w| w.starts_with(key)), "{key}: {:#?}", c.warnings);
    }
}

#[test]
fn gateway_is_excluded_as_add_does_when_it_can_be() {
    let conf = netconf_with(json!({"cniVersion": "0.2.0"}), ranged(json!({"gateway": "10.0.0.1"})));
    let c = release(&conf, "", &[]);
    let add = strict(&netconf(ranged(json!({"gateway": "10.0.0.1"}))), "", &[]).unwrap();
    assert_eq!(c.ranges, add.ranges);
}

#[test]
fn cni_args_for_release() {
    let conf = netconf(ranged(json!({"rangeStart": "x"})));
    for (args, pod, key) in [
        ("IgnoreUnknown=maybe;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p", "ns/p", None),
        ("IgnoreUnknown=0;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;X=1", "ns/p", Some("CNI_ARGS X")),
        ("IP=garbage;GATEWAY=gw;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p", "ns/p", None),
        ("K8S_POD_NAMESPACE=ns;K8S_POD_NAME", "/", Some("KEY=VALUE")),
        ("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_NAME=q", "/", Some("K8S_POD_NAME is given twice")),
    ] {
        let c = release(&conf, args, &[]);
        assert_eq!(c.pod.to_string(), pod, "{args}");
        if let Some(key) = key {
            assert!(c.warnings.iter().any(|w| w.contains(key)), "{args}: {:#?}", c.warnings);
        }
        assert_eq!(c.ranges.len(), 1, "{args}");
    }
}

#[test]
fn a_missing_configuration_path_falls_back_to_the_default_paths() {
    let dir = tempfile::tempdir().unwrap();
    let flat = dir.path().join("whereabouts.conf");
    std::fs::write(&flat, r#"{"kubernetes": {"kubeconfig": "/flat/k"}}"#).unwrap();
    let conf = netconf(ranged(json!({"kubernetes": null, "configuration_path": "/nonexistent/x.conf"})));
    let c = release(&conf, "", &[flat]);
    assert_eq!(c.mode.kube().unwrap().kubeconfig.as_deref(), Some(Path::new("/flat/k")));
    assert!(c.warnings[0].starts_with("ipam.configuration_path"), "{:#?}", c.warnings);
}

#[test]
fn flat_file_keys_with_mistakes_are_passed_over_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let flat = dir.path().join("f.conf");
    std::fs::write(
        &flat,
        r#"{"kubernetes": {"kubeconfig": "/flat/k"}, "log_level": "loud", "enable_overlapping_ranges": false}"#,
    )
    .unwrap();
    let c = release(&netconf(ranged(json!({"kubernetes": null}))), "", std::slice::from_ref(&flat));
    assert_eq!(c.mode.kube().unwrap().kubeconfig.as_deref(), Some(Path::new("/flat/k")));
    assert_eq!(c.log_level, LogLevel::Debug);
    assert!(c.mode.kube().unwrap().overlapping_ranges, "only the inline value counts, as for ADD");
    let flat_key = format!("log_level (flat file {})", flat.display());
    assert!(c.warnings.iter().any(|w| w.starts_with(&flat_key)), "{:#?}", c.warnings);
}
