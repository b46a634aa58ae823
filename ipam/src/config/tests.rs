//! Unit tests of config loading: every refusal with its code and key, the flat-file rules, the defaults.
//!
//! Tests marked `needs range` build [`IpRange`]s and pass once `crate::range::IpRange::parse` is implemented.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::provider::{Mode, Placement};
use super::*;

const KUBECONFIG: &str = "/etc/cni/net.d/hereabouts.d/hereabouts.kubeconfig";

pub(super) fn netconf_with(top: Value, ipam: Value) -> Vec<u8> {
    let mut conf = json!({"cniVersion": "1.0.0", "name": "net1", "type": "macvlan", "master": "eth0"});
    merge_into(&mut conf, top);
    conf["ipam"] = ipam;
    serde_json::to_vec(&conf).unwrap()
}

pub(super) fn netconf(ipam: Value) -> Vec<u8> {
    netconf_with(json!({}), ipam)
}

/// `patch`'s keys replace `base`'s; a `null` removes the key.
pub(super) fn merge_into(base: &mut Value, patch: Value) {
    let (Value::Object(base), Value::Object(patch)) = (base, patch) else { panic!("objects only") };
    for (k, v) in patch {
        if v.is_null() {
            base.remove(&k);
        } else {
            base.insert(k, v);
        }
    }
}

/// A config with one range.
fn ranged(patch: Value) -> Value {
    let mut ipam = json!({"type": "whereabouts", "range": "10.0.0.0/24", "kubernetes": {"kubeconfig": KUBECONFIG}});
    merge_into(&mut ipam, patch);
    ipam
}

/// A config with static addresses only: loads without building any range.
fn static_only(patch: Value) -> Value {
    let mut ipam = json!({
        "type": "whereabouts",
        "addresses": [{"address": "192.168.100.5/24", "gateway": "192.168.100.1"}],
        "kubernetes": {"kubeconfig": KUBECONFIG},
    });
    merge_into(&mut ipam, patch);
    ipam
}

fn load_at(stdin: &[u8], cni_args: &str, paths: &[PathBuf]) -> Result<IpamConfig, ConfigError> {
    load_with_paths(&Input { stdin, cni_args }, paths)
}

/// The API-server settings of `c`.
pub(super) fn kube(c: &IpamConfig) -> &Kube {
    c.mode.kube().expect("a mode on the API server")
}

/// How the ranges of `c` are placed: every one ordinary without a provider.
fn placements(c: &IpamConfig) -> Vec<Placement> {
    match &c.mode {
        super::Mode::Provider(p) => p.placements.clone(),
        _ => vec![Placement::Ordinary; c.ranges.len()],
    }
}

fn ok(stdin: &[u8], cni_args: &str) -> IpamConfig {
    load_at(stdin, cni_args, &[]).unwrap_or_else(|e| panic!("refused: {e}"))
}

fn refused(stdin: &[u8], cni_args: &str) -> ConfigError {
    match load_at(stdin, cni_args, &[]) {
        Ok(c) => panic!("accepted: {c:?}"),
        Err(e) => e,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const POD_ARGS: &str =
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod-0;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=u1";

/// (what, stdin, CNI_ARGS, code, a part of the message: the key)
type Case = (&'static str, Vec<u8>, &'static str, u32, &'static str);

fn refusals() -> Vec<Case> {
    let raw = |s: &str| s.as_bytes().to_vec();
    vec![
        ("cniVersion too old", raw(r#"{"cniVersion":"0.2.0","name":"n","ipam":{}}"#), "", 1, "cniVersion: \"0.2.0\""),
        ("cniVersion unknown", raw(r#"{"cniVersion":"2.0.0","name":"n","ipam":{}}"#), "", 1, "cniVersion"),
        ("cniVersion missing", raw(r#"{"name":"n","ipam":{}}"#), "", 1, "cniVersion: missing"),
        ("cniVersion a number", raw(r#"{"cniVersion":1,"name":"n","ipam":{}}"#), "", 6, "cniVersion"),
        ("stdin not JSON", raw("cniVersion=1.0.0"), "", 6, "stdin"),
        ("stdin not an object", raw("[1, 2]"), "", 6, "stdin"),
        ("name missing", raw(r#"{"cniVersion":"1.0.0","ipam":{"type":"whereabouts"}}"#), "", 7, "name"),
        ("ipam missing", raw(r#"{"cniVersion":"1.0.0","name":"n","type":"macvlan"}"#), "", 7, "ipam"),
        ("ipam null", raw(r#"{"cniVersion":"1.0.0","name":"n","ipam":null}"#), "", 7, "ipam"),
        ("ipam not an object", raw(r#"{"cniVersion":"1.0.0","name":"n","ipam":"whereabouts"}"#), "", 6, "ipam"),
        ("ipam.type missing", netconf(ranged(json!({"type": null}))), "", 7, "ipam.type"),
        ("ipam.type another plugin", netconf(ranged(json!({"type": "host-local"}))), "", 7, "ipam.type"),
        ("unknown key", netconf(ranged(json!({"foo": 1}))), "", 2, "ipam.foo: unknown key"),
        ("camelCase rangeStart", netconf(ranged(json!({"rangeStart": "10.0.0.5"}))), "", 2, "ipam.rangeStart"),
        ("capitalised Gateway", netconf(ranged(json!({"Gateway": "10.0.0.1"}))), "", 2, "ipam.Gateway"),
        ("kubeconfig at top", netconf(ranged(json!({"kubeconfig": KUBECONFIG}))), "", 2, "ipam.kubeconfig"),
        ("range a number", netconf(ranged(json!({"range": 10}))), "", 6, "ipam.range"),
        ("exclude element a number", netconf(ranged(json!({"exclude": ["10.0.0.1", 2]}))), "", 6, "ipam.exclude[1]"),
        ("exclude a string", netconf(ranged(json!({"exclude": "10.0.0.1"}))), "", 6, "ipam.exclude"),
        ("overlapping a string", netconf(ranged(json!({"enable_overlapping_ranges": "no"}))), "", 6, "ipam.enable_"),
        ("ipRanges an object", netconf(ranged(json!({"ipRanges": {"range": "10.1.0.0/24"}}))), "", 6, "ipam.ipRanges"),
        ("bad range", netconf(ranged(json!({"range": "banana"}))), "", 7, "ipam.range"),
        ("range prefix too long", netconf(ranged(json!({"range": "10.0.0.0/33"}))), "", 7, "ipam.range"),
        ("range /32", netconf(ranged(json!({"range": "10.0.0.1/32"}))), "", 7, "ipam.range"),
        ("range /128", netconf(ranged(json!({"range": "2001:db8::1/128"}))), "", 7, "ipam.range"),
        ("start not an IP", netconf(ranged(json!({"range_start": "10.0.0.x"}))), "", 7, "ipam.range_start"),
        ("start outside", netconf(ranged(json!({"range_start": "10.0.1.5"}))), "", 7, "ipam.range_start"),
        ("start other family", netconf(ranged(json!({"range_start": "2001:db8::5"}))), "", 7, "ipam.range_start"),
        ("end outside", netconf(ranged(json!({"range_end": "10.0.1.5"}))), "", 7, "ipam.range_end"),
        (
            "end before start",
            netconf(ranged(json!({"range_start": "10.0.0.50", "range_end": "10.0.0.10"}))),
            "",
            7,
            "ipam.range_end: 10.0.0.10 is before the start 10.0.0.50",
        ),
        (
            "first-last/len start outside",
            netconf(ranged(json!({"range": "10.0.1.5-10.0.0.20/24"}))),
            "",
            7,
            "ipam.range",
        ),
        (
            "first-last/len with another start",
            netconf(ranged(json!({"range": "10.0.0.5-10.0.0.20/24", "range_start": "10.0.0.6"}))),
            "",
            7,
            "ipam.range_start",
        ),
        ("exclude other family", netconf(ranged(json!({"exclude": ["2001:db8::/64"]}))), "", 7, "ipam.exclude[0]"),
        ("exclude not a CIDR", netconf(ranged(json!({"exclude": ["10.0.0.0/24", "x"]}))), "", 7, "ipam.exclude[1]"),
        ("exclude elsewhere", netconf(ranged(json!({"exclude": ["192.168.0.0/24"]}))), "", 7, "ipam.exclude[0]"),
        (
            "range_start without range",
            netconf(ranged(json!({"range": null, "range_start": "10.0.0.5", "ipRanges": [{"range": "10.0.0.0/24"}]}))),
            "",
            7,
            "ipam.range_start: set without \"range\"",
        ),
        ("ipRanges entry without range", netconf(ranged(json!({"ipRanges": [{}]}))), "", 7, "ipam.ipRanges[0].range"),
        (
            "ipRanges entry with a gateway",
            netconf(ranged(json!({"ipRanges": [{"range": "10.1.0.0/24", "gateway": "10.1.0.1"}]}))),
            "",
            2,
            "ipam.ipRanges[0].gateway",
        ),
        (
            "ipRanges entry camelCase",
            netconf(ranged(json!({"ipRanges": [{"range": "10.1.0.0/24", "rangeEnd": "10.1.0.9"}]}))),
            "",
            2,
            "ipam.ipRanges[0].rangeEnd: unknown key (did you mean \"range_end\"?)",
        ),
        (
            "ipRanges entry bad range",
            netconf(ranged(json!({"ipRanges": [{"range": "10.1.0.0/24"}, {"range": "10.2.0.0/99"}]}))),
            "",
            7,
            "ipam.ipRanges[1]",
        ),
        ("no range at all", netconf(ranged(json!({"range": null}))), "", 7, "ipam.range: no range"),
        ("gateway garbage", netconf(ranged(json!({"gateway": "10.0.0.256"}))), "", 7, "ipam.gateway"),
        ("gateway outside every range", netconf(ranged(json!({"gateway": "10.9.0.1"}))), "", 7, "ipam.gateway"),
        (
            "gateway with addresses only",
            netconf(static_only(json!({"gateway": "192.168.100.1"}))),
            "",
            7,
            "ipam.gateway",
        ),
        ("route dst garbage", netconf(ranged(json!({"routes": [{"dst": "default"}]}))), "", 7, "ipam.routes[0].dst"),
        ("route dst missing", netconf(ranged(json!({"routes": [{"gw": "10.0.0.1"}]}))), "", 7, "ipam.routes[0].dst"),
        (
            "route dst host bits",
            netconf(ranged(json!({"routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.1/16"}]}))),
            "",
            7,
            "ipam.routes[1].dst: 10.9.0.1/16 has host bits set (did you mean 10.9.0.0/16?)",
        ),
        (
            "route gw other family",
            netconf(ranged(json!({"routes": [{"dst": "0.0.0.0/0", "gw": "2001:db8::1"}]}))),
            "",
            7,
            "ipam.routes[0].gw",
        ),
        (
            "route unknown key",
            netconf(ranged(json!({"routes": [{"dst": "0.0.0.0/0", "via": "x"}]}))),
            "",
            2,
            "ipam.routes[0].via",
        ),
        ("route not an object", netconf(ranged(json!({"routes": ["0.0.0.0/0"]}))), "", 6, "ipam.routes[0]"),
        (
            "dns nameserver garbage",
            netconf(ranged(json!({"dns": {"nameservers": ["dns.local"]}}))),
            "",
            7,
            "ipam.dns.nameservers[0]",
        ),
        (
            "dns unknown key",
            netconf(ranged(json!({"dns": {"nameserver": ["10.0.0.2"]}}))),
            "",
            2,
            "ipam.dns.nameserver",
        ),
        (
            "address without prefix",
            netconf(static_only(json!({"addresses": [{"address": "192.168.1.5"}]}))),
            "",
            7,
            "ipam.addresses[0].address",
        ),
        (
            "address gateway other family",
            netconf(static_only(json!({"addresses": [{"address": "192.168.1.5/24", "gateway": "fe80::1"}]}))),
            "",
            7,
            "ipam.addresses[0].gateway",
        ),
        (
            "address also in the range",
            netconf(ranged(json!({"addresses": [{"address": "10.0.0.7/24"}]}))),
            "",
            7,
            "ipam.addresses[0].address",
        ),
        (
            "strategy unknown",
            netconf(ranged(json!({"allocation_strategy": "fastest"}))),
            "",
            7,
            "ipam.allocation_strategy",
        ),
        ("timeout 0", netconf(ranged(json!({"timeout_seconds": 0}))), "", 7, "ipam.timeout_seconds"),
        ("timeout a string", netconf(ranged(json!({"timeout_seconds": "90"}))), "", 6, "ipam.timeout_seconds"),
        ("timeout negative", netconf(ranged(json!({"timeout_seconds": -1}))), "", 6, "ipam.timeout_seconds"),
        ("log_level unknown", netconf(ranged(json!({"log_level": "loud"}))), "", 7, "ipam.log_level"),
        ("network_name not a name", netconf(ranged(json!({"network_name": "Net_A"}))), "", 7, "ipam.network_name"),
        (
            "kubeconfig relative",
            netconf(ranged(json!({"kubernetes": {"kubeconfig": "whereabouts.kubeconfig"}}))),
            "",
            7,
            "ipam.kubernetes.kubeconfig",
        ),
        (
            "kubernetes unknown key",
            netconf(ranged(json!({"kubernetes": {"kube_config": KUBECONFIG}}))),
            "",
            2,
            "ipam.kubernetes.kube_config: unknown key (did you mean \"kubeconfig\"?)",
        ),
        ("node_slice_size garbage", netconf(ranged(json!({"node_slice_size": "big"}))), "", 7, "ipam.node_slice_size"),
        (
            "node_slice_size wider than the range",
            netconf(ranged(json!({"node_slice_size": "/16"}))),
            "",
            7,
            "ipam.node_slice_size",
        ),
        (
            "configuration_path missing",
            netconf(ranged(json!({"configuration_path": "/nonexistent/hereabouts.conf"}))),
            "",
            7,
            "ipam.configuration_path: /nonexistent/hereabouts.conf does not exist",
        ),
        (
            "inline log_file outside the log directories",
            netconf(ranged(json!({"log_file": "/etc/cron.d/x"}))),
            "",
            7,
            "ipam.log_file: \"/etc/cron.d/x\": a NetworkAttachmentDefinition may log only below /var/log/ or /tmp/",
        ),
        (
            "inline log_file climbing out of /var/log",
            netconf(ranged(json!({"log_file": "/var/log/../../etc/passwd"}))),
            "",
            7,
            "ipam.log_file",
        ),
        ("inline log_file the directory itself", netconf(ranged(json!({"log_file": "/tmp"}))), "", 7, "ipam.log_file"),
        (
            "runtimeConfig not an object",
            netconf_with(json!({"runtimeConfig": []}), ranged(json!({}))),
            "",
            6,
            "runtimeConfig",
        ),
        (
            "runtimeConfig ips not strings",
            netconf_with(json!({"runtimeConfig": {"ips": [5]}}), ranged(json!({}))),
            "",
            6,
            "runtimeConfig.ips[0]",
        ),
        (
            "runtimeConfig ip garbage",
            netconf_with(json!({"runtimeConfig": {"ips": ["10.0.0.5/24/8"]}}), static_only(json!({}))),
            "",
            7,
            "runtimeConfig.ips[0]",
        ),
        (
            "requested IP outside every range",
            netconf_with(json!({"runtimeConfig": {"ips": ["10.0.0.5", "10.1.0.5/24"]}}), ranged(json!({}))),
            "",
            7,
            "runtimeConfig.ips[1]: 10.1.0.5 is outside every range (10.0.0.0/24)",
        ),
        (
            "requested IP with another prefix",
            netconf_with(json!({"runtimeConfig": {"ips": ["10.0.0.5/16"]}}), ranged(json!({}))),
            "",
            7,
            "runtimeConfig.ips[0]",
        ),
        (
            "requested IP excluded",
            netconf_with(json!({"runtimeConfig": {"ips": ["10.0.0.5"]}}), ranged(json!({"exclude": ["10.0.0.0/28"]}))),
            "",
            7,
            "runtimeConfig.ips[0]: 10.0.0.5 cannot be handed out",
        ),
        (
            "requested IP is the gateway",
            netconf_with(json!({"runtimeConfig": {"ips": ["10.0.0.1"]}}), ranged(json!({"gateway": "10.0.0.1"}))),
            "",
            7,
            "runtimeConfig.ips[0]",
        ),
        (
            "requested IP with addresses only",
            netconf_with(json!({"runtimeConfig": {"ips": ["192.168.100.5"]}}), static_only(json!({}))),
            "",
            7,
            "runtimeConfig.ips[0]",
        ),
        (
            "CNI_ARGS pair without =",
            netconf(static_only(json!({}))),
            "K8S_POD_NAMESPACE=ns;K8S_POD_NAME",
            4,
            "\"K8S_POD_NAME\"",
        ),
        ("CNI_ARGS unknown key", netconf(static_only(json!({}))), "K8S_POD_NAME=p;FOO=bar", 4, "FOO"),
        ("CNI_ARGS IgnoreUnknown=0", netconf(static_only(json!({}))), "IgnoreUnknown=0;FOO=bar", 4, "FOO"),
        ("CNI_ARGS IgnoreUnknown garbage", netconf(static_only(json!({}))), "IgnoreUnknown=maybe", 4, "IgnoreUnknown"),
        (
            "warm without slices",
            netconf(ranged(json!({"warm_addresses": 4}))),
            "",
            7,
            "ipam.warm_addresses: needs node_slice_size",
        ),
        (
            "slice cap without slices",
            netconf(ranged(json!({"max_slices_per_node": 2}))),
            "",
            7,
            "ipam.max_slices_per_node: needs node_slice_size",
        ),
        (
            "adaptive slices without slices",
            netconf(ranged(json!({"min_node_slice_size": "/28"}))),
            "",
            7,
            "ipam.min_node_slice_size: needs node_slice_size",
        ),
        (
            "smallest slice larger than the largest",
            netconf(ranged(json!({"node_slice_size": "/28", "min_node_slice_size": "/26"}))),
            "",
            7,
            "ipam.min_node_slice_size: /26 is larger than node_slice_size /28",
        ),
        (
            "smallest slice too small to list",
            netconf(ranged(json!({"range": "10.0.0.0/8", "node_slice_size": "/16", "min_node_slice_size": "/30"}))),
            "",
            7,
            "ipam.min_node_slice_size: /30 cuts 10.0.0.0/8 into 4194304 slices",
        ),
        (
            "smallest slice not a prefix",
            netconf(ranged(json!({"node_slice_size": "/28", "min_node_slice_size": "small"}))),
            "",
            7,
            "ipam.min_node_slice_size: \"small\": expected a prefix length",
        ),
        (
            "slice cap of 0",
            netconf(ranged(json!({"node_slice_size": "/26", "max_slices_per_node": 0}))),
            "",
            7,
            "ipam.max_slices_per_node: 0: a node needs at least one slice",
        ),
        (
            "warm too many",
            netconf(ranged(json!({"node_slice_size": "/28", "warm_addresses": 257}))),
            "",
            7,
            "ipam.warm_addresses: 257 is more than 256",
        ),
        (
            "warm a string",
            netconf(ranged(json!({"node_slice_size": "/28", "warm_addresses": "4"}))),
            "",
            6,
            "ipam.warm_addresses",
        ),
        (
            "warm with host routes",
            netconf(ranged(json!({"node_slice_size": "/28", "warm_addresses": 4, "announce_routes": true}))),
            "",
            7,
            "ipam.warm_addresses: not with announce_routes",
        ),
        (
            "allowPersistentIPs with slices",
            netconf_with(json!({"allowPersistentIPs": true}), ranged(json!({"node_slice_size": "/28"}))),
            "",
            7,
            "allowPersistentIPs: only with one pool per range",
        ),
        (
            "allowPersistentIPs a string",
            netconf_with(json!({"allowPersistentIPs": "yes"}), ranged(json!({}))),
            "",
            6,
            "allowPersistentIPs",
        ),
        (
            "claim named without allowPersistentIPs",
            netconf_with(json!({"args": {"cni": {"ipam-claim-reference": "vm1.net"}}}), ranged(json!({}))),
            "",
            7,
            "args.cni.ipam-claim-reference: an IPAMClaim is named but the network does not allow",
        ),
        (
            "claim name not a name",
            netconf_with(
                json!({"allowPersistentIPs": true, "args": {"cni": {"ipam-claim-reference": "VM_1"}}}),
                ranged(json!({})),
            ),
            "",
            7,
            "args.cni.ipam-claim-reference: \"VM_1\" is not an IPAMClaim name",
        ),
        (
            "claim and an address asked for",
            netconf_with(
                json!({"allowPersistentIPs": true, "args": {"cni": {"ipam-claim-reference": "vm1.net"}}}),
                ranged(json!({})),
            ),
            "IP=10.0.0.5",
            7,
            "args.cni.ipam-claim-reference: not with addresses asked for",
        ),
        (
            "preferred_ip_annotation with slices",
            netconf(ranged(json!({"node_slice_size": "/28", "preferred_ip_annotation": true}))),
            "",
            7,
            "ipam.preferred_ip_annotation: only with one pool per range",
        ),
        (
            "preferred_ip_annotation a string",
            netconf(ranged(json!({"preferred_ip_annotation": "yes"}))),
            "",
            6,
            "ipam.preferred_ip_annotation",
        ),
        ("CNI_ARGS IP garbage", netconf(static_only(json!({}))), "IP=10.0.0.x;K8S_POD_NAME=p", 4, "CNI_ARGS: IP"),
        ("CNI_ARGS IP outside", netconf(ranged(json!({}))), "IP=10.1.0.5", 7, "CNI_ARGS IP: 10.1.0.5 is outside"),
        ("CNI_ARGS GATEWAY garbage", netconf(static_only(json!({}))), "GATEWAY=gw", 4, "GATEWAY"),
        ("CNI_ARGS GATEWAY matching nothing", netconf(static_only(json!({}))), "GATEWAY=10.9.9.1", 4, "GATEWAY"),
        (
            "CNI_ARGS conflicting repeat",
            netconf(static_only(json!({}))),
            "K8S_POD_NAME=a;K8S_POD_NAME=b",
            4,
            "K8S_POD_NAME",
        ),
    ]
}

#[test]
fn every_refusal_has_its_code_and_names_its_key() {
    let mut failures = Vec::new();
    for (what, stdin, args, code, key) in refusals() {
        match load_at(&stdin, args, &[]) {
            Ok(_) => failures.push(format!("{what}: accepted")),
            Err(e) if e.code() != code || !e.to_string().contains(key) => {
                failures.push(format!("{what}: got code {} {e:?}: {e}; want code {code} naming {key:?}", e.code()));
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), refusals().len(), failures.join("\n"));
}

#[test]
fn unknown_keys_are_all_named_with_the_key_meant() {
    let e = refused(&netconf(ranged(json!({"rangeStart": "10.0.0.5", "rangeEnd": "10.0.0.9", "subnet": "x"}))), "");
    let ConfigError::UnknownKeys(keys) = &e else { panic!("{e:?}") };
    let shown: Vec<String> = keys.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "ipam.rangeEnd: unknown key (did you mean \"range_end\"?)",
            "ipam.rangeStart: unknown key (did you mean \"range_start\"?)",
            "ipam.subnet: unknown key (did you mean \"range\"? (host-local's `subnet`))",
        ]
    );
    assert_eq!(e.code(), 2);
    let e = refused(&netconf(ranged(json!({"Gateway": "10.0.0.1"}))), "");
    assert!(e.to_string().contains("keys are case-sensitive: did you mean \"gateway\"?"), "{e}");
}

#[test]
fn start_outside_names_the_entry() {
    // checked before the range math, so the message is this module's own
    let conf = netconf(ranged(json!({
        "ipRanges": [{"range": "10.2.0.0/24"}, {"range": "10.0.0.0/24", "range_start": "10.1.0.5"}],
    })));
    assert_eq!(refused(&conf, "").to_string(), "ipam.ipRanges[1].range_start: 10.1.0.5 is outside 10.0.0.0/24");
}

#[test]
fn static_only_defaults() {
    let c = ok(&netconf(static_only(json!({}))), "");
    assert_eq!(c.cni_version, "1.0.0");
    assert_eq!(c.name, "net1");
    assert_eq!(c.network_name, "");
    assert!(c.ranges.is_empty());
    assert_eq!(c.gateway, None);
    assert!(c.routes.is_empty());
    assert_eq!(c.dns, None);
    assert_eq!(
        c.addresses,
        [StaticAddress { address: "192.168.100.5/24".parse().unwrap(), gateway: Some(ip("192.168.100.1")) }]
    );
    assert!(kube(&c).overlapping_ranges);
    assert_eq!(kube(&c).kubeconfig.as_deref(), Some(Path::new(KUBECONFIG)));
    assert_eq!(c.log_file, None);
    assert_eq!(c.log_level, LogLevel::Debug);
    assert_eq!(kube(&c).strategy, crate::allocator::Strategy::LowestFree);
    assert!(c.requested.is_empty());
    assert_eq!(c.pod, PodRef::default());
    assert!(matches!(c.mode, super::Mode::Pools(_)), "one pool per range by default");
    assert_eq!(c.reconciler_cron_expression, None);
    assert_eq!(c.timeout, Duration::from_secs(90));
    assert!(c.ignored.is_empty());
    assert_eq!(c.flat_file, None);
}

#[test]
fn every_key_is_read() {
    let conf = netconf(static_only(json!({
        "network_name": "net-a",
        "enable_overlapping_ranges": false,
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.96.0.0/12", "gw": "192.168.100.254", "mtu": 1400, "table": 100}],
        "dns": {"nameservers": ["10.96.0.10", "fe80::1%eth0"], "domain": "cluster.local", "search": ["svc"], "options": ["ndots:5"]},
        "log_file": "/var/log/hereabouts.log",
        "log_level": "VERBOSE",
        "reconciler_cron_expression": "30 4 * * *",
        "allocation_strategy": "random",
        "timeout_seconds": 20,
    })));
    let c = ok(&conf, "");
    assert_eq!(c.network_name, "net-a");
    assert!(!kube(&c).overlapping_ranges);
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.routes[1].dst, "10.96.0.0/12".parse::<IpNet>().unwrap());
    assert_eq!(c.routes[1].gw, Some(ip("192.168.100.254")));
    assert_eq!((c.routes[1].mtu, c.routes[1].table), (Some(1400), Some(100)));
    let dns = c.dns.clone().unwrap();
    assert_eq!(dns.nameservers, ["10.96.0.10", "fe80::1%eth0"]);
    assert_eq!(dns.domain.as_deref(), Some("cluster.local"));
    assert_eq!((dns.search, dns.options), (vec!["svc".to_string()], vec!["ndots:5".to_string()]));
    assert_eq!(c.log_file.as_deref(), Some(Path::new("/var/log/hereabouts.log")));
    assert_eq!(c.log_level, LogLevel::Verbose);
    assert_eq!(c.reconciler_cron_expression.as_deref(), Some("30 4 * * *"));
    assert_eq!(kube(&c).strategy, crate::allocator::Strategy::Random);
    assert_eq!(c.timeout, Duration::from_secs(20));
}

#[test]
fn warm_addresses_are_a_slice_modes_and_none_by_default() {
    let warm = |patch: Value| match ok(&netconf(ranged(patch)), "").mode {
        crate::config::Mode::Slices(s) => s.warm,
        other => panic!("not slices: {other:?}"),
    };
    assert_eq!(warm(json!({"node_slice_size": "/28"})), 0);
    assert_eq!(warm(json!({"node_slice_size": "/28", "warm_addresses": 16})), 16);
    // zero is off, in any mode
    assert!(matches!(ok(&netconf(ranged(json!({"warm_addresses": 0}))), "").mode, crate::config::Mode::Pools(_)));
}

#[test]
fn empty_values_are_absent_as_for_whereabouts() {
    let c =
        ok(&netconf(static_only(json!({"gateway": "", "range": "", "routes": [], "dns": {}, "network_name": ""}))), "");
    assert_eq!((c.gateway, c.dns, c.routes.len()), (None, None, 0));
}

#[test]
fn the_pod_comes_from_cni_args() {
    let c = ok(&netconf(static_only(json!({}))), POD_ARGS);
    assert_eq!(c.pod, PodRef { namespace: "ns1".into(), name: "pod-0".into(), uid: Some("u1".into()) });
    assert_eq!(c.pod.to_string(), "ns1/pod-0");
    c.require_pod().unwrap();
}

#[test]
fn add_without_the_pod_is_refused() {
    for args in ["", "K8S_POD_NAMESPACE=ns1", "K8S_POD_NAME=pod-0;K8S_POD_NAMESPACE="] {
        // loading works (DEL may come without the pod) ...
        let c = ok(&netconf(static_only(json!({}))), args);
        // ... ADD does not
        let e = c.require_pod().unwrap_err();
        assert_eq!(e.code(), 4, "{e}");
        assert!(e.to_string().contains("K8S_POD_"), "{e}");
    }
    let e = ok(&netconf(static_only(json!({}))), "K8S_POD_NAMESPACE=ns1").require_pod().unwrap_err();
    assert_eq!(e.to_string(), "CNI_ARGS: K8S_POD_NAME missing or empty: ADD needs the pod");
}

#[test]
fn ignore_unknown_lets_unknown_args_through() {
    let c = ok(&netconf(static_only(json!({}))), "FOO=bar;IgnoreUnknown=true;K8S_POD_NAME=p;K8S_POD_NAMESPACE=n");
    assert_eq!(c.ignored, ["CNI_ARGS FOO"]);
    assert!(c.require_pod().is_ok());
}

#[test]
fn ignore_unknown_given_twice_as_multus_and_the_runtime_do() {
    // Multus prepends `IgnoreUnknown=true`; containerd and CRI-O send `IgnoreUnknown=1`
    let args = "IgnoreUnknown=true;IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=c;K8S_POD_NAME=p;K8S_POD_NAMESPACE=n;X=y";
    let c = ok(&netconf(static_only(json!({}))), args);
    assert_eq!(c.ignored, ["CNI_ARGS X"]);
    let other_key_twice = "IgnoreUnknown=1;K8S_POD_NAME=p;K8S_POD_NAME=q;K8S_POD_NAMESPACE=n";
    let stdin = netconf(static_only(json!({})));
    let e = load_with_paths(&Input { stdin: &stdin, cni_args: other_key_twice }, &[]).unwrap_err();
    assert_eq!(e.code(), 4, "{e}");
}

#[test]
fn legacy_keys_are_accepted_and_ignored() {
    let conf = netconf(static_only(json!({
        "datastore": "kubernetes",
        "etcd_host": "https://etcd:2379",
        "etcd_password": "secret",
        "leader_lease_duration": 1500,
        "leader_renew_deadline": 1000,
        "leader_retry_period": 500,
        "sleep_for_race": 1,
        "kubernetes": {"kubeconfig": KUBECONFIG, "k8s_api_root": "https://10.96.0.1"},
    })));
    let c = ok(&conf, "");
    let mut ignored = c.ignored.clone();
    ignored.sort();
    assert_eq!(
        ignored,
        [
            "ipam.datastore",
            "ipam.etcd_host",
            "ipam.etcd_password",
            "ipam.kubernetes.k8s_api_root",
            "ipam.leader_lease_duration",
            "ipam.leader_renew_deadline",
            "ipam.leader_retry_period",
            "ipam.sleep_for_race",
        ]
    );
    assert!(!format!("{c:?}").contains("secret"));
}

#[test]
fn cni_gateway_applies_to_the_static_addresses_that_contain_it() {
    let conf = netconf(static_only(json!({"addresses": [{"address": "192.168.1.5/24"}, {"address": "fd00::5/64"}]})));
    let c = ok(&conf, "GATEWAY=192.168.1.1, fd00::1");
    assert_eq!(c.addresses[0].gateway, Some(ip("192.168.1.1")));
    assert_eq!(c.addresses[1].gateway, Some(ip("fd00::1")));
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn flat_file_fills_the_kubeconfig_only_when_inline_lacks_it() {
    let dir = tempfile::tempdir().unwrap();
    let flat = write(
        dir.path(),
        "whereabouts.conf",
        r#"{"datastore": "kubernetes", "kubernetes": {"kubeconfig": "/flat/whereabouts.kubeconfig"},
            "log_file": "/tmp/whereabouts.log", "log_level": "debug", "reconciler_cron_expression": "30 4 * * *"}"#,
    );
    let paths = [flat.clone()];
    let lacking = netconf(static_only(json!({"kubernetes": null})));
    let c = load_at(&lacking, "", &paths).unwrap();
    assert_eq!(kube(&c).kubeconfig.as_deref(), Some(Path::new("/flat/whereabouts.kubeconfig")));
    assert_eq!(c.log_file.as_deref(), Some(Path::new("/tmp/whereabouts.log")));
    assert_eq!(c.reconciler_cron_expression.as_deref(), Some("30 4 * * *"));
    assert_eq!(c.flat_file.as_deref(), Some(flat.as_path()));
    assert_eq!(c.ignored, [format!("datastore (flat file {})", flat.display())]);

    let having = netconf(static_only(json!({"log_level": "error"})));
    let c = load_at(&having, "", &paths).unwrap();
    assert_eq!(kube(&c).kubeconfig.as_deref(), Some(Path::new(KUBECONFIG)), "inline wins");
    assert_eq!(c.log_level, LogLevel::Error, "inline wins");
    assert_eq!(c.log_file.as_deref(), Some(Path::new("/tmp/whereabouts.log")), "the rest comes from the file");
}

#[test]
fn the_flat_file_may_log_anywhere_the_netconf_may_not() {
    let dir = tempfile::tempdir().unwrap();
    let flat = write(dir.path(), "f.conf", r#"{"log_file": "/srv/cni/hereabouts.log"}"#);
    let c = load_at(&netconf(static_only(json!({}))), "", &[flat]).unwrap();
    assert_eq!(c.log_file.as_deref(), Some(Path::new("/srv/cni/hereabouts.log")));
    let e = load_at(&netconf(static_only(json!({"log_file": "/srv/cni/hereabouts.log"}))), "", &[]).unwrap_err();
    assert_eq!(e.code(), 7, "{e}");
}

#[test]
fn flat_file_merges_nested_objects_key_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let flat = write(dir.path(), "f.conf", r#"{"dns": {"nameservers": ["10.96.0.10"], "domain": "flat.local"}}"#);
    let conf = netconf(static_only(json!({"dns": {"domain": "cluster.local"}})));
    let dns = load_at(&conf, "", &[flat]).unwrap().dns.unwrap();
    assert_eq!(dns.nameservers, ["10.96.0.10"]);
    assert_eq!(dns.domain.as_deref(), Some("cluster.local"));
}

#[test]
fn flat_file_cannot_turn_overlapping_ranges_off() {
    // Whereabouts saves the inline value before the merge and restores it after
    let dir = tempfile::tempdir().unwrap();
    let flat = write(dir.path(), "f.conf", r#"{"enable_overlapping_ranges": false}"#);
    let c = load_at(&netconf(static_only(json!({}))), "", std::slice::from_ref(&flat)).unwrap();
    assert!(kube(&c).overlapping_ranges);
    assert_eq!(c.ignored.len(), 1);
    assert!(c.ignored[0].starts_with("enable_overlapping_ranges (flat file"), "{:?}", c.ignored);
    let c = load_at(&netconf(static_only(json!({"enable_overlapping_ranges": false}))), "", &[flat]).unwrap();
    assert!(!kube(&c).overlapping_ranges);
}

#[test]
fn first_existing_default_path_is_used_and_none_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    let second = write(dir.path(), "second.conf", r#"{"network_name": "second"}"#);
    let third = write(dir.path(), "third.conf", r#"{"network_name": "third"}"#);
    let paths = [dir.path().join("missing.conf"), dir.path().join("no-dir/x.conf"), second.clone(), third];
    let c = load_at(&netconf(static_only(json!({}))), "", &paths).unwrap();
    assert_eq!(c.network_name, "second");
    assert_eq!(c.flat_file, Some(second));

    let c = load_at(&netconf(static_only(json!({}))), "", &paths[..2]).unwrap();
    assert_eq!((c.network_name.as_str(), c.flat_file), ("", None));
}

#[test]
fn configuration_path_is_used_instead_of_the_default_paths() {
    let dir = tempfile::tempdir().unwrap();
    let default = write(dir.path(), "default.conf", r#"{"network_name": "default"}"#);
    let chosen = write(dir.path(), "chosen.conf", r#"{"network_name": "chosen"}"#);
    let conf = netconf(static_only(json!({"configuration_path": chosen})));
    let c = load_at(&conf, "", &[default]).unwrap();
    assert_eq!(c.network_name, "chosen");
    assert_eq!(c.flat_file, Some(chosen));
}

#[test]
fn flat_file_refusals_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("not-json.conf", "{\"kubernetes\": ", 6, "flat file"),
        ("array.conf", "[]", 6, "flat file"),
        ("unknown.conf", r#"{"rangeStart": "10.0.0.5"}"#, 2, "rangeStart (flat file"),
        ("nested.conf", r#"{"ipam": {"range": "10.0.0.0/24"}}"#, 2, "not an \"ipam\" object"),
        ("bad-value.conf", r#"{"log_level": "loud"}"#, 7, "log_level (flat file"),
        ("bad-type.conf", r#"{"kubernetes": {"kubeconfig": 5}}"#, 6, "kubernetes.kubeconfig (flat file"),
    ];
    for (name, text, code, key) in cases {
        let path = write(dir.path(), name, text);
        let e = load_at(&netconf(static_only(json!({}))), "", std::slice::from_ref(&path)).unwrap_err();
        assert_eq!(e.code(), code, "{name}: {e}");
        assert!(e.to_string().contains(key), "{name}: {e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{name}: {e}");
    }
    // a directory where the file should be cannot be read
    let e = load_at(&netconf(static_only(json!({}))), "", &[dir.path().to_path_buf()]).unwrap_err();
    assert_eq!(e.code(), 5, "{e}");
}

#[test]
fn serialises_as_cni_result_types() {
    let route = Route {
        dst: "10.96.0.0/12".parse().unwrap(),
        gw: None,
        mtu: Some(1400),
        advmss: None,
        priority: None,
        table: None,
        scope: None,
    };
    assert_eq!(serde_json::to_value(&route).unwrap(), json!({"dst": "10.96.0.0/12", "mtu": 1400}));
    let dns = Dns { nameservers: vec!["10.96.0.10".into()], domain: None, search: vec![], options: vec![] };
    assert_eq!(serde_json::to_value(&dns).unwrap(), json!({"nameservers": ["10.96.0.10"]}));
}

#[test]
fn log_levels() {
    for (s, l) in [
        ("debug", LogLevel::Debug),
        ("Verbose", LogLevel::Verbose),
        ("INFO", LogLevel::Info),
        ("error", LogLevel::Error),
        ("panic", LogLevel::Panic),
    ] {
        assert_eq!(LogLevel::parse(s), Some(l));
        assert_eq!(LogLevel::parse(l.as_str()), Some(l));
    }
    assert!(LogLevel::Panic < LogLevel::Debug);
    assert_eq!(LogLevel::parse("warn"), None);
}

#[test]
fn codes() {
    let io = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
    let json_err = || serde_json::from_str::<Value>("{").unwrap_err();
    let cases = [
        (ConfigError::UnsupportedVersion { found: None }, 1),
        (ConfigError::UnknownKeys(vec![]), 2),
        (ConfigError::CniArgs(String::new()), 4),
        (ConfigError::Io { key: String::new(), path: PathBuf::new(), source: io() }, 5),
        (ConfigError::NotJson { key: String::new(), source: json_err() }, 6),
        (ConfigError::WrongType { key: String::new(), expected: "", found: "" }, 6),
        (ConfigError::invalid("", ""), 7),
    ];
    for (e, code) in cases {
        assert_eq!(e.code(), code, "{e:?}");
    }
}

// --- needs range: these build IpRanges ---

#[test]
fn range_first_then_ip_ranges_in_order() {
    let conf = netconf(ranged(json!({
        "ipRanges": [{"range": "10.1.0.0/24", "exclude": ["10.1.0.0/28"]}, {"range": "2001:db8::/64"}],
    })));
    let c = ok(&conf, "");
    let cidrs: Vec<String> = c.ranges.iter().map(|r| r.cidr().to_string()).collect();
    assert_eq!(cidrs, ["10.0.0.0/24", "10.1.0.0/24", "2001:db8::/64"]);
}

#[test]
fn range_forms_whereabouts_accepts() {
    for (range, cidr) in [
        ("192.168.2.225/28", "192.168.2.224/28"),
        ("10.0.0.5-10.0.0.20/24", "10.0.0.0/24"),
        ("2001:db8:5422:5::-2001:db8:5422:5:7fff:ffff:ffff:ffff/64", "2001:db8:5422:5::/64"),
    ] {
        let c = ok(&netconf(ranged(json!({"range": range}))), "");
        assert_eq!(c.ranges[0].cidr().to_string(), cidr, "{range}");
    }
    // the same start twice is not a conflict
    ok(&netconf(ranged(json!({"range": "10.0.0.5-10.0.0.20/24", "range_start": "10.0.0.5"}))), "");
}

#[test]
fn gateway_is_never_handed_out() {
    let c = ok(&netconf(ranged(json!({"gateway": "10.0.0.1"}))), "");
    assert_eq!(c.gateway, Some(ip("10.0.0.1")));
    let r = &c.ranges[0];
    assert!(!r.is_usable(r.offset_of(ip("10.0.0.1")).unwrap()));
    assert!(r.is_usable(r.offset_of(ip("10.0.0.2")).unwrap()));
}

#[test]
fn requested_addresses_from_runtime_config_and_cni_args() {
    let conf = netconf_with(
        json!({"runtimeConfig": {"ips": ["10.0.0.5/24", "2001:db8::7", "10.0.0.5/32"], "portMappings": []}}),
        ranged(json!({"ipRanges": [{"range": "2001:db8::/64"}]})),
    );
    let c = ok(&conf, "IP=2001:db8::7,10.0.0.5;K8S_POD_NAME=p");
    assert_eq!(c.requested, [ip("10.0.0.5"), ip("2001:db8::7")]);
    // a second address of one range could never be handed out: refused, not dropped
    let err = refused(&conf, "IP=10.0.0.9;K8S_POD_NAME=p");
    assert_eq!(err.code(), 7);
    assert!(err.to_string().contains("10.0.0.9 and 10.0.0.5 both lie in range 10.0.0.0/24"), "{err}");
}

#[test]
fn flat_file_can_give_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let flat = write(dir.path(), "f.conf", r#"{"range": "10.5.0.0/16", "range_start": "10.5.1.0"}"#);
    let c = load_at(&netconf(ranged(json!({"range": null}))), "", &[flat]).unwrap();
    assert_eq!(c.ranges[0].cidr().to_string(), "10.5.0.0/16");
}

#[test]
fn node_slice_size_that_fits() {
    let c = ok(&netconf(ranged(json!({"range": "10.0.0.0/16", "node_slice_size": "/24"}))), "");
    assert!(matches!(&c.mode, super::Mode::Slices(s) if s.size.as_str() == "/24" && s.size.prefix() == 24));
}

#[test]
fn ranges_a_pool_cannot_serve_are_refused() {
    // one pool per CIDR holds one address per attachment
    let dup = netconf(ranged(json!({"ipRanges": [{"range": "10.0.0.0/24", "exclude": ["10.0.0.0/25"]}]})));
    let err = refused(&dup, "");
    assert_eq!(err.code(), 7);
    assert_eq!(
        err.to_string(),
        "ipam.ipRanges[0]: 10.0.0.0/24 is the CIDR of ipam.range too: both would share one pool; merge them"
    );
    // every usable address at an offset Whereabouts cannot record
    let high = netconf(json!({"type": "hereabouts", "range": "2001:db8::8000:0:0:0-2001:db8::ffff:ffff:ffff:fffe/64"}));
    let err = refused(&high, "");
    assert_eq!(err.code(), 7);
    assert!(err.to_string().starts_with("ipam.range: every usable address of 2001:db8::/64 is 2^63 or more"), "{err}");
    assert!(err.to_string().ends_with("set large_offsets"), "{err}");
    // with large_offsets, such a range hands them out, and an address up there may be asked for
    let high = netconf(json!({"type": "hereabouts", "large_offsets": true, "kubernetes": {"kubeconfig": "/k"},
        "range": "2001:db8::8000:0:0:0-2001:db8::ffff:ffff:ffff:fffe/64"}));
    let c = ok(&high, "IP=2001:db8::ffff:0:0:1;K8S_POD_NAME=p");
    assert_eq!(c.ranges[0].max_offset(), u128::MAX);
    assert_eq!(c.requested_for(0), Some(ip("2001:db8::ffff:0:0:1")));
    let refused_ip =
        refused(&netconf(json!({"type": "hereabouts", "range": "2001:db8::/64"})), "IP=2001:db8::ffff:0:0:1");
    assert!(refused_ip.to_string().contains("2^63 or more above"), "{refused_ip}");
    // a requested address goes to the first of the overlapping ranges that can hand it out
    let overlap = netconf(json!({"type": "hereabouts", "kubernetes": {"kubeconfig": "/k"},
        "ipRanges": [{"range": "10.0.0.0/24", "range_start": "10.0.0.100"}, {"range": "10.0.0.0/20"}]}));
    let c = ok(&overlap, "IP=10.0.0.2;K8S_POD_NAME=p");
    assert_eq!((c.requested_for(0), c.requested_for(1)), (None, Some(ip("10.0.0.2"))));
}

#[test]
fn provider_ranges_are_candidates_placed_by_their_entries() {
    let provider = json!({"url": "https://p.example", "ca_file": "/ca.pem", "parent_interface": "eth1"});
    let c = ok(
        &netconf(ranged(json!({"iaas_provider": provider, "ipRanges": [
            {"range": "10.1.0.0/28", "node_name": "node-a"},
            {"range": "10.2.0.0/24", "iaas_provider": false},
            {"range": "10.3.0.0/24", "iaas_provider": true},
        ]}))),
        "",
    );
    let warm = Placement::Provider(Mode::NodeWarm { node: "node-a".into() });
    let global = Placement::Provider(Mode::Global);
    assert_eq!(placements(&c), vec![global.clone(), warm, Placement::Ordinary, global]);
    // without a provider every range is ordinary, and the entry keys of the mode are refused
    assert!(matches!(ok(&netconf(ranged(json!({}))), "").mode, super::Mode::Pools(_)));
    for (entry, key) in [
        (json!({"range": "10.1.0.0/28", "node_name": "node-a"}), "ipam.ipRanges[0].node_name"),
        (json!({"range": "10.1.0.0/28", "iaas_provider": false}), "ipam.ipRanges[0].iaas_provider"),
    ] {
        let err = refused(&netconf(ranged(json!({"ipRanges": [entry]}))), "");
        assert_eq!(err.code(), 7);
        assert!(err.to_string().starts_with(&format!("{key}: only with ipam.iaas_provider")), "{err}");
    }
    let both = json!({"iaas_provider": provider, "ipRanges": [{"range": "10.1.0.0/28", "node_name": "a", "iaas_provider": false}]});
    let err = refused(&netconf(ranged(both)), "");
    assert!(err.to_string().starts_with("ipam.ipRanges[0].node_name: a node-warm pool is provider-backed"), "{err}");
    let typo = json!({"iaas_provider": provider, "ipRanges": [{"range": "10.1.0.0/28", "nodeName": "a"}]});
    let err = refused(&netconf(ranged(typo)), "");
    assert_eq!(err.code(), 2, "camelCase nodeName is not node_name: {err}");
    assert!(err.to_string().contains("ipRanges[0].nodeName"), "{err}");
}

#[test]
fn a_paired_range_follows_its_ipv4_range_and_is_refused_where_it_cannot_pair() {
    let provider = json!({"url": "https://p.example", "ca_file": "/ca.pem", "parent_interface": "eth1"});
    let with = |entries: Value| {
        netconf(json!({"type": "hereabouts", "kubernetes": {"kubeconfig": KUBECONFIG},
        "iaas_provider": provider, "ipRanges": entries}))
    };
    let c =
        ok(&with(json!([{"range": "10.9.0.0/24"}, {"range": "10.1.0.0/24", "paired_range": "2001:db8:1::/64"}])), "");
    let cidrs: Vec<String> = c.ranges.iter().map(|r| r.cidr().to_string()).collect();
    assert_eq!(cidrs, ["10.9.0.0/24", "10.1.0.0/24", "2001:db8:1::/64"], "the IPv6 range right after its partner");
    assert_eq!(
        placements(&c),
        vec![Placement::Provider(Mode::Global), Placement::Paired { v6: 2 }, Placement::PairedV6 { v4: 1 }]
    );
    for (entry, says) in [
        (
            json!({"range": "10.1.0.0/24", "paired_range": "10.2.0.0/24"}),
            "pairs an IPv4 range (range) with an IPv6 one",
        ),
        (json!({"range": "2001:db8:2::/64", "paired_range": "2001:db8:1::/64"}), "pairs an IPv4 range (range)"),
        (json!({"range": "10.1.0.0/24", "paired_range": "2001:db8:1::/64", "node_name": "a"}), "not with node_name"),
        (json!({"range": "10.1.0.0/24", "paired_range": "2001:db8:1::/64", "iaas_provider": false}), "provider-backed"),
    ] {
        let err = refused(&with(json!([entry])), "");
        assert_eq!(err.code(), 7, "{entry}: {err}");
        assert!(err.to_string().starts_with("ipam.ipRanges[0].paired_range: "), "{entry}: {err}");
        assert!(err.to_string().contains(says), "{entry}: {err}");
    }
    let plain = netconf(ranged(json!({"ipRanges": [{"range": "10.1.0.0/24", "paired_range": "2001:db8:1::/64"}]})));
    assert!(refused(&plain, "").to_string().contains("only with ipam.iaas_provider"));
    // DEL releases in both pools of the pair
    let stdin = with(json!([{"range": "10.1.0.0/24", "paired_range": "2001:db8:1::/64"}]));
    let del = load_for_release_with_paths(&Input { stdin: &stdin, cni_args: "" }, &[]);
    assert_eq!(del.ranges.len(), 2);
}

#[test]
fn enable_l3_makes_a_31_and_a_32_ranges_whose_every_address_is_a_host() {
    let cfg = ok(&netconf(ranged(json!({"range": "10.0.0.0/31", "enable_l3": true}))), "");
    assert_eq!(cfg.ranges[0].usable_count(), 2);
    let cfg = ok(&netconf(ranged(json!({"range": "10.0.0.1/32", "enable_l3": true}))), "");
    assert_eq!((cfg.ranges[0].usable_count(), cfg.ranges[0].first_usable()), (1, Some(0)));
    let cfg = ok(&netconf(ranged(json!({"range": "10.0.0.0/24", "enable_l3": true}))), "");
    assert!(cfg.ranges[0].is_usable(0) && cfg.ranges[0].is_usable(255));
    let listed =
        ok(&netconf(ranged(json!({"range": null, "ipRanges": [{"range": "10.0.1.0/31"}], "enable_l3": true}))), "");
    assert_eq!(listed.ranges[0].usable_count(), 2, "every range of the config");
    let not_bool = refused(&netconf(ranged(json!({"enable_l3": "yes"}))), "");
    assert!(not_bool.to_string().contains("enable_l3"), "{not_bool}");
}

#[test]
fn allow_persistent_ips_and_a_claim_named_by_the_runtime_are_read_from_the_top_level() {
    let top = json!({"allowPersistentIPs": true, "args": {"cni": {"ipam-claim-reference": "vm1.net", "other": 1}}});
    let c = ok(&netconf_with(top, ranged(json!({}))), POD_ARGS);
    let super::Mode::Pools(pools) = &c.mode else { panic!("one pool per range: {:?}", c.mode) };
    assert_eq!(pools.persistent_ips, PersistentIps { allowed: true, reference: Some("vm1.net".into()) });
    let c = ok(&netconf(ranged(json!({}))), POD_ARGS);
    let super::Mode::Pools(pools) = &c.mode else { panic!() };
    assert_eq!(pools.persistent_ips, PersistentIps::default(), "off unless asked");
}
