//! Network configs that are valid by construction: every key of `IPAM_KEYS` a Whereabouts or hereabouts user
//! writes, with values that agree with each other (bounds inside their range, a gateway inside a range, a
//! requested address usable, a node slice that fits every range, static addresses no range hands out).
//!
//! The generator draws raw numbers (so proptest can shrink them) and [`Netconf::build`] turns them into a config.
//! Ranges are carved from disjoint slots (a /20 of 198.18.0.0/15 or a /48 of 2001:db8::/32 each), so that a
//! config the generator calls valid cannot fail for an overlap the loader does not look for; overlaps come from
//! the mutations.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hereabouts_ipam::allocator::usable_up_to_max;
use hereabouts_ipam::config::SUPPORTED_CNI_VERSIONS;
use hereabouts_ipam::range::IpRange;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::string::{RegexGeneratorStrategy, string_regex};
use serde_json::{Map, Value, json};

/// The kubeconfig every config names; the test connector never reads it.
pub const KUBECONFIG: &str = "/etc/cni/net.d/hereabouts.d/hereabouts.kubeconfig";

/// `cniVersion`s the plugin refuses (code 1).
const UNSUPPORTED_VERSIONS: &[&str] = &["0.1.0", "0.2.0", "0.4.1", "1.0", "1.2.0", "2.0.0", ""];

/// Strings matching `pattern`, compiled once: a `&str` strategy parses its regex again for every value.
pub fn re(pattern: &str) -> RegexGeneratorStrategy<String> {
    string_regex(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"))
}

/// The raw draws for one range.
#[derive(Debug, Clone)]
pub struct RangeSeed {
    v6: bool,
    prefix: u8,
    net: u128,
    /// 0: CIDR, 1: CIDR with host bits, 2: `A-B/len`, 3: CIDR with `range_start`/`range_end`.
    form: u8,
    a: u128,
    b: u128,
    start: Option<u128>,
    end: Option<u128>,
    /// (kind, position, prefix draw): 0 a bare address, 1 a small CIDR inside the range, 2 an address as `/32`.
    excludes: Vec<(u8, u128, u8)>,
}

fn range_seed() -> impl Strategy<Value = RangeSeed> {
    (
        prop::bool::weighted(0.35),
        any::<u8>(),
        any::<u128>(),
        0u8..4,
        (any::<u128>(), any::<u128>()),
        (prop::option::weighted(0.5, any::<u128>()), prop::option::weighted(0.5, any::<u128>())),
        prop::collection::vec((0u8..3, any::<u128>(), any::<u8>()), 0..3),
    )
        .prop_map(|(v6, prefix, net, form, (a, b), (start, end), excludes)| RangeSeed {
            v6,
            prefix,
            net,
            form,
            a,
            b,
            start,
            end,
            excludes,
        })
}

/// The raw draws for the other keys.
#[derive(Debug, Clone)]
pub struct OptionsSeed {
    version: Index,
    unsupported_version: bool,
    name: String,
    whereabouts_type: bool,
    top_level_range: bool,
    gateway: Option<(Index, u128)>,
    requested: Option<(Index, u128, u8)>,
    /// (how many, gateway or not)
    statics: Option<(u8, bool)>,
    routes: Vec<(Index, Option<u32>, Option<u8>)>,
    dns: Option<(u8, bool)>,
    network_name: Option<String>,
    overlapping: Option<bool>,
    strategy: Option<bool>,
    timeout: Option<u64>,
    log_level: Option<Index>,
    log_file: bool,
    node_slice: Option<(u8, bool)>,
    cron: bool,
    kubeconfig: bool,
    api_root: bool,
    legacy_keys: bool,
    attachments: Option<u8>,
    free: u128,
}

fn options_seed() -> impl Strategy<Value = OptionsSeed> {
    let names = prop_oneof![
        8 => re("[a-z][a-z0-9-]{0,15}"),
        1 => re("\\PC{1,8}"),
    ];
    let network_name = re("[a-z0-9]([a-z0-9.-]{0,18}[a-z0-9])?");
    (
        (any::<Index>(), prop::bool::weighted(0.04), names, any::<bool>(), prop::bool::weighted(0.6)),
        (
            prop::option::weighted(0.45, (any::<Index>(), any::<u128>())),
            prop::option::weighted(0.25, (any::<Index>(), any::<u128>(), 0u8..4)),
            prop::option::weighted(0.15, (1u8..3, any::<bool>())),
        ),
        (
            prop::collection::vec(
                (any::<Index>(), prop::option::of(any::<u32>()), prop::option::of(any::<u8>())),
                0..3,
            ),
            prop::option::weighted(0.2, (1u8..8, any::<bool>())),
            prop::option::weighted(0.3, network_name),
        ),
        (
            prop::option::weighted(0.4, any::<bool>()),
            prop::option::weighted(0.3, any::<bool>()),
            prop::option::weighted(0.3, 1u64..=180),
            prop::option::weighted(0.3, any::<Index>()),
            prop::bool::weighted(0.15),
        ),
        (
            prop::option::weighted(0.15, (any::<u8>(), any::<bool>())),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.97),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.1),
        ),
        (prop::option::weighted(0.7, 0u8..4), any::<u128>()),
    )
        .prop_map(|(top, addr, extra, knobs, misc, (attachments, free))| {
            let (version, unsupported_version, name, whereabouts_type, top_level_range) = top;
            let (gateway, requested, statics) = addr;
            let (routes, dns, network_name) = extra;
            let (overlapping, strategy, timeout, log_level, log_file) = knobs;
            let (node_slice, cron, kubeconfig, api_root, legacy_keys) = misc;
            OptionsSeed {
                version,
                unsupported_version,
                name,
                whereabouts_type,
                top_level_range,
                gateway,
                requested,
                statics,
                routes,
                dns,
                network_name,
                overlapping,
                strategy,
                timeout,
                log_level,
                log_file,
                node_slice,
                cron,
                kubeconfig,
                api_root,
                legacy_keys,
                attachments,
                free,
            }
        })
}

/// The raw draws for one config: 0 to 3 ranges (0 only with static addresses) and the other keys.
#[derive(Debug, Clone)]
pub struct NetconfSeed {
    ranges: Vec<RangeSeed>,
    options: OptionsSeed,
}

pub fn netconf_seed() -> impl Strategy<Value = NetconfSeed> {
    let count = prop_oneof![1 => Just(0usize), 12 => Just(1usize), 5 => Just(2usize), 2 => Just(3usize)];
    (count.prop_flat_map(|n| prop::collection::vec(range_seed(), n)), options_seed())
        .prop_map(|(ranges, options)| NetconfSeed { ranges, options })
}

/// One range as written in the config, and as the plugin reads it.
#[derive(Debug, Clone)]
struct RangeSpec {
    range: String,
    start: Option<String>,
    end: Option<String>,
    exclude: Vec<String>,
    parsed: IpRange,
}

/// A config built from a seed, with what the CNI_ARGS generator needs to know about it.
#[derive(Debug, Clone)]
pub struct Netconf {
    pub value: Value,
    /// Whether it is valid by construction (false for an unsupported `cniVersion`, no kubeconfig, or a draw that
    /// could not be made consistent).
    pub valid: bool,
    /// The address in `runtimeConfig.ips`, if any.
    pub requested: Option<IpAddr>,
    /// A usable address of some range, for a CNI_ARGS `IP=` of its own.
    pub free: Option<IpAddr>,
    /// A gateway inside the first static address, for a CNI_ARGS `GATEWAY=`.
    pub static_gateway: Option<IpAddr>,
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_u128(v6: bool, n: u128) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(n))
    } else {
        // every v4 value here is below 2^32 by construction
        IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX)))
    }
}

/// The range in slot `slot` (0..32): a /20..=/30 of 198.18.0.0/15 or a /48..=/126 of 2001:db8::/32.
fn build_range(slot: u128, s: &RangeSeed) -> RangeSpec {
    const V6_PREFIXES: [u8; 9] = [48, 56, 64, 64, 96, 112, 120, 124, 126];
    let (max, slot_prefix, base, prefix) = if s.v6 {
        let base = (0x2001_0db8_u128 << 96) | (slot << 80);
        (128u8, 48u8, base, V6_PREFIXES[usize::from(s.prefix) % V6_PREFIXES.len()])
    } else {
        (32u8, 20u8, u128::from(u32::from(Ipv4Addr::new(198, 18, 0, 0))) + (slot << 12), 20 + s.prefix % 11)
    };
    let host_bits = u32::from(max - prefix);
    let size = 1u128 << host_bits;
    let nets = 1u128 << (prefix - slot_prefix);
    let net = base + ((s.net % nets) << host_bits);
    let at = |n: u128| from_u128(s.v6, net + n % size);
    let mut start = None;
    let mut end = None;
    let range = match s.form {
        0 => format!("{}/{prefix}", at(0)),
        1 => format!("{}/{prefix}", at(s.a)),
        2 => {
            let (a, b) = (s.a % size, s.b % size);
            format!("{}-{}/{prefix}", at(a.min(b)), at(a.max(b)))
        }
        _ => {
            let bounds = (s.start.map(|n| n % size), s.end.map(|n| n % size));
            let (lo, hi) = match bounds {
                (Some(a), Some(b)) => (Some(a.min(b)), Some(a.max(b))),
                other => other,
            };
            start = lo.map(|n| at(n).to_string());
            end = hi.map(|n| at(n).to_string());
            format!("{}/{prefix}", at(0))
        }
    };
    let exclude = s
        .excludes
        .iter()
        .map(|&(kind, pos, plen)| match kind {
            0 => at(pos).to_string(),
            1 => {
                // at most 2^7 addresses and half the range, so that excludes seldom empty it (a few still do)
                let q = max - (plen % 8).min(max - prefix - 1);
                let mask = !((1u128 << u32::from(max - q)) - 1);
                format!("{}/{q}", from_u128(s.v6, net + ((pos % size) & mask)))
            }
            _ => format!("{}/{max}", at(pos)),
        })
        .collect::<Vec<_>>();
    let parsed = IpRange::parse(&range, start.as_deref(), end.as_deref(), &exclude)
        .unwrap_or_else(|e| panic!("generator bug: {range} {start:?} {end:?} {exclude:?}: {e}"));
    RangeSpec { range, start, end, exclude, parsed }
}

fn range_object(r: &RangeSpec) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("range".into(), json!(r.range));
    if let Some(s) = &r.start {
        m.insert("range_start".into(), json!(s));
    }
    if let Some(e) = &r.end {
        m.insert("range_end".into(), json!(e));
    }
    if !r.exclude.is_empty() {
        m.insert("exclude".into(), json!(r.exclude));
    }
    m
}

/// A usable address of `r` (after the gateway is excluded) that a pool can record (offset at most
/// `MAX_OFFSET`), picked by `pick`.
fn usable(r: &IpRange, pick: u128) -> Option<IpAddr> {
    let n = usable_up_to_max(r);
    (n > 0).then(|| r.addr_at(r.nth_usable(pick % n).expect("below usable_count")))
}

const ROUTE_DESTINATIONS: &[(&str, Option<&str>)] = &[
    ("0.0.0.0/0", Some("198.18.0.1")),
    ("192.0.2.0/24", None),
    ("10.96.0.0/12", Some("198.18.0.254")),
    ("::/0", Some("2001:db8::1")),
    ("2001:db8:ffff::/48", None),
];
const LOG_LEVELS: &[&str] = &["debug", "verbose", "info", "error", "panic", "DEBUG", "Info"];
const LEGACY: &[(&str, &str)] =
    &[("datastore", "kubernetes"), ("etcd_host", "127.0.0.1:2379"), ("sleep_for_race", "0")];

impl Netconf {
    /// The config `seed` describes.
    pub fn build(seed: &NetconfSeed) -> Self {
        let o = &seed.options;
        let mut ranges: Vec<RangeSpec> =
            seed.ranges.iter().enumerate().map(|(i, s)| build_range(i as u128 * 7 + 3, s)).collect();
        let mut ipam = Map::new();
        ipam.insert("type".into(), json!(if o.whereabouts_type { "whereabouts" } else { "hereabouts" }));
        put_ranges(&mut ipam, &ranges, o.top_level_range);
        put_gateway(&mut ipam, &mut ranges, o.gateway);
        // a config without ranges needs static addresses
        let statics = o.statics.or(ranges.is_empty().then_some((1, true)));
        let static_gateway = put_statics(&mut ipam, statics);
        put_routes_and_dns(&mut ipam, o);
        put_knobs(&mut ipam, o, &ranges);

        let mut top = Map::new();
        let requested = put_requested(&mut top, &ranges, o.requested);
        let free = ranges.iter().find_map(|r| usable(&r.parsed, o.free)).filter(|ip| Some(*ip) != requested);
        let version = if o.unsupported_version {
            UNSUPPORTED_VERSIONS[o.version.index(UNSUPPORTED_VERSIONS.len())]
        } else {
            SUPPORTED_CNI_VERSIONS[o.version.index(SUPPORTED_CNI_VERSIONS.len())]
        };
        top.insert("cniVersion".into(), json!(version));
        top.insert("name".into(), json!(o.name));
        top.insert("type".into(), json!("macvlan"));
        top.insert("master".into(), json!("eth0"));
        top.insert("ipam".into(), Value::Object(ipam));
        if let Some(n) = o.attachments {
            let list: Vec<Value> =
                (0..n).map(|k| json!({"containerID": format!("sandbox-{k}"), "ifname": "eth0"})).collect();
            top.insert("cni.dev/valid-attachments".into(), Value::Array(list));
        }
        // a range that has usable addresses but none a pool can record (all 2^63 or more above its network
        // address) is refused by the loader
        let unrecordable = ranges.iter().any(|r| r.parsed.usable_count() > 0 && usable_up_to_max(&r.parsed) == 0);
        let valid = !o.unsupported_version && o.kubeconfig && !unrecordable;
        Netconf { value: Value::Object(top), valid, requested, free, static_gateway }
    }
}

/// The first range as the top-level `range` keys or as the first `ipRanges` entry, the others in `ipRanges`.
fn put_ranges(ipam: &mut Map<String, Value>, ranges: &[RangeSpec], top_level: bool) {
    let mut ip_ranges = Vec::new();
    for (i, r) in ranges.iter().enumerate() {
        if i == 0 && top_level {
            ipam.extend(range_object(r));
        } else {
            ip_ranges.push(Value::Object(range_object(r)));
        }
    }
    if !ip_ranges.is_empty() {
        ipam.insert("ipRanges".into(), Value::Array(ip_ranges));
    }
}

/// A gateway anywhere in the CIDR of one of the ranges, excluded from each range that contains it (as the
/// loader does), so that a requested address is never the gateway.
fn put_gateway(ipam: &mut Map<String, Value>, ranges: &mut [RangeSpec], draw: Option<(Index, u128)>) {
    let Some((i, pick)) = draw.filter(|_| !ranges.is_empty()) else { return };
    let cidr = ranges[i.index(ranges.len())].parsed.cidr();
    let size = 1u128 << u32::from(cidr.max_prefix_len() - cidr.prefix_len());
    let gw = from_u128(cidr.addr().is_ipv6(), to_u128(cidr.network()) + pick % size);
    ipam.insert("gateway".into(), json!(gw.to_string()));
    for r in ranges.iter_mut().filter(|r| r.parsed.cidr().contains(&gw)) {
        r.parsed.exclude_addr(gw);
    }
}

/// Static addresses outside every range (192.0.2.0/24, fd00:0:0:1::/64); returns a CNI_ARGS `GATEWAY=` that lies
/// in the first.
fn put_statics(ipam: &mut Map<String, Value>, draw: Option<(u8, bool)>) -> Option<IpAddr> {
    let (n, with_gw) = draw?;
    let list: Vec<Value> = (0..n)
        .map(|k| {
            let (addr, gw) =
                if k == 0 { ("192.0.2.10/24", "192.0.2.1") } else { ("fd00:0:0:1::10/64", "fd00:0:0:1::1") };
            if with_gw { json!({"address": addr, "gateway": gw}) } else { json!({"address": addr}) }
        })
        .collect();
    ipam.insert("addresses".into(), Value::Array(list));
    Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 254)))
}

/// `runtimeConfig.ips`: one usable address of one range, bare or with its range's or a host prefix, maybe twice.
fn put_requested(
    top: &mut Map<String, Value>,
    ranges: &[RangeSpec],
    draw: Option<(Index, u128, u8)>,
) -> Option<IpAddr> {
    let (i, pick, style) = draw.filter(|_| !ranges.is_empty())?;
    let r = &ranges[i.index(ranges.len())].parsed;
    let ip = usable(r, pick)?;
    let host = if ip.is_ipv4() { 32 } else { 128 };
    let written = match style {
        0 | 1 => ip.to_string(),
        2 => format!("{ip}/{}", r.cidr().prefix_len()),
        _ => format!("{ip}/{host}"),
    };
    let ips = if style == 1 { json!([written, written]) } else { json!([written]) };
    top.insert("runtimeConfig".into(), json!({"ips": ips, "portMappings": []}));
    Some(ip)
}

fn put_routes_and_dns(ipam: &mut Map<String, Value>, o: &OptionsSeed) {
    let routes: Vec<Value> = o
        .routes
        .iter()
        .map(|(i, mtu, scope)| {
            let (dst, gw) = ROUTE_DESTINATIONS[i.index(ROUTE_DESTINATIONS.len())];
            let mut m = json!({"dst": dst});
            if let Some(gw) = gw {
                m["gw"] = json!(gw);
            }
            if let Some(mtu) = mtu {
                m["mtu"] = json!(mtu);
            }
            if let Some(scope) = scope {
                m["scope"] = json!(scope);
            }
            m
        })
        .collect();
    if !routes.is_empty() {
        ipam.insert("routes".into(), Value::Array(routes));
    }
    if let Some((mask, domain)) = o.dns {
        let servers: Vec<&str> = ["198.18.0.53", "2001:db8::53", "fe80::1%eth0"]
            .into_iter()
            .enumerate()
            .filter(|(k, _)| mask & (1 << k) != 0)
            .map(|(_, s)| s)
            .collect();
        let mut dns = json!({"nameservers": servers, "search": ["svc.cluster.local"], "options": ["ndots:5"]});
        if domain {
            dns["domain"] = json!("cluster.local");
        }
        ipam.insert("dns".into(), dns);
    }
}

/// The other keys: names, switches, limits, logging, the node slice, the kubeconfig, legacy keys.
fn put_knobs(ipam: &mut Map<String, Value>, o: &OptionsSeed, ranges: &[RangeSpec]) {
    if let Some(n) = &o.network_name {
        ipam.insert("network_name".into(), json!(n));
    }
    if let Some(b) = o.overlapping {
        ipam.insert("enable_overlapping_ranges".into(), json!(b));
    }
    if let Some(random) = o.strategy {
        ipam.insert("allocation_strategy".into(), json!(if random { "random" } else { "lowest" }));
    }
    if let Some(t) = o.timeout {
        ipam.insert("timeout_seconds".into(), json!(t));
    }
    if let Some(i) = o.log_level {
        ipam.insert("log_level".into(), json!(LOG_LEVELS[i.index(LOG_LEVELS.len())]));
    }
    if o.log_file {
        // never opened: the test connector's init_logging does nothing
        ipam.insert("log_file".into(), json!("/var/log/hereabouts-parse-fuzz.log"));
    }
    // slice mode slices one range, into at most 8,192 slices (2^13): a prefix from the range's to 13 bits longer
    let one = match ranges {
        [r] => Some(r.parsed.cidr()),
        _ => None,
    };
    let lo = one.map(|c| c.prefix_len());
    let hi = one.map(|c| c.max_prefix_len().min(c.prefix_len() + 13));
    if let (Some((pick, slash)), Some(lo), Some(hi)) = (o.node_slice, lo, hi)
        && lo <= hi
    {
        let p = lo + pick % (hi - lo + 1);
        ipam.insert("node_slice_size".into(), json!(if slash { format!("/{p}") } else { p.to_string() }));
    }
    if o.cron {
        ipam.insert("reconciler_cron_expression".into(), json!("30 4 * * *"));
    }
    if o.kubeconfig || o.api_root {
        let mut k = Map::new();
        if o.kubeconfig {
            k.insert("kubeconfig".into(), json!(KUBECONFIG));
        }
        if o.api_root {
            k.insert("k8s_api_root".into(), json!("https://10.96.0.1:443"));
        }
        ipam.insert("kubernetes".into(), Value::Object(k));
    }
    if o.legacy_keys {
        for (k, v) in LEGACY {
            ipam.insert((*k).into(), json!(v));
        }
    }
}
