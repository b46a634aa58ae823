//! `range` (+ `range_start`, `range_end`, `exclude`) and `ipRanges[]` -> [`IpRange`]s, and the checks that need
//! them: the gateway, static addresses, `node_slice_size`.
//!
//! Whereabouts (`config.LoadIPAMConfig`) puts `range` first and then `ipRanges` in order; the top-level
//! `range_start`/`range_end`/`exclude` narrow `range` only. It drops a start outside the range and an unparsable
//! bound without a word; here the same mistakes are refused, naming the key, before [`IpRange::parse`] does the
//! range math.

use std::net::IpAddr;

use ipnet::IpNet;

use super::StaticAddress;
use super::error::ConfigError;
use super::field::{Origin, Sourced};
use super::netconf::{RawIpam, cidr, family, ip, net_v4, same_family};
use crate::range::{Hosts, IpRange};

/// One range entry with the keys of its parts.
struct Spec<'s> {
    /// `ipam.range` or `ipam.ipRanges[N]`: where [`IpRange::parse`]'s own refusals are reported.
    key: String,
    range: &'s str,
    range_key: String,
    start: Option<(&'s str, String)>,
    end: Option<(&'s str, String)>,
    exclude: &'s [String],
    exclude_key: String,
    /// `enable_l3`: the network and broadcast addresses are hosts too.
    hosts: Hosts,
}

pub(super) fn build(raw: &RawIpam<'_>) -> Result<Vec<IpRange>, ConfigError> {
    check_unanchored(raw)?;
    let mut built: Vec<(String, IpRange)> = Vec::new();
    let large = raw.large_offsets.as_ref().is_some_and(|f| f.value);
    for spec in specs(raw) {
        let spec = spec?;
        let range = one(&spec)?;
        let range = if large { range.with_large_offsets() } else { range };
        if range.usable_count() > 0 && crate::allocator::usable_up_to_max(&range) == 0 {
            return Err(ConfigError::invalid(
                &spec.key,
                format!(
                    "every usable address of {} is 2^63 or more above its network address: Whereabouts v0.9 reads \
                     pool offsets as signed 64-bit numbers and drops what it cannot read, so none is handed out; \
                     move range_start down or narrow the range, or, with no Whereabouts v0.9 in the fleet, set \
                     large_offsets",
                    range.cidr()
                ),
            ));
        }
        // one pool per CIDR holds one address per attachment: a second range of it would hand out that same one
        if let Some((first, _)) = built.iter().find(|(_, r)| r.cidr() == range.cidr()) {
            return Err(ConfigError::invalid(
                &spec.key,
                format!("{} is the CIDR of {first} too: both would share one pool; merge them", range.cidr()),
            ));
        }
        built.push((spec.key.clone(), range));
    }
    Ok(built.into_iter().map(|(_, range)| range).collect())
}

/// DEL and GC: every range whose CIDR can be read, with each mistake as a warning. An entry the strict rules refuse
/// is taken as its whole CIDR, which is all a release needs: the pool name and the offset of an address.
pub(super) fn build_for_release(raw: &RawIpam<'_>, warnings: &mut Vec<String>) -> Vec<IpRange> {
    if let Err(e) = check_unanchored(raw) {
        warnings.push(e.to_string());
    }
    let mut out = Vec::new();
    for spec in specs(raw) {
        let spec = match spec {
            Ok(spec) => spec,
            Err(e) => {
                warnings.push(format!("{e}; the entry is skipped"));
                continue;
            }
        };
        let refusal = match one(&spec) {
            Ok(range) => {
                out.push(range);
                continue;
            }
            Err(e) => e,
        };
        match whole_cidr(spec.range) {
            Some(range) => {
                warnings.push(format!("{refusal}; taken as the whole {}", range.cidr()));
                out.push(range);
            }
            None => warnings.push(format!("{refusal}; the entry is skipped (its CIDR cannot be read)")),
        }
    }
    out
}

/// The whole CIDR of `range` without its bounds and excludes: that of `B/len` in `A-B/len`, which
/// [`IpRange::parse`] also splits at the first `-`; a /31 or /32 with every address a host (a release only needs
/// the pool's name and offsets).
fn whole_cidr(range: &str) -> Option<IpRange> {
    let cidr = range.split_once('-').map_or(range, |(_, cidr)| cidr);
    IpRange::parse(cidr, None, None, &[]).or_else(|_| IpRange::parse_as(cidr, None, None, &[], Hosts::All)).ok()
}

/// The top-level `range_start`, `range_end` and `exclude` narrow `range` only.
fn check_unanchored(raw: &RawIpam<'_>) -> Result<(), ConfigError> {
    if raw.range.is_some() {
        return Ok(());
    }
    let start = raw.range_start.as_ref().map(|f| f.origin.key("range_start"));
    let end = raw.range_end.as_ref().map(|f| f.origin.key("range_end"));
    let exclude = raw.exclude.as_ref().map(|e| e.origin.key("exclude"));
    match start.or(end).or(exclude) {
        Some(key) => Err(ConfigError::invalid(
            key,
            "set without \"range\": it narrows \"range\" only (each ipRanges entry takes its own)",
        )),
        None => Ok(()),
    }
}

/// `range`, then the `ipRanges` entries in order (each followed by its `paired_range`, if any); an entry without
/// `range` is an error in its place.
fn specs<'s>(raw: &'s RawIpam<'_>) -> Vec<Result<Spec<'s>, ConfigError>> {
    let mut out = Vec::new();
    let hosts = if raw.enable_l3.as_ref().is_some_and(|f| f.value) { Hosts::All } else { Hosts::Inner };
    if let Some(range) = &raw.range {
        let (exclude, exclude_origin) = match &raw.exclude {
            Some(e) => (e.value.as_slice(), e.origin),
            None => (&[][..], Origin::Inline),
        };
        out.push(Ok(Spec {
            key: range.origin.key("range"),
            range: &range.value,
            range_key: range.origin.key("range"),
            start: raw.range_start.as_ref().map(|f| (f.value.as_str(), f.origin.key("range_start"))),
            end: raw.range_end.as_ref().map(|f| (f.value.as_str(), f.origin.key("range_end"))),
            exclude,
            exclude_key: exclude_origin.key("exclude"),
            hosts,
        }));
    }
    if let Some(list) = &raw.ip_ranges {
        for entry in &list.value {
            let base = format!("ipRanges[{}]", entry.index);
            let sub = |name: &str| list.origin.key(&format!("{base}.{name}"));
            out.push(match entry.range.as_deref() {
                None => Err(ConfigError::invalid(sub("range"), "missing")),
                Some(range) => Ok(Spec {
                    key: list.origin.key(&base),
                    range,
                    range_key: sub("range"),
                    start: entry.range_start.as_deref().map(|s| (s, sub("range_start"))),
                    end: entry.range_end.as_deref().map(|s| (s, sub("range_end"))),
                    exclude: &entry.exclude,
                    exclude_key: sub("exclude"),
                    hosts,
                }),
            });
            // IaaS provider mode: the paired IPv6 range is a range of its own (its pool), right after its IPv4 one
            if let Some(paired) = entry.paired_range.as_deref() {
                out.push(Ok(Spec {
                    key: sub("paired_range"),
                    range: paired,
                    range_key: sub("paired_range"),
                    start: None,
                    end: None,
                    exclude: &[],
                    exclude_key: sub("paired_range"),
                    hosts,
                }));
            }
        }
    }
    out
}

fn one(spec: &Spec<'_>) -> Result<IpRange, ConfigError> {
    let (net, implied) = cidr_of(spec.range, &spec.range_key)?;
    let start = bound(spec, spec.start.as_ref(), implied.map(|(a, _)| a), net)?;
    let end = bound(spec, spec.end.as_ref(), implied.map(|(_, b)| b), net)?;
    if let (Some((s, s_key)), Some((e, e_key))) = (&start, &end)
        && e < s
    {
        return Err(ConfigError::invalid(e_key, format!("{e} is before the start {s} ({s_key})")));
    }
    for (i, e) in spec.exclude.iter().enumerate() {
        let key = format!("{}[{i}]", spec.exclude_key);
        let ex = e
            .parse::<IpNet>()
            .or_else(|_| e.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| ConfigError::invalid(&key, format!("{e:?} is not a CIDR or an IP address")))?;
        if net_v4(ex) != net_v4(net) {
            return Err(ConfigError::invalid(
                &key,
                format!("{e} is {} but the range {net} is {}", family(net_v4(ex)), family(net_v4(net))),
            ));
        }
        if !ex.trunc().contains(&net.network()) && !net.contains(&ex.network()) {
            return Err(ConfigError::invalid(
                &key,
                format!("{e} does not overlap the range {net}: it excludes nothing"),
            ));
        }
    }
    let start_s = spec.start.as_ref().map(|(s, _)| *s);
    let end_s = spec.end.as_ref().map(|(s, _)| *s);
    IpRange::parse_as(spec.range, start_s, end_s, spec.exclude, spec.hosts)
        .map_err(|source| ConfigError::Range { key: spec.key.clone(), source })
}

/// The CIDR of `range` (host bits cleared, as Whereabouts does) and, for `first-last/prefix`, the bounds it gives.
fn cidr_of(range: &str, key: &str) -> Result<(IpNet, Option<(IpAddr, IpAddr)>), ConfigError> {
    let Some((a, b)) = range.split_once('-') else { return Ok((cidr(range, key)?.trunc(), None)) };
    let first: IpAddr = a.parse().map_err(|_| {
        ConfigError::invalid(
            key,
            format!("{range:?}: {a:?} is not an IP address (expected a CIDR or first-last/prefix)"),
        )
    })?;
    let last: IpNet = b
        .parse()
        .map_err(|_| ConfigError::invalid(key, format!("{range:?}: {b:?} is not the last address with its prefix")))?;
    let net = last.trunc();
    same_family(first, net, key, "the CIDR")?;
    if !net.contains(&first) {
        return Err(ConfigError::invalid(key, format!("{range:?}: the first address {first} is outside {net}")));
    }
    if first > last.addr() {
        return Err(ConfigError::invalid(key, format!("{range:?}: the first address is after the last")));
    }
    Ok((net, Some((first, last.addr()))))
}

/// An explicit `range_start`/`range_end`, checked against the CIDR and against the bound `first-last/prefix` gives.
fn bound(
    spec: &Spec<'_>,
    explicit: Option<&(&str, String)>,
    implied: Option<IpAddr>,
    net: IpNet,
) -> Result<Option<(IpAddr, String)>, ConfigError> {
    let Some((s, key)) = explicit else { return Ok(implied.map(|i| (i, spec.range_key.clone()))) };
    let addr = ip(s, key)?;
    same_family(addr, net, key, "the range")?;
    if !net.contains(&addr) {
        return Err(ConfigError::invalid(key, format!("{addr} is outside {net}")));
    }
    if let Some(i) = implied
        && i != addr
    {
        return Err(ConfigError::invalid(
            key,
            format!("{addr} conflicts with {i} given by {} {:?}", spec.range_key, spec.range),
        ));
    }
    Ok(Some((addr, key.clone())))
}

/// The CIDRs of `ranges`, for messages.
pub(super) fn cidr_list(ranges: &[IpRange]) -> String {
    ranges.iter().map(|r| r.cidr().to_string()).collect::<Vec<_>>().join(", ")
}

/// The gateway is never handed out: excluded from every range that contains it. A gateway inside no range is a
/// mistake (Whereabouts would return it with addresses it cannot reach).
pub(super) fn apply_gateway(ranges: &mut [IpRange], gw: &Sourced<'_, IpAddr>) -> Result<(), ConfigError> {
    let key = gw.origin.key("gateway");
    if ranges.is_empty() {
        return Err(ConfigError::invalid(
            key,
            "there is no range for it to be the gateway of (with addresses only, set addresses[].gateway)",
        ));
    }
    let mut found = false;
    for r in ranges.iter_mut().filter(|r| r.cidr().contains(&gw.value)) {
        r.exclude_addr(gw.value);
        found = true;
    }
    if found {
        Ok(())
    } else {
        Err(ConfigError::invalid(key, format!("{} is inside none of the ranges ({})", gw.value, cidr_list(ranges))))
    }
}

/// A static address that a range could also hand out would be given to two pods.
pub(super) fn check_static(addresses: &Sourced<'_, Vec<StaticAddress>>, ranges: &[IpRange]) -> Result<(), ConfigError> {
    for (i, a) in addresses.value.iter().enumerate() {
        let ip = a.address.addr();
        if let Some(r) = ranges.iter().find(|r| r.offset_of(ip).is_some_and(|o| r.is_usable(o))) {
            return Err(ConfigError::invalid(
                addresses.origin.key(&format!("addresses[{i}].address")),
                format!("{ip} can also be handed out from the range {}: add it to that range's exclude", r.cidr()),
            ));
        }
    }
    Ok(())
}

/// `node_slice_size` must cut the range into slices: a prefix between the range's and the address length, and
/// no more slices than one NodeSlicePool lists. One range only: a network's NodeSlicePool slices one range (as
/// Whereabouts' controller slices `ipRanges[0]`).
pub(super) fn check_node_slice(
    ranges: &[IpRange],
    size: &Sourced<'_, crate::cut::SliceSize>,
) -> Result<crate::cut::SliceSize, ConfigError> {
    let key = size.origin.key("node_slice_size");
    match ranges {
        [] => Err(ConfigError::invalid(key, "there is no range to slice")),
        [r] => match crate::cut::divide(r.cidr(), size.value.prefix()) {
            Ok(_) => Ok(size.value.clone()),
            Err(e) => Err(ConfigError::invalid(key, e.to_string())),
        },
        _ => Err(ConfigError::invalid(
            key,
            format!("slices one range, and this config has {}: give each range a network of its own", ranges.len()),
        )),
    }
}

/// `min_node_slice_size` (adaptive slices) must be no larger than `node_slice_size` (`size`, checked) and cut the
/// range into no more slices than one NodeSlicePool lists: at worst every slice is that small.
pub(super) fn check_min_slice(
    ranges: &[IpRange],
    size: &crate::cut::SliceSize,
    min: &Sourced<'_, crate::cut::SliceSize>,
) -> Result<crate::cut::SliceSize, ConfigError> {
    let key = min.origin.key("min_node_slice_size");
    if min.value.prefix() < size.prefix() {
        return Err(ConfigError::invalid(
            key,
            format!(
                "{} is larger than node_slice_size {}: the smallest slice must not be larger than the largest",
                min.value, size
            ),
        ));
    }
    match ranges {
        [r] => crate::cut::divide(r.cidr(), min.value.prefix())
            .map(|_| min.value.clone())
            .map_err(|e| ConfigError::invalid(key, e.to_string())),
        _ => Err(ConfigError::invalid(key, "needs node_slice_size, which slices one range")),
    }
}

/// The routing-table datastore's `exclude_first` and `exclude_last` must leave every range an address to hand out.
pub(super) fn check_exclude_counts(ranges: &[IpRange], first: u64, last: u64) -> Result<(), ConfigError> {
    for r in ranges {
        let usable = r.usable_count();
        if u128::from(first) + u128::from(last) >= usable {
            return Err(ConfigError::invalid(
                "ipam.exclude_first",
                format!(
                    "exclude_first {first} and exclude_last {last} leave no address of range {} ({usable} usable)",
                    r.cidr()
                ),
            ));
        }
    }
    Ok(())
}
