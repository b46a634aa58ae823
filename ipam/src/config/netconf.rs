//! The JSON of the netconf and of an `ipam` object (inline or the flat file) -> typed, per-key validated fields.
//!
//! Keys and meanings are Whereabouts' (`pkg/types/types.go`, `IPAMConfig.UnmarshalJSON`), except that a key this
//! plugin does not know is refused instead of dropped, and a value of the wrong type or shape is refused with the
//! key named.
//!
//! Each key is read by one rule for both loaders: ADD's refuses the config at the first mistake, DEL's and GC's
//! ([`super::release`]) passes over the key with a warning ([`Problems`]).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde_json::{Map, Value};

use super::error::ConfigError;
use super::field::{Field, Origin, sourced};
use super::json::{Problems, array, boolean, check_keys, object, string, strings, uint, uint32};
use super::routing::{self, RawRouting};
use super::{Dns, LogLevel, Route, SUPPORTED_CNI_VERSIONS, StaticAddress};
use crate::allocator::Strategy;

/// One `ipRanges[]` entry, checked for shape only (the range math is [`super::ranges`]' job).
#[derive(Debug, Clone, Default)]
pub(super) struct RawRange {
    /// Its place in `ipRanges`, for messages: a lenient read leaves out the entries it cannot read.
    pub index: usize,
    pub range: Option<String>,
    pub range_start: Option<String>,
    pub range_end: Option<String>,
    pub exclude: Vec<String>,
    /// IaaS provider mode: the node this range's pool is bound to (a node-warm pool).
    pub node_name: Option<String>,
    /// IaaS provider mode: `false` keeps this range out of the provider (an ordinary range among the candidates).
    pub iaas_provider: Option<bool>,
    /// IaaS provider mode: the IPv6 range whose addresses pair with this IPv4 range's on one sub-interface.
    pub paired_range: Option<String>,
    /// The name a pod's range choice may use for this range (besides its CIDR).
    pub name: Option<String>,
    /// The nodes this range serves, as a label selector.
    pub node_selector: Option<String>,
    /// Sticky StatefulSet addresses in this range (overrides the ipam-level key).
    pub sticky_statefulset: Option<bool>,
}

/// `dns`: merged key by key like Whereabouts' `mergo.Merge` does with `cnitypes.DNS`.
#[derive(Debug, Clone, Default)]
pub(super) struct RawDns<'p> {
    pub nameservers: Field<'p, Vec<String>>,
    pub domain: Field<'p, String>,
    pub search: Field<'p, Vec<String>>,
    pub options: Field<'p, Vec<String>>,
}

/// An `ipam` object (inline or flat file). Empty values (`""`, `[]`, `null`) are absent, as for Whereabouts.
#[derive(Debug, Clone, Default)]
pub(super) struct RawIpam<'p> {
    pub type_: Field<'p, String>,
    pub range: Field<'p, String>,
    pub range_start: Field<'p, String>,
    pub range_end: Field<'p, String>,
    pub exclude: Field<'p, Vec<String>>,
    pub ip_ranges: Field<'p, Vec<RawRange>>,
    pub gateway: Field<'p, IpAddr>,
    pub routes: Field<'p, Vec<Route>>,
    pub dns: RawDns<'p>,
    pub addresses: Field<'p, Vec<StaticAddress>>,
    pub network_name: Field<'p, String>,
    pub overlapping_ranges: Field<'p, bool>,
    pub kubeconfig: Field<'p, PathBuf>,
    pub configuration_path: Field<'p, PathBuf>,
    pub log_file: Field<'p, PathBuf>,
    pub log_level: Field<'p, LogLevel>,
    pub node_slice_size: Field<'p, crate::cut::SliceSize>,
    /// `min_node_slice_size` (ours): adaptive slices, a node's first slice this size, each next one twice as large up
    /// to `node_slice_size`.
    pub min_node_slice_size: Field<'p, crate::cut::SliceSize>,
    pub reconciler_cron_expression: Field<'p, String>,
    pub strategy: Field<'p, Strategy>,
    pub timeout: Field<'p, Duration>,
    /// `iaas_provider` as given: read by [`super::provider::parse`] once the invocation's budget is known.
    pub iaas_provider: Field<'p, Map<String, Value>>,
    /// `pod_ranges`: a pod (or its namespace) chooses which ranges its ADD uses.
    pub pod_ranges: Field<'p, bool>,
    /// `reuse_cooldown_seconds`: the pools' reuse cooldown, `0` to take it away.
    pub reuse_cooldown: Field<'p, u64>,
    /// `sticky_statefulset`: the default of every range (`range`'s own).
    pub sticky_statefulset: Field<'p, bool>,
    /// `warm_addresses`: how many attachments' addresses the node agent keeps claimed in advance (node slices).
    pub warm_addresses: Field<'p, u64>,
    /// `enable_l3` (the maintained Whereabouts fork's): the network and broadcast addresses are handed out too.
    pub enable_l3: Field<'p, bool>,
    /// `max_slices_per_node`: how many slices of the range one node may claim (node slices).
    pub max_slices_per_node: Field<'p, u64>,
    /// `preferred_ip_annotation`: the pod's `whereabouts.cni.cncf.io/preferred-ip` is taken when free.
    pub preferred_ip_annotation: Field<'p, bool>,
    /// `large_offsets`: offsets at or above 2^63 are handed out (no Whereabouts v0.9 reader in the fleet).
    pub large_offsets: Field<'p, bool>,
    /// The routing-table datastore and the announcement of addresses as host routes.
    pub routing: RawRouting<'p>,
    /// Keys accepted and ignored, named as in messages.
    pub ignored: Vec<String>,
}

/// The parts of the netconf this plugin reads; every other top-level key belongs to the calling plugin.
#[derive(Debug)]
pub(super) struct NetConf<'v> {
    pub cni_version: String,
    pub name: String,
    pub ipam: &'v Map<String, Value>,
    /// `runtimeConfig.ips`, each with its key.
    pub runtime_ips: Vec<(String, String)>,
    /// `allowPersistentIPs` and `args.cni["ipam-claim-reference"]`.
    pub persistent_ips: super::mode::PersistentIps,
}

/// The key of `args.cni` that names an IPAMClaim, as the network selection element names it.
pub const CLAIM_REFERENCE_ARG: &str = "ipam-claim-reference";

/// Whereabouts' keys of the `ipam` object that hereabouts accepts and ignores (etcd, leader election, test knobs).
pub const IGNORED_KEYS: &[&str] = &[
    "etcd_host",
    "etcd_username",
    "etcd_password",
    "etcd_key_file",
    "etcd_cert_file",
    "etcd_ca_cert_file",
    "leader_lease_duration",
    "leader_renew_deadline",
    "leader_retry_period",
    "sleep_for_race",
];

/// The keys of the `ipam` object (and of the flat file) that mean something here, besides the routing keys
/// ([`super::ROUTING_KEYS`]).
pub const IPAM_KEYS: &[&str] = &[
    "type",
    "range",
    "range_start",
    "range_end",
    "exclude",
    "ipRanges",
    "gateway",
    "routes",
    "dns",
    "addresses",
    "network_name",
    "enable_overlapping_ranges",
    "kubernetes",
    "configuration_path",
    "log_file",
    "log_level",
    "node_slice_size",
    "min_node_slice_size",
    "reconciler_cron_expression",
    "allocation_strategy",
    "timeout_seconds",
    "iaas_provider",
    "pod_ranges",
    "reuse_cooldown_seconds",
    "sticky_statefulset",
    "warm_addresses",
    "max_slices_per_node",
    "enable_l3",
    "preferred_ip_annotation",
    "large_offsets",
];

const IPAM_HINTS: &[(&str, &str)] = &[
    ("subnet", "did you mean \"range\"? (host-local's `subnet`)"),
    ("ranges", "did you mean \"ipRanges\"? (host-local's `ranges` is a list of lists; here it is one list)"),
    ("kubeconfig", "did you mean \"kubernetes\": {\"kubeconfig\": ...}?"),
    ("overlappingranges", "did you mean \"enable_overlapping_ranges\"?"),
    ("ips", "requested addresses go in the top-level \"runtimeConfig\": {\"ips\": [...]} or CNI_ARGS IP="),
    ("strategy", "did you mean \"allocation_strategy\"?"),
    ("timeout", "did you mean \"timeout_seconds\"?"),
    ("omitranges", "did you mean \"exclude\"?"),
    ("gw", "did you mean \"gateway\"?"),
    ("ipam", "the flat file holds the keys of the ipam object itself, not an \"ipam\" object"),
    ("cniversion", "the flat file holds only keys of the ipam object"),
    ("name", "the network name is the top-level \"name\" of the netconf; pools are named by \"network_name\""),
];

const RANGE_KEYS: &[&str] = &[
    "range",
    "range_start",
    "range_end",
    "exclude",
    "node_name",
    "iaas_provider",
    "paired_range",
    "name",
    "node_selector",
    "sticky_statefulset",
];
const RANGE_HINTS: &[(&str, &str)] =
    &[("gateway", "the gateway is set once, in \"gateway\" of the ipam object"), ("subnet", "did you mean \"range\"?")];
const ROUTE_KEYS: &[&str] = &["dst", "gw", "mtu", "advmss", "priority", "table", "scope"];
const ADDRESS_KEYS: &[&str] = &["address", "gateway"];
const DNS_KEYS: &[&str] = &["nameservers", "domain", "search", "options"];
const KUBERNETES_KEYS: &[&str] = &["kubeconfig", "k8s_api_root"];

/// Reads the top level of the netconf: `cniVersion`, `name`, `ipam`, `runtimeConfig.ips`.
pub(super) fn parse_netconf(v: &Value) -> Result<NetConf<'_>, ConfigError> {
    let Value::Object(top) = v else { return Err(super::json::wrong_type("stdin", "a JSON object", v)) };
    let cni_version = match top.get("cniVersion") {
        None | Some(Value::Null) => return Err(ConfigError::UnsupportedVersion { found: None }),
        Some(v) => string(v, "cniVersion")?.unwrap_or_default(),
    };
    if !SUPPORTED_CNI_VERSIONS.contains(&cni_version.as_str()) {
        return Err(ConfigError::UnsupportedVersion { found: Some(cni_version) });
    }
    let name = match top.get("name") {
        Some(v) => string(v, "name")?,
        None => None,
    }
    .ok_or_else(|| ConfigError::invalid("name", "missing: the CNI spec requires the network name"))?;
    let ipam = match top.get("ipam") {
        None | Some(Value::Null) => return Err(ConfigError::invalid("ipam", "missing: this is an IPAM plugin")),
        Some(v) => object(v, "ipam")?.expect("null handled above"),
    };
    let mut runtime_ips = Vec::new();
    if let Some(rc) = top.get("runtimeConfig")
        && let Some(rc) = object(rc, "runtimeConfig")?
        && let Some(ips) = rc.get("ips")
    {
        let ips = strings(ips, "runtimeConfig.ips")?.unwrap_or_default();
        runtime_ips = ips.into_iter().enumerate().map(|(i, ip)| (format!("runtimeConfig.ips[{i}]"), ip)).collect();
    }
    let allowed = match top.get("allowPersistentIPs") {
        None | Some(Value::Null) => false,
        Some(v) => boolean(v, "allowPersistentIPs")?.unwrap_or(false),
    };
    let mut reference = None;
    if let Some(args) = top.get("args")
        && let Some(args) = object(args, "args")?
        && let Some(cni) = args.get("cni")
        && let Some(cni) = object(cni, "args.cni")?
        && let Some(v) = cni.get(CLAIM_REFERENCE_ARG)
    {
        let key = format!("args.cni.{CLAIM_REFERENCE_ARG}");
        let name = string(v, &key)?.unwrap_or_default();
        if !crate::names::is_dns_subdomain(&name) {
            return Err(ConfigError::invalid(key, format!("{name:?} is not an IPAMClaim name")));
        }
        reference = Some(name);
    }
    let persistent_ips = super::mode::PersistentIps { allowed, reference };
    Ok(NetConf { cni_version, name, ipam, runtime_ips, persistent_ips })
}

/// Reads one `ipam` object: the inline one or the flat file. Strict, the first mistake is the error; lenient, a
/// key with a mistake is left out (and an `ipRanges` entry or `kubernetes` key with one, rather than all of them).
pub(super) fn parse_ipam<'p>(
    map: &Map<String, Value>,
    origin: Origin<'p>,
    problems: &mut Problems,
) -> Result<RawIpam<'p>, ConfigError> {
    let known = [IPAM_KEYS, routing::KEYS, IGNORED_KEYS].concat();
    problems.check_keys(map, &known, IPAM_HINTS, |k| origin.key(k))?;
    let mut raw = RawIpam::default();
    for (name, v) in map.iter().filter(|(k, _)| known.contains(&k.as_str())) {
        let read = parse_key(&mut raw, name, v, origin, problems);
        problems.pass(read)?;
    }
    Ok(raw)
}

/// Reads one known key of an `ipam` object into `raw`, which is left as it was when the value has a mistake.
fn parse_key<'p>(
    raw: &mut RawIpam<'p>,
    name: &str,
    v: &Value,
    origin: Origin<'p>,
    problems: &mut Problems,
) -> Result<(), ConfigError> {
    let key = origin.key(name);
    let key = key.as_str();
    match name {
        "type" => raw.type_ = sourced(origin, string(v, key)?),
        "range" => raw.range = sourced(origin, string(v, key)?),
        "range_start" => raw.range_start = sourced(origin, string(v, key)?),
        "range_end" => raw.range_end = sourced(origin, string(v, key)?),
        "exclude" => raw.exclude = sourced(origin, strings(v, key)?),
        "ipRanges" => raw.ip_ranges = sourced(origin, list(v, key, problems, parse_range_entry)?),
        "gateway" => raw.gateway = sourced(origin, string(v, key)?.map(|s| ip(&s, key)).transpose()?),
        "routes" => raw.routes = sourced(origin, list(v, key, problems, |m, k, _, _| parse_route(m, k))?),
        "addresses" => raw.addresses = sourced(origin, list(v, key, problems, |m, k, _, _| parse_address(m, k))?),
        "dns" => raw.dns = parse_dns(v, origin)?,
        "network_name" => {
            raw.network_name = sourced(origin, string(v, key)?.map(|s| network_name(s, key)).transpose()?);
        }
        "enable_overlapping_ranges" => raw.overlapping_ranges = sourced(origin, boolean(v, key)?),
        "kubernetes" => parse_kubernetes(v, origin, raw, problems)?,
        "configuration_path" => raw.configuration_path = sourced(origin, absolute(v, key)?),
        "log_file" => raw.log_file = sourced(origin, log_file(v, key, origin)?),
        "log_level" => raw.log_level = sourced(origin, string(v, key)?.map(|s| log_level(&s, key)).transpose()?),
        "node_slice_size" => {
            raw.node_slice_size = sourced(origin, string(v, key)?.map(|s| slice_size(s, key)).transpose()?);
        }
        "min_node_slice_size" => {
            raw.min_node_slice_size = sourced(origin, string(v, key)?.map(|s| slice_size(s, key)).transpose()?);
        }
        "reconciler_cron_expression" => raw.reconciler_cron_expression = sourced(origin, string(v, key)?),
        "allocation_strategy" => {
            raw.strategy = sourced(origin, string(v, key)?.map(|s| strategy(&s, key)).transpose()?);
        }
        "timeout_seconds" => raw.timeout = sourced(origin, uint(v, key)?.map(|n| timeout(n, key)).transpose()?),
        "iaas_provider" => raw.iaas_provider = sourced(origin, object(v, key)?.cloned()),
        "pod_ranges" => raw.pod_ranges = sourced(origin, boolean(v, key)?),
        "sticky_statefulset" => raw.sticky_statefulset = sourced(origin, boolean(v, key)?),
        "warm_addresses" => raw.warm_addresses = sourced(origin, uint(v, key)?.map(|n| warm(n, key)).transpose()?),
        "enable_l3" => raw.enable_l3 = sourced(origin, boolean(v, key)?),
        "preferred_ip_annotation" => raw.preferred_ip_annotation = sourced(origin, boolean(v, key)?),
        "large_offsets" => raw.large_offsets = sourced(origin, boolean(v, key)?),
        "max_slices_per_node" => {
            raw.max_slices_per_node = sourced(origin, uint(v, key)?.map(|n| slice_cap(n, key)).transpose()?);
        }
        "reuse_cooldown_seconds" => {
            raw.reuse_cooldown = sourced(origin, uint(v, key)?.map(|n| cooldown(n, key)).transpose()?);
        }
        k if routing::KEYS.contains(&k) => routing::parse_key(&mut raw.routing, name, v, origin, &mut raw.ignored)?,
        _ => raw.ignored.push(key.to_string()),
    }
    Ok(())
}

/// An array of objects, each read by `item` with its key `key[i]`; `null` and `[]` are absent. Lenient, an entry
/// with a mistake is left out.
fn list<T>(
    v: &Value,
    key: &str,
    problems: &mut Problems,
    item: impl Fn(&Map<String, Value>, &str, usize, &mut Problems) -> Result<T, ConfigError>,
) -> Result<Option<Vec<T>>, ConfigError> {
    let Some(items) = array(v, key)? else { return Ok(None) };
    let mut out = Vec::with_capacity(items.len());
    for (i, v) in items.iter().enumerate() {
        let key = format!("{key}[{i}]");
        let read = match object(v, &key) {
            Ok(Some(map)) => item(map, &key, i, problems),
            Ok(None) => Err(super::json::wrong_type(&key, "an object", v)),
            Err(e) => Err(e),
        };
        out.extend(problems.pass(read)?);
    }
    Ok(Some(out))
}

/// Lenient, a sub-key with a mistake is left out, so that a camelCase `rangeEnd` does not cost the entry its range.
fn parse_range_entry(
    map: &Map<String, Value>,
    key: &str,
    index: usize,
    problems: &mut Problems,
) -> Result<RawRange, ConfigError> {
    problems.check_keys(map, RANGE_KEYS, RANGE_HINTS, |k| format!("{key}.{k}"))?;
    let get = |k: &str| map.get(k).unwrap_or(&Value::Null);
    Ok(RawRange {
        index,
        range: problems.pass(string(get("range"), &format!("{key}.range")))?.flatten(),
        range_start: problems.pass(string(get("range_start"), &format!("{key}.range_start")))?.flatten(),
        range_end: problems.pass(string(get("range_end"), &format!("{key}.range_end")))?.flatten(),
        exclude: problems.pass(strings(get("exclude"), &format!("{key}.exclude")))?.flatten().unwrap_or_default(),
        node_name: problems.pass(string(get("node_name"), &format!("{key}.node_name")))?.flatten(),
        iaas_provider: problems.pass(boolean(get("iaas_provider"), &format!("{key}.iaas_provider")))?.flatten(),
        paired_range: problems.pass(string(get("paired_range"), &format!("{key}.paired_range")))?.flatten(),
        name: problems.pass(string(get("name"), &format!("{key}.name")))?.flatten(),
        node_selector: problems.pass(string(get("node_selector"), &format!("{key}.node_selector")))?.flatten(),
        sticky_statefulset: problems
            .pass(boolean(get("sticky_statefulset"), &format!("{key}.sticky_statefulset")))?
            .flatten(),
    })
}

fn parse_route(map: &Map<String, Value>, key: &str) -> Result<Route, ConfigError> {
    check_keys(map, ROUTE_KEYS, &[("destination", "did you mean \"dst\"?")], |k| format!("{key}.{k}"))?;
    let get = |k: &str| map.get(k).unwrap_or(&Value::Null);
    let dst_key = format!("{key}.dst");
    let dst = string(get("dst"), &dst_key)?.ok_or_else(|| ConfigError::invalid(&dst_key, "missing"))?;
    let dst = cidr(&dst, &dst_key)?;
    if dst != dst.trunc() {
        return Err(ConfigError::invalid(&dst_key, format!("{dst} has host bits set (did you mean {}?)", dst.trunc())));
    }
    let gw_key = format!("{key}.gw");
    let gw = string(get("gw"), &gw_key)?.map(|s| ip(&s, &gw_key)).transpose()?;
    if let Some(gw) = gw {
        same_family(gw, dst, &gw_key, "dst")?;
    }
    let scope = match uint32(get("scope"), &format!("{key}.scope"))? {
        Some(s) => Some(u8::try_from(s).map_err(|_| ConfigError::invalid(format!("{key}.scope"), "must be 0..=255"))?),
        None => None,
    };
    Ok(Route {
        dst,
        gw,
        mtu: uint32(get("mtu"), &format!("{key}.mtu"))?,
        advmss: uint32(get("advmss"), &format!("{key}.advmss"))?,
        priority: uint32(get("priority"), &format!("{key}.priority"))?,
        table: uint32(get("table"), &format!("{key}.table"))?,
        scope,
    })
}

fn parse_address(map: &Map<String, Value>, key: &str) -> Result<StaticAddress, ConfigError> {
    check_keys(map, ADDRESS_KEYS, &[("gw", "did you mean \"gateway\"?")], |k| format!("{key}.{k}"))?;
    let get = |k: &str| map.get(k).unwrap_or(&Value::Null);
    let addr_key = format!("{key}.address");
    let address = string(get("address"), &addr_key)?.ok_or_else(|| ConfigError::invalid(&addr_key, "missing"))?;
    let address = cidr(&address, &addr_key)?;
    let gw_key = format!("{key}.gateway");
    let gateway = string(get("gateway"), &gw_key)?.map(|s| ip(&s, &gw_key)).transpose()?;
    if let Some(gw) = gateway {
        same_family(gw, address, &gw_key, "address")?;
    }
    Ok(StaticAddress { address, gateway })
}

fn parse_dns<'p>(v: &Value, origin: Origin<'p>) -> Result<RawDns<'p>, ConfigError> {
    let Some(map) = object(v, &origin.key("dns"))? else { return Ok(RawDns::default()) };
    check_keys(map, DNS_KEYS, &[("nameserver", "did you mean \"nameservers\"?")], |k| origin.key(&format!("dns.{k}")))?;
    let mut dns = RawDns::default();
    for (name, v) in map {
        let key = origin.key(&format!("dns.{name}"));
        match name.as_str() {
            "nameservers" => {
                let servers = strings(v, &key)?;
                for (i, s) in servers.iter().flatten().enumerate() {
                    // a link-local server may carry a zone, `fe80::1%eth0`
                    let addr = s.split_once('%').map_or(s.as_str(), |(a, _)| a);
                    ip(addr, &format!("{key}[{i}]"))?;
                }
                dns.nameservers = sourced(origin, servers);
            }
            "domain" => dns.domain = sourced(origin, string(v, &key)?),
            "search" => dns.search = sourced(origin, strings(v, &key)?),
            "options" => dns.options = sourced(origin, strings(v, &key)?),
            _ => unreachable!("checked by check_keys"),
        }
    }
    Ok(dns)
}

/// Lenient, an unknown sub-key does not cost the `kubeconfig` next to it.
fn parse_kubernetes<'p>(
    v: &Value,
    origin: Origin<'p>,
    raw: &mut RawIpam<'p>,
    problems: &mut Problems,
) -> Result<(), ConfigError> {
    let Some(map) = object(v, &origin.key("kubernetes"))? else { return Ok(()) };
    problems.check_keys(map, KUBERNETES_KEYS, &[("kubeconfigpath", "did you mean \"kubeconfig\"?")], |k| {
        origin.key(&format!("kubernetes.{k}"))
    })?;
    for (name, v) in map.iter().filter(|(k, _)| KUBERNETES_KEYS.contains(&k.as_str())) {
        let key = origin.key(&format!("kubernetes.{name}"));
        match name.as_str() {
            "kubeconfig" => raw.kubeconfig = sourced(origin, problems.pass(absolute(v, &key))?.flatten()),
            _ => raw.ignored.push(key),
        }
    }
    Ok(())
}

pub(super) fn ip(s: &str, key: &str) -> Result<IpAddr, ConfigError> {
    s.parse().map_err(|_| ConfigError::invalid(key, format!("{s:?} is not an IP address")))
}

pub(super) fn cidr(s: &str, key: &str) -> Result<IpNet, ConfigError> {
    s.parse().map_err(|_| ConfigError::invalid(key, format!("{s:?} is not a CIDR (address/prefix)")))
}

pub(super) fn same_family(ip: IpAddr, net: IpNet, key: &str, other: &str) -> Result<(), ConfigError> {
    if ip.is_ipv4() == matches!(net, IpNet::V4(_)) {
        return Ok(());
    }
    Err(ConfigError::invalid(
        key,
        format!("{ip} is {} but {other} {net} is {}", family(ip.is_ipv4()), family(net_v4(net))),
    ))
}

pub(super) fn family(v4: bool) -> &'static str {
    if v4 { "IPv4" } else { "IPv6" }
}

pub(super) fn net_v4(net: IpNet) -> bool {
    matches!(net, IpNet::V4(_))
}

fn absolute(v: &Value, key: &str) -> Result<Option<PathBuf>, ConfigError> {
    let Some(s) = string(v, key)? else { return Ok(None) };
    let path = PathBuf::from(&s);
    if path.is_absolute() {
        Ok(Some(path))
    } else {
        Err(ConfigError::invalid(
            key,
            format!("{s:?} is not an absolute path (a CNI plugin's working directory is not defined)"),
        ))
    }
}

/// Where a NetworkAttachmentDefinition may put the plugin's log: the plugin runs as root on the host, so a path of
/// a NAD author's choosing anywhere else would let them create or append to any file there. The flat file, which
/// the node's administrator writes, may name any path.
pub const LOG_DIRS: [&str; 2] = ["/var/log/", "/tmp/"];

/// `log_file`: an absolute path; from the netconf, one below [`LOG_DIRS`] with no `..`.
fn log_file(v: &Value, key: &str, origin: Origin<'_>) -> Result<Option<PathBuf>, ConfigError> {
    let Some(path) = absolute(v, key)? else { return Ok(None) };
    let contained = path.components().all(|c| !matches!(c, std::path::Component::ParentDir))
        && LOG_DIRS.iter().any(|dir| path.starts_with(dir) && path != Path::new(dir));
    if origin == Origin::Inline && !contained {
        return Err(ConfigError::invalid(
            key,
            format!(
                "{:?}: a NetworkAttachmentDefinition may log only below {} (the node's flat file may name any path)",
                path.display(),
                LOG_DIRS.join(" or ")
            ),
        ));
    }
    Ok(Some(path))
}

/// Pools are named `<network_name>-<range>`, so the name must be usable in a Kubernetes object name.
fn network_name(s: String, key: &str) -> Result<String, ConfigError> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if s.chars().all(ok_char) && alnum(s.chars().next()) && alnum(s.chars().last()) && s.len() <= 200 {
        Ok(s)
    } else {
        Err(ConfigError::invalid(
            key,
            format!(
                "{s:?}: pool names start with it, so it must be lower-case letters, digits, '-' and '.', starting and ending with a letter or digit (at most 200)"
            ),
        ))
    }
}

fn log_level(s: &str, key: &str) -> Result<LogLevel, ConfigError> {
    LogLevel::parse(s)
        .ok_or_else(|| ConfigError::invalid(key, format!("{s:?}: expected one of debug, verbose, info, error, panic")))
}

fn strategy(s: &str, key: &str) -> Result<Strategy, ConfigError> {
    match s {
        "lowest" => Ok(Strategy::LowestFree),
        "random" => Ok(Strategy::Random),
        _ => Err(ConfigError::invalid(key, format!("{s:?}: expected \"lowest\" or \"random\""))),
    }
}

fn timeout(n: u64, key: &str) -> Result<Duration, ConfigError> {
    let max = super::MAX_TIMEOUT.as_secs();
    if n == 0 || n > max {
        // longer than a runtime waits, and the reconciler takes a claim older than that for abandoned
        return Err(ConfigError::invalid(key, format!("{n}: must be 1 to {max} (seconds)")));
    }
    Ok(Duration::from_secs(n))
}

fn cooldown(n: u64, key: &str) -> Result<u64, ConfigError> {
    let max = crate::cooldown::MAX_COOLDOWN_SECONDS;
    if n > max {
        return Err(ConfigError::invalid(key, format!("{n}: must be 0 (off) to {max} (seconds, a day)")));
    }
    Ok(n)
}

/// `warm_addresses`: at most [`crate::warm::MAX_WARM`] per network and node.
fn warm(n: u64, key: &str) -> Result<u64, ConfigError> {
    if n > crate::warm::MAX_WARM {
        return Err(ConfigError::invalid(key, format!("{n} is more than {}", crate::warm::MAX_WARM)));
    }
    Ok(n)
}

/// `max_slices_per_node`: at least one (a node with no slice of its own could only borrow).
fn slice_cap(n: u64, key: &str) -> Result<u64, ConfigError> {
    if n == 0 {
        return Err(ConfigError::invalid(
            key,
            "0: a node needs at least one slice of its own; leave it out for no cap",
        ));
    }
    Ok(n)
}

/// `node_slice_size`: a prefix length, `/24` or `24` (Whereabouts' `iphelpers.DivideRangeBySize`).
fn slice_size(s: String, key: &str) -> Result<crate::cut::SliceSize, ConfigError> {
    crate::cut::SliceSize::parse(&s)
        .ok_or_else(|| ConfigError::invalid(key, format!("{s:?}: expected a prefix length such as \"/26\" or \"26\"")))
}

/// Whether the inline `ipam.type` names this plugin: Whereabouts only accepts `"whereabouts"` (and checks it
/// before merging the flat file); hereabouts, a drop-in, accepts its own name too.
pub(super) fn check_type(raw: &RawIpam<'_>) -> Result<(), ConfigError> {
    match &raw.type_ {
        None => Err(ConfigError::invalid("ipam.type", "missing (expected \"hereabouts\" or \"whereabouts\")")),
        Some(t) if super::IPAM_TYPES.contains(&t.value.as_str()) => Ok(()),
        Some(t) => Err(ConfigError::invalid(
            "ipam.type",
            format!("{:?} is not this plugin (expected \"hereabouts\" or \"whereabouts\")", t.value),
        )),
    }
}

impl RawDns<'_> {
    pub(super) fn into_dns(self) -> Option<Dns> {
        let dns = Dns {
            nameservers: self.nameservers.map(|f| f.value).unwrap_or_default(),
            domain: self.domain.map(|f| f.value),
            search: self.search.map(|f| f.value).unwrap_or_default(),
            options: self.options.map(|f| f.value).unwrap_or_default(),
        };
        let empty =
            dns.nameservers.is_empty() && dns.domain.is_none() && dns.search.is_empty() && dns.options.is_empty();
        (!empty).then_some(dns)
    }
}
