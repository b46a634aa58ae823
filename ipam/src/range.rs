//! IP ranges and offset <-> address math on u128, for IPv4 and IPv6.
//!
//! Everything is an offset from the network address, because that is what a pool stores (docs/design.md, "The store protocol") and because
//! u128 arithmetic covers the widest IPv6 range without iterating over addresses. The usable set is kept as the
//! usable bounds plus a sorted list of merged excluded intervals, so its size is the number of `exclude` entries,
//! never the number of addresses.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::RangeInclusive;

use ipnet::IpNet;

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The family of `net`.
    pub fn of_net(net: IpNet) -> Self {
        Self::of(net.addr())
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        })
    }
}

/// Which addresses of a CIDR are hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hosts {
    /// Every address but the network and broadcast addresses (Whereabouts' default).
    #[default]
    Inner,
    /// Every address (`enable_l3`: routed, point-to-point and /32 networks, where neither is special).
    All,
}

/// The configuration key a value came from, so that an error names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RangeKey {
    /// `range`.
    Range,
    /// `range_start`.
    RangeStart,
    /// `range_end`.
    RangeEnd,
    /// An entry of `exclude`.
    Exclude,
}

impl fmt::Display for RangeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RangeKey::Range => "range",
            RangeKey::RangeStart => "range_start",
            RangeKey::RangeEnd => "range_end",
            RangeKey::Exclude => "exclude",
        })
    }
}

/// Why a range is refused. Each message names the offending value and, where it is known, the key it came from;
/// the config module adds which range of the config this was.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RangeError {
    /// `range` is neither a CIDR nor `A-B/len`.
    #[error(
        "range {value:?} is neither a cidr (like 10.0.0.0/24) nor a first-last/len range (like 10.0.0.10-10.0.0.20/24)"
    )]
    BadRange {
        /// The `range` value.
        value: String,
    },
    /// The range is /31, /32, /127 or /128: nothing is left between the network and the broadcast address.
    #[error("range {cidr} is too small: a /{prefix} has no usable address besides its network and broadcast address")]
    TooSmall {
        /// The normalised CIDR.
        cidr: IpNet,
        /// Its prefix length.
        prefix: u8,
    },
    /// An IPv6 range inside `::ffff:0:0/96`, which Whereabouts (Go's `net.IP`) silently treats as IPv4.
    #[error("range {cidr} is an ipv4-mapped ipv6 network; write it as an ipv4 range")]
    Ipv4Mapped {
        /// The normalised CIDR.
        cidr: IpNet,
    },
    /// The first address of an `A-B/len` range is of another family than the CIDR.
    #[error("range {range:?} mixes ipv4 and ipv6")]
    MixedFamily {
        /// The `range` value.
        range: String,
    },
    /// The first address of an `A-B/len` range lies outside the CIDR given by `B/len`.
    #[error("range {range:?}: first address {first} lies outside {cidr}")]
    FirstOutside {
        /// The `range` value.
        range: String,
        /// The first address `A`.
        first: IpAddr,
        /// The CIDR of `B/len`.
        cidr: IpNet,
    },
    /// The last address of an `A-B/len` range is before the first.
    #[error("range {range:?}: last address {last} is before first address {first}")]
    LastBeforeFirst {
        /// The `range` value.
        range: String,
        /// `A`.
        first: IpAddr,
        /// `B`.
        last: IpAddr,
    },
    /// `range_start` or `range_end` is not an IP address.
    #[error("{key} {value:?} is not an ip address")]
    BadAddress {
        /// `range_start` or `range_end`.
        key: RangeKey,
        /// The value.
        value: String,
    },
    /// An `exclude` entry is neither a CIDR nor an IP address.
    #[error("exclude {value:?} is neither a cidr nor an ip address")]
    BadExclude {
        /// The entry.
        value: String,
    },
    /// A value is of the other address family than the range.
    #[error("{key} {value} is {found}, but range {cidr} is {expected}")]
    WrongFamily {
        /// Where the value came from.
        key: RangeKey,
        /// The value as written.
        value: String,
        /// Its family.
        found: Family,
        /// The range.
        cidr: IpNet,
        /// The range's family.
        expected: Family,
    },
    /// `range_start` or `range_end` lies outside the CIDR.
    #[error("{key} {value} lies outside range {cidr}")]
    Outside {
        /// `range_start` or `range_end`.
        key: RangeKey,
        /// The value.
        value: IpAddr,
        /// The range.
        cidr: IpNet,
    },
    /// `range_end` is before `range_start`.
    #[error("range_end {end} is before range_start {start}")]
    EndBeforeStart {
        /// `range_start`.
        start: IpAddr,
        /// `range_end`.
        end: IpAddr,
    },
    /// `range_start` or `range_end` is set next to an `A-B/len` range that says otherwise. Whereabouts silently
    /// lets the range win; we refuse, because one of the two is a mistake.
    #[error("{key} {value} contradicts range {range:?}, which sets it to {implied}")]
    Conflict {
        /// `range_start` or `range_end`.
        key: RangeKey,
        /// The key's value.
        value: IpAddr,
        /// The `range` value.
        range: String,
        /// The bound the range gives.
        implied: IpAddr,
    },
}

/// A validated range: a normalised CIDR, the usable bounds within it and the excluded parts, all as offsets from
/// the network address.
///
/// Invariants: `1 <= first <= last <= broadcast - 1` (a [`IpRange::slice`] may also use its own network and
/// broadcast offsets: they are hosts of the whole range); `excludes` is sorted, merged (no two intervals overlap or
/// touch) and clipped to `first..=last`, so two ranges that hand out the same addresses compare equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpRange {
    cidr: IpNet,
    first: u128,
    last: u128,
    excludes: Vec<(u128, u128)>,
    /// The largest offset handed out ([`crate::allocator::MAX_OFFSET`] unless `large_offsets`).
    max_offset: u128,
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The offset of the broadcast address: all host bits set. Computed by shifting down from all-ones so that an
/// IPv6 /0 (128 host bits) does not overflow.
fn host_mask(cidr: IpNet) -> u128 {
    match cidr {
        IpNet::V4(n) => u128::from(u32::MAX.checked_shr(u32::from(n.prefix_len())).unwrap_or(0)),
        IpNet::V6(n) => u128::MAX.checked_shr(u32::from(n.prefix_len())).unwrap_or(0),
    }
}

/// Parses `addr/len` strictly: the address as std parses it (which, unlike ipnet's own parser, refuses IPv4
/// octets with leading zeros, ambiguous as they are between decimal and octal) and a plain decimal prefix.
fn parse_cidr(value: &str) -> Option<IpNet> {
    let (addr, len) = value.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) || (len.len() > 1 && len.starts_with('0')) {
        return None;
    }
    IpNet::new(addr, len.parse().ok()?).ok()
}

fn parse_ip(key: RangeKey, value: &str) -> Result<IpAddr, RangeError> {
    value.parse().map_err(|_| RangeError::BadAddress { key, value: value.to_string() })
}

/// Parses `range` into its normalised CIDR and, for `A-B/len`, the bounds `A` and `B`.
fn parse_range(range: &str) -> Result<(IpNet, Option<(IpAddr, IpAddr)>), RangeError> {
    let bad = || RangeError::BadRange { value: range.to_string() };
    // Like Whereabouts, split at the first '-': no address or prefix contains one, so `A-B/len` is unambiguous.
    match range.split_once('-') {
        Some((a, b_len)) => {
            let first: IpAddr = a.parse().map_err(|_| bad())?;
            let net = parse_cidr(b_len).ok_or_else(bad)?;
            // The CIDR comes from `B/len` and `A` must lie in it, as in Whereabouts' config.go.
            let cidr = net.trunc();
            let last = net.addr();
            if Family::of(first) != Family::of_net(cidr) {
                return Err(RangeError::MixedFamily { range: range.to_string() });
            }
            if !cidr.contains(&first) {
                return Err(RangeError::FirstOutside { range: range.to_string(), first, cidr });
            }
            if to_u128(last) < to_u128(first) {
                return Err(RangeError::LastBeforeFirst { range: range.to_string(), first, last });
            }
            Ok((cidr, Some((first, last))))
        }
        None => {
            let net = parse_cidr(range).ok_or_else(bad)?;
            Ok((net.trunc(), None))
        }
    }
}

fn parse_exclude(value: &str) -> Result<IpNet, RangeError> {
    if let Some(net) = parse_cidr(value) {
        return Ok(net.trunc());
    }
    let ip: IpAddr = value.parse().map_err(|_| RangeError::BadExclude { value: value.to_string() })?;
    Ok(IpNet::from(ip))
}

impl IpRange {
    /// The largest offset this range hands out: [`crate::allocator::MAX_OFFSET`] (what Whereabouts v0.9 reads),
    /// or, with `large_offsets`, every offset of the range.
    pub fn max_offset(&self) -> u128 {
        self.max_offset
    }

    /// The same range, handing out offsets at or above 2^63 too (`large_offsets`: for fleets without Whereabouts
    /// v0.9 readers, which drop what they cannot read as a signed 64-bit number).
    pub fn with_large_offsets(mut self) -> Self {
        self.max_offset = u128::MAX;
        self
    }

    /// Parses `range` (a CIDR, or `A-B/len`), narrowed by `start`/`end` and `exclude` (CIDRs or bare IPs).
    ///
    /// A CIDR's host bits are dropped (`10.0.0.5/24` is `10.0.0.0/24`). In `A-B/len` the CIDR is that of `B/len`
    /// and `A` must lie in it; `start`/`end` may then only repeat `A`/`B`. A bound on the network or broadcast
    /// address is moved onto the nearest usable address, since `first-last/len` configs often spell out the whole
    /// CIDR; a bound outside the CIDR is refused. Excludes of the range's family that reach outside the CIDR are
    /// clipped to it (or have no effect); excludes of the other family are refused.
    pub fn parse(range: &str, start: Option<&str>, end: Option<&str>, exclude: &[String]) -> Result<Self, RangeError> {
        Self::parse_as(range, start, end, exclude, Hosts::Inner)
    }

    /// [`IpRange::parse`], with the network and broadcast addresses hosts too when `hosts` is [`Hosts::All`]
    /// (`enable_l3`): a /31 or /32 is a range then, and bounds are clamped into the whole CIDR.
    pub fn parse_as(
        range: &str,
        start: Option<&str>,
        end: Option<&str>,
        exclude: &[String],
        hosts: Hosts,
    ) -> Result<Self, RangeError> {
        let (cidr, implied) = parse_range(range)?;
        let prefix = cidr.prefix_len();
        if hosts == Hosts::Inner && cidr.max_prefix_len() - prefix < 2 {
            return Err(RangeError::TooSmall { cidr, prefix });
        }
        if let IpNet::V6(n) = cidr
            && prefix >= 96
            && n.network().to_ipv4_mapped().is_some()
        {
            return Err(RangeError::Ipv4Mapped { cidr });
        }
        let family = Family::of_net(cidr);
        let base = to_u128(cidr.network());
        let broadcast = host_mask(cidr);

        let bound = |key: RangeKey, value: &str| -> Result<IpAddr, RangeError> {
            let ip = parse_ip(key, value)?;
            if Family::of(ip) != family {
                return Err(RangeError::WrongFamily {
                    key,
                    value: value.to_string(),
                    found: Family::of(ip),
                    cidr,
                    expected: family,
                });
            }
            if !cidr.contains(&ip) {
                return Err(RangeError::Outside { key, value: ip, cidr });
            }
            Ok(ip)
        };
        let start = start.map(|s| bound(RangeKey::RangeStart, s)).transpose()?;
        let end = end.map(|e| bound(RangeKey::RangeEnd, e)).transpose()?;

        let (start, end) = match implied {
            Some((first, last)) => {
                for (key, given, implied) in [(RangeKey::RangeStart, start, first), (RangeKey::RangeEnd, end, last)] {
                    if let Some(value) = given
                        && value != implied
                    {
                        return Err(RangeError::Conflict { key, value, range: range.to_string(), implied });
                    }
                }
                (Some(first), Some(last))
            }
            None => {
                if let (Some(s), Some(e)) = (start, end)
                    && to_u128(e) < to_u128(s)
                {
                    return Err(RangeError::EndBeforeStart { start: s, end: e });
                }
                (start, end)
            }
        };
        // Clamping is monotonic, so start <= end survives it. The last offset stays below 2^128 - 1 (an IPv6 /0
        // with every address a host gives up one), so `last + 1` never overflows.
        let (lowest, highest) = match hosts {
            Hosts::Inner => (1, broadcast - 1),
            Hosts::All => (0, broadcast.min(u128::MAX - 1)),
        };
        let usable = |ip: IpAddr| (to_u128(ip) - base).clamp(lowest, highest);
        let first = start.map_or(lowest, usable);
        let last = end.map_or(highest, usable);

        let mut excludes = Vec::with_capacity(exclude.len());
        for value in exclude {
            let net = parse_exclude(value)?;
            if Family::of_net(net) != family {
                return Err(RangeError::WrongFamily {
                    key: RangeKey::Exclude,
                    value: value.clone(),
                    found: Family::of_net(net),
                    cidr,
                    expected: family,
                });
            }
            // Two prefixes are either disjoint or nested, so the intersection is one interval or nothing.
            let lo = to_u128(net.network()).max(base);
            let hi = to_u128(net.broadcast()).min(base + broadcast);
            if lo <= hi {
                excludes.push((lo - base, hi - base));
            }
        }
        let mut range = IpRange { cidr, first, last, excludes, max_offset: crate::allocator::MAX_OFFSET };
        range.normalise_excludes();
        Ok(range)
    }

    fn normalise_excludes(&mut self) {
        let (first, last) = (self.first, self.last);
        let mut clipped: Vec<(u128, u128)> =
            self.excludes.iter().map(|&(a, b)| (a.max(first), b.min(last))).filter(|&(a, b)| a <= b).collect();
        clipped.sort_unstable();
        let mut merged: Vec<(u128, u128)> = Vec::with_capacity(clipped.len());
        for (a, b) in clipped {
            match merged.last_mut() {
                // `end + 1` cannot overflow: every end is <= last < 2^128 - 1.
                Some(prev) if a <= prev.1 + 1 => prev.1 = prev.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.excludes = merged;
    }

    /// The normalised network (host bits zero).
    pub fn cidr(&self) -> IpNet {
        self.cidr
    }

    /// The address family of the range.
    pub fn family(&self) -> Family {
        Family::of_net(self.cidr)
    }

    /// The offset of the broadcast address, i.e. the largest offset inside the CIDR.
    pub fn broadcast_offset(&self) -> u128 {
        host_mask(self.cidr)
    }

    /// The offset of `ip` from the network address, if `ip` lies in the CIDR.
    pub fn offset_of(&self, ip: IpAddr) -> Option<u128> {
        if Family::of(ip) != self.family() || !self.cidr.contains(&ip) {
            return None;
        }
        Some(to_u128(ip) - to_u128(self.cidr.network()))
    }

    /// The address at `offset` from the network address, if `offset` lies inside the CIDR. Offsets read from a
    /// pool can be anything another writer put there, so callers handling stored offsets want this one.
    pub fn checked_addr_at(&self, offset: u128) -> Option<IpAddr> {
        if offset > host_mask(self.cidr) {
            return None;
        }
        let abs = to_u128(self.cidr.network()) + offset;
        Some(match self.cidr {
            // The CIDR is IPv4, so `abs` fits in 32 bits.
            IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(abs as u32)),
            IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(abs)),
        })
    }

    /// The address at `offset` from the network address. Panics if `offset` lies outside the CIDR.
    pub fn addr_at(&self, offset: u128) -> IpAddr {
        self.checked_addr_at(offset).unwrap_or_else(|| panic!("offset {offset} lies outside range {}", self.cidr))
    }

    /// Whether the address at `offset` may be handed out: inside the usable bounds and not excluded.
    pub fn is_usable(&self, offset: u128) -> bool {
        if offset < self.first || offset > self.last {
            return false;
        }
        let i = self.excludes.partition_point(|&(_, b)| b < offset);
        !(i < self.excludes.len() && self.excludes[i].0 <= offset)
    }

    /// How many addresses may be handed out.
    pub fn usable_count(&self) -> u128 {
        // At most 2^128 - 1 (last < 2^128 - 1), so this cannot overflow even for an IPv6 /0.
        let excluded: u128 = self.excludes.iter().map(|&(a, b)| b - a + 1).sum();
        self.last - self.first + 1 - excluded
    }

    /// Excludes one more address (the gateway); an address outside the CIDR is ignored.
    pub fn exclude_addr(&mut self, ip: IpAddr) {
        if let Some(offset) = self.offset_of(ip) {
            self.excludes.push((offset, offset));
            self.normalise_excludes();
        }
    }

    /// The usable bounds (`range_start`..=`range_end`, or network+1..=broadcast-1), before excludes.
    pub fn bounds(&self) -> RangeInclusive<u128> {
        self.first..=self.last
    }

    /// The excluded offsets within the bounds, as sorted, disjoint, non-adjacent inclusive intervals.
    pub fn excluded_intervals(&self) -> impl Iterator<Item = RangeInclusive<u128>> + '_ {
        self.excludes.iter().map(|&(a, b)| a..=b)
    }

    /// The usable offsets as sorted, disjoint, non-empty inclusive intervals: the bounds minus the excludes. There
    /// are at most one more of them than there are excluded intervals.
    pub fn usable_intervals(&self) -> impl Iterator<Item = RangeInclusive<u128>> + '_ {
        let mut cursor = Some(self.first);
        let mut excludes = self.excludes.iter();
        std::iter::from_fn(move || {
            loop {
                let from = cursor?;
                match excludes.next() {
                    Some(&(a, b)) => {
                        // `b + 1` cannot overflow (b <= last < 2^128 - 1); it may pass `last`, which ends the walk.
                        cursor = (b < self.last).then_some(b + 1);
                        if a > from {
                            return Some(from..=a - 1);
                        }
                    }
                    None => {
                        cursor = None;
                        return Some(from..=self.last);
                    }
                }
            }
        })
    }

    /// The part of this range that lies in `slice` (a node's slice), with offsets from the slice's own
    /// network address, as Whereabouts keeps a slice's pool. Every address this range may hand out inside the
    /// slice may be handed out from it, the slice's own network and broadcast addresses included (they are hosts
    /// of the range), so slices together fill the range. `None` when `slice` is not inside the CIDR, or nothing of
    /// it is usable.
    pub fn slice(&self, slice: IpNet) -> Option<IpRange> {
        let slice = slice.trunc();
        if Family::of_net(slice) != self.family() || slice.prefix_len() < self.cidr.prefix_len() {
            return None;
        }
        let base = to_u128(slice.network()).checked_sub(to_u128(self.cidr.network()))?;
        if base > host_mask(self.cidr) {
            return None;
        }
        if base == 0 && slice.prefix_len() == self.cidr.prefix_len() {
            return Some(self.clone());
        }
        let top = base + host_mask(slice);
        let (first, last) = (self.first.max(base), self.last.min(top));
        if first > last {
            return None;
        }
        let excludes = self
            .excludes
            .iter()
            .map(|&(a, b)| (a.max(first), b.min(last)))
            .filter(|&(a, b)| a <= b)
            .map(|(a, b)| (a - base, b - base))
            .collect();
        let sub =
            IpRange { cidr: slice, first: first - base, last: last - base, excludes, max_offset: self.max_offset };
        (sub.usable_count() > 0).then_some(sub)
    }

    /// The lowest usable offset, or `None` when excludes cover the whole bounds.
    pub fn first_usable(&self) -> Option<u128> {
        self.usable_intervals().next().map(|r| *r.start())
    }

    /// The highest usable offset, or `None` when excludes cover the whole bounds.
    pub fn last_usable(&self) -> Option<u128> {
        self.usable_intervals().last().map(|r| *r.end())
    }

    /// The `k`-th usable offset (from 0), or `None` when `k >= usable_count()`. Walks intervals, not addresses.
    pub fn nth_usable(&self, mut k: u128) -> Option<u128> {
        for r in self.usable_intervals() {
            let len = r.end() - r.start() + 1;
            if k < len {
                return Some(r.start() + k);
            }
            k -= len;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn with_every_address_a_host_the_network_and_broadcast_are_handed_out() {
        let all = |r: &str, s: Option<&str>, e: Option<&str>| IpRange::parse_as(r, s, e, &[], Hosts::All).unwrap();
        let usable = |r: &IpRange| (0..=r.broadcast_offset()).filter(|&o| r.is_usable(o)).collect::<Vec<_>>();
        assert_eq!(usable(&all("198.18.0.0/31", None, None)), [0, 1]);
        assert_eq!(usable(&all("198.18.0.7/32", None, None)), [0]);
        assert_eq!(all("198.18.0.7/32", None, None).addr_at(0), ip("198.18.0.7"));
        assert_eq!(usable(&all("198.18.0.0/30", None, None)), [0, 1, 2, 3]);
        assert_eq!(all("2001:db8::/127", None, None).usable_count(), 2);
        // bounds on the network or broadcast address stay there
        let bounded = all("198.18.0.0/29", Some("198.18.0.0"), Some("198.18.0.7"));
        assert_eq!((bounded.first_usable(), bounded.last_usable()), (Some(0), Some(7)));
        // an IPv6 /0 gives up its last address, so that no count overflows
        assert_eq!(all("::/0", None, None).usable_count(), u128::MAX);
        // without, a /31 and a /32 are no range
        for small in ["198.18.0.0/31", "198.18.0.7/32"] {
            assert!(matches!(IpRange::parse(small, None, None, &[]), Err(RangeError::TooSmall { .. })), "{small}");
        }
        assert_eq!(usable(&IpRange::parse("198.18.0.0/30", None, None, &[]).unwrap()), [1, 2]);
    }

    fn ex(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn plain(range: &str) -> IpRange {
        IpRange::parse(range, None, None, &[]).unwrap()
    }

    fn intervals(r: &IpRange) -> Vec<(u128, u128)> {
        r.usable_intervals().map(|i| (*i.start(), *i.end())).collect()
    }

    #[test]
    fn ipv4_cidr() {
        let r = plain("10.0.0.0/24");
        assert_eq!(r.cidr(), net("10.0.0.0/24"));
        assert_eq!(r.family(), Family::V4);
        assert_eq!(r.bounds(), 1..=254);
        assert_eq!(r.usable_count(), 254);
        assert_eq!(r.first_usable(), Some(1));
        assert_eq!(r.last_usable(), Some(254));
        assert_eq!(r.broadcast_offset(), 255);
        assert!(!r.is_usable(0));
        assert!(r.is_usable(1));
        assert!(r.is_usable(254));
        assert!(!r.is_usable(255));
        assert!(!r.is_usable(256));
        assert_eq!(r.offset_of(ip("10.0.0.7")), Some(7));
        assert_eq!(r.offset_of(ip("10.0.1.7")), None);
        assert_eq!(r.offset_of(ip("::7")), None);
        assert_eq!(r.addr_at(7), ip("10.0.0.7"));
        assert_eq!(r.addr_at(255), ip("10.0.0.255"));
        assert_eq!(r.checked_addr_at(256), None);
    }

    #[test]
    fn ipv6_cidr() {
        let r = plain("2001:db8::/64");
        assert_eq!(r.family(), Family::V6);
        assert_eq!(r.usable_count(), (1u128 << 64) - 2);
        assert_eq!(r.offset_of(ip("2001:db8::1:0")), Some(0x10000));
        assert_eq!(r.addr_at(0xffff_ffff_ffff_fffe), ip("2001:db8::ffff:ffff:ffff:fffe"));
        assert!(!r.is_usable(u128::from(u64::MAX)));
        assert_eq!(r.last_usable(), Some(u128::from(u64::MAX) - 1));
    }

    #[test]
    fn host_bits_are_normalised_away() {
        assert_eq!(plain("10.0.0.5/24").cidr(), net("10.0.0.0/24"));
        assert_eq!(plain("10.0.0.5/24"), plain("10.0.0.0/24"));
        assert_eq!(plain("2001:db8::5/64").cidr(), net("2001:db8::/64"));
    }

    #[test]
    fn first_last_len_form() {
        let r = IpRange::parse("192.168.2.225-192.168.2.230/24", None, None, &[]).unwrap();
        assert_eq!(r.cidr(), net("192.168.2.0/24"));
        assert_eq!(r.bounds(), 225..=230);
        assert_eq!(r.usable_count(), 6);
        assert!(!r.is_usable(224));
        assert!(!r.is_usable(231));
        // The same bounds repeated in range_start/range_end are fine.
        let same = IpRange::parse("192.168.2.225-192.168.2.230/24", Some("192.168.2.225"), Some("192.168.2.230"), &[])
            .unwrap();
        assert_eq!(same, r);
        let r6 = IpRange::parse("2001:db8::10-2001:db8::20/64", None, None, &[]).unwrap();
        assert_eq!(r6.cidr(), net("2001:db8::/64"));
        assert_eq!(r6.bounds(), 0x10..=0x20);
        // A single address.
        let one = IpRange::parse("10.0.0.9-10.0.0.9/24", None, None, &[]).unwrap();
        assert_eq!(one.usable_count(), 1);
    }

    #[test]
    fn bounds_on_network_or_broadcast_are_moved_onto_usable() {
        let r = IpRange::parse("2001:db8:5422:5::-2001:db8:5422:5:7fff:ffff:ffff:ffff/64", None, None, &[]).unwrap();
        assert_eq!(r.bounds(), 1..=0x7fff_ffff_ffff_ffff);
        let r = IpRange::parse("10.0.0.0-10.0.0.255/24", None, None, &[]).unwrap();
        assert_eq!(r.bounds(), 1..=254);
        let r = IpRange::parse("10.0.0.0/24", Some("10.0.0.0"), Some("10.0.0.255"), &[]).unwrap();
        assert_eq!(r.bounds(), 1..=254);
        // A start on the broadcast address becomes the last usable one; an end on the network the first.
        let r = IpRange::parse("10.0.0.0/24", Some("10.0.0.255"), None, &[]).unwrap();
        assert_eq!(r.bounds(), 254..=254);
        let r = IpRange::parse("10.0.0.0/24", None, Some("10.0.0.0"), &[]).unwrap();
        assert_eq!(r.bounds(), 1..=1);
    }

    #[test]
    fn start_and_end_narrow() {
        let r = IpRange::parse("10.0.0.0/24", Some("10.0.0.10"), Some("10.0.0.20"), &[]).unwrap();
        assert_eq!(r.bounds(), 10..=20);
        assert_eq!(r.usable_count(), 11);
        let r = IpRange::parse("10.0.0.0/24", Some("10.0.0.200"), None, &[]).unwrap();
        assert_eq!(r.bounds(), 200..=254);
        let r = IpRange::parse("fd00::/120", None, Some("fd00::10"), &[]).unwrap();
        assert_eq!(r.bounds(), 1..=16);
        let r = IpRange::parse("10.0.0.0/24", Some("10.0.0.7"), Some("10.0.0.7"), &[]).unwrap();
        assert_eq!(r.usable_count(), 1);
    }

    #[test]
    fn too_small_prefixes_are_refused() {
        for (range, prefix) in [("10.0.0.0/31", 31), ("10.0.0.1/32", 32), ("2001:db8::/127", 127), ("::1/128", 128)] {
            let err = IpRange::parse(range, None, None, &[]).unwrap_err();
            assert!(matches!(err, RangeError::TooSmall { prefix: p, .. } if p == prefix), "{range}: {err}");
            assert!(err.to_string().contains(&format!("/{prefix}")), "{err}");
        }
        assert_eq!(plain("10.0.0.0/30").usable_count(), 2);
        assert_eq!(plain("2001:db8::/126").usable_count(), 2);
    }

    #[test]
    fn bounds_outside_are_refused() {
        let err = IpRange::parse("10.0.0.0/24", Some("10.0.1.5"), None, &[]).unwrap_err();
        assert_eq!(
            err,
            RangeError::Outside { key: RangeKey::RangeStart, value: ip("10.0.1.5"), cidr: net("10.0.0.0/24") }
        );
        assert_eq!(err.to_string(), "range_start 10.0.1.5 lies outside range 10.0.0.0/24");
        let err = IpRange::parse("10.0.0.0/24", None, Some("9.255.255.255"), &[]).unwrap_err();
        assert!(matches!(err, RangeError::Outside { key: RangeKey::RangeEnd, .. }), "{err}");
        let err = IpRange::parse("10.0.1.5-10.0.0.20/24", None, None, &[]).unwrap_err();
        assert!(matches!(err, RangeError::FirstOutside { .. }), "{err}");
        assert!(err.to_string().contains("10.0.1.5"), "{err}");
    }

    #[test]
    fn end_before_start_is_refused() {
        let err = IpRange::parse("10.0.0.0/24", Some("10.0.0.20"), Some("10.0.0.10"), &[]).unwrap_err();
        assert_eq!(err, RangeError::EndBeforeStart { start: ip("10.0.0.20"), end: ip("10.0.0.10") });
        assert_eq!(err.to_string(), "range_end 10.0.0.10 is before range_start 10.0.0.20");
        let err = IpRange::parse("10.0.0.20-10.0.0.10/24", None, None, &[]).unwrap_err();
        assert!(matches!(err, RangeError::LastBeforeFirst { .. }), "{err}");
        // Checked before clamping: a start on the broadcast with an end below it is a mistake, not a bound to move.
        let err = IpRange::parse("10.0.0.0/24", Some("10.0.0.255"), Some("10.0.0.254"), &[]).unwrap_err();
        assert!(matches!(err, RangeError::EndBeforeStart { .. }), "{err}");
    }

    #[test]
    fn wrong_family_is_refused() {
        let err = IpRange::parse("10.0.0.0/24", Some("2001:db8::1"), None, &[]).unwrap_err();
        assert!(matches!(err, RangeError::WrongFamily { key: RangeKey::RangeStart, found: Family::V6, .. }), "{err}");
        assert_eq!(err.to_string(), "range_start 2001:db8::1 is ipv6, but range 10.0.0.0/24 is ipv4");
        let err = IpRange::parse("2001:db8::/64", None, Some("10.0.0.1"), &[]).unwrap_err();
        assert!(matches!(err, RangeError::WrongFamily { key: RangeKey::RangeEnd, found: Family::V4, .. }), "{err}");
        let err = IpRange::parse("10.0.0.0/24", None, None, &ex(&["fd00::/64"])).unwrap_err();
        assert!(matches!(err, RangeError::WrongFamily { key: RangeKey::Exclude, .. }), "{err}");
        assert!(err.to_string().starts_with("exclude fd00::/64 is ipv6"), "{err}");
        let err = IpRange::parse("2001:db8::/64", None, None, &ex(&["10.0.0.1"])).unwrap_err();
        assert!(matches!(err, RangeError::WrongFamily { key: RangeKey::Exclude, .. }), "{err}");
        let err = IpRange::parse("10.0.0.1-2001:db8::9/64", None, None, &[]).unwrap_err();
        assert!(matches!(err, RangeError::MixedFamily { .. }), "{err}");
        let err = IpRange::parse("::ffff:10.0.0.0/104", None, None, &[]).unwrap_err();
        assert!(matches!(err, RangeError::Ipv4Mapped { .. }), "{err}");
    }

    #[test]
    fn garbage_is_refused() {
        for range in [
            "",
            "10.0.0.0",
            "10.0.0.0/33",
            "2001:db8::/129",
            "10.0.0/24",
            "banana",
            "10.0.0.1-10.0.0.9",
            "10.0.0.1-/24",
            "-10.0.0.9/24",
            "10.0.0.1--10.0.0.9/24",
            " 10.0.0.0/24",
            "10.0.0.0/24 ",
            "010.0.0.0/24",
            "10.0.0.0/024",
            "10.0.0.0/+24",
            "10.0.0.0/",
            "10.0.0.0/24/24",
        ] {
            let err = IpRange::parse(range, None, None, &[]).unwrap_err();
            assert_eq!(err, RangeError::BadRange { value: range.to_string() }, "{range}");
        }
        let err = IpRange::parse("10.0.0.0/24", Some("10.0.0.x"), None, &[]).unwrap_err();
        assert_eq!(err, RangeError::BadAddress { key: RangeKey::RangeStart, value: "10.0.0.x".into() });
        assert_eq!(err.to_string(), "range_start \"10.0.0.x\" is not an ip address");
        let err = IpRange::parse("10.0.0.0/24", None, Some("10.0.0.9/24"), &[]).unwrap_err();
        assert!(matches!(err, RangeError::BadAddress { key: RangeKey::RangeEnd, .. }), "{err}");
        let err = IpRange::parse("10.0.0.0/24", None, None, &ex(&["10.0.0.1", "nope"])).unwrap_err();
        assert_eq!(err, RangeError::BadExclude { value: "nope".into() });
        assert_eq!(err.to_string(), "exclude \"nope\" is neither a cidr nor an ip address");
        for bad in ["10.0.0.0/40", "010.0.0.1", "10.0.0.1/", ""] {
            let err = IpRange::parse("10.0.0.0/24", None, None, &ex(&[bad])).unwrap_err();
            assert_eq!(err, RangeError::BadExclude { value: bad.into() });
        }
        let err = IpRange::parse("banana", None, None, &[]).unwrap_err();
        assert!(err.to_string().starts_with("range \"banana\" is neither a cidr"), "{err}");
    }

    #[test]
    fn start_end_conflicting_with_first_last_form_are_refused() {
        let err = IpRange::parse("10.0.0.10-10.0.0.20/24", Some("10.0.0.11"), None, &[]).unwrap_err();
        assert_eq!(
            err,
            RangeError::Conflict {
                key: RangeKey::RangeStart,
                value: ip("10.0.0.11"),
                range: "10.0.0.10-10.0.0.20/24".into(),
                implied: ip("10.0.0.10"),
            }
        );
        let err = IpRange::parse("10.0.0.10-10.0.0.20/24", None, Some("10.0.0.30"), &[]).unwrap_err();
        assert!(matches!(err, RangeError::Conflict { key: RangeKey::RangeEnd, .. }), "{err}");
    }

    #[test]
    fn excludes_cidr_and_bare_ip() {
        let r =
            IpRange::parse("10.0.0.0/24", None, None, &ex(&["10.0.0.0/28", "10.0.0.100", "10.0.0.130/31"])).unwrap();
        assert_eq!(intervals(&r), vec![(16, 99), (101, 129), (132, 254)]);
        assert_eq!(r.usable_count(), 254 - 15 - 1 - 2);
        assert!(!r.is_usable(15));
        assert!(r.is_usable(16));
        assert!(!r.is_usable(100));
        assert!(!r.is_usable(130) && !r.is_usable(131));
        assert!(r.is_usable(132));
        let r6 = IpRange::parse("2001:db8::/64", None, None, &ex(&["2001:db8::1", "2001:db8::10/124"])).unwrap();
        assert_eq!(r6.first_usable(), Some(2));
        assert!(!r6.is_usable(0x1f) && r6.is_usable(0x20));
    }

    #[test]
    fn excludes_are_clipped_and_merged() {
        // Wider than the range: clipped, here to nothing usable.
        let r = IpRange::parse("10.0.0.0/24", None, None, &ex(&["10.0.0.0/16"])).unwrap();
        assert_eq!(r.usable_count(), 0);
        assert_eq!(r.first_usable(), None);
        assert_eq!(r.last_usable(), None);
        assert_eq!(intervals(&r), vec![]);
        // Wholly outside, same family: no effect.
        let r = IpRange::parse("10.0.0.0/24", None, None, &ex(&["10.0.1.0/24", "192.168.0.1"])).unwrap();
        assert_eq!(r, plain("10.0.0.0/24"));
        // Overlapping and adjacent excludes merge; ones beyond range_start/range_end are clipped away.
        let r = IpRange::parse(
            "10.0.0.0/24",
            Some("10.0.0.10"),
            Some("10.0.0.50"),
            &ex(&["10.0.0.20/30", "10.0.0.22", "10.0.0.24/30", "10.0.0.28", "10.0.0.0/29", "10.0.0.48/28"]),
        )
        .unwrap();
        assert_eq!(r.excluded_intervals().collect::<Vec<_>>(), vec![20..=28, 48..=50]);
        assert_eq!(intervals(&r), vec![(10, 19), (29, 47)]);
        assert_eq!(r.usable_count(), 10 + 19);
        // The order of excludes does not matter.
        let a = IpRange::parse("10.0.0.0/24", None, None, &ex(&["10.0.0.5", "10.0.0.4", "10.0.0.200/29"])).unwrap();
        let b = IpRange::parse("10.0.0.0/24", None, None, &ex(&["10.0.0.200/29", "10.0.0.4/31"])).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn exclude_addr_for_the_gateway() {
        let mut r = plain("10.0.0.0/24");
        r.exclude_addr(ip("10.0.0.1"));
        assert!(!r.is_usable(1));
        assert_eq!(r.first_usable(), Some(2));
        assert_eq!(r.usable_count(), 253);
        r.exclude_addr(ip("10.0.0.2"));
        assert_eq!(r.excluded_intervals().collect::<Vec<_>>(), vec![1..=2]);
        let before = r.clone();
        r.exclude_addr(ip("10.0.1.1"));
        r.exclude_addr(ip("fd00::1"));
        r.exclude_addr(ip("10.0.0.0"));
        r.exclude_addr(ip("10.0.0.255"));
        assert_eq!(r, before);
    }

    #[test]
    fn ipv6_wider_than_2_pow_64() {
        let r = plain("fd00::/8");
        let top = u128::MAX >> 8;
        assert_eq!(r.broadcast_offset(), top);
        assert_eq!(r.usable_count(), top - 1);
        assert_eq!(r.addr_at(top), ip("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));
        assert_eq!(r.addr_at(top - 1), ip("fdff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"));
        assert_eq!(r.offset_of(ip("fdff:ffff:ffff:ffff:ffff:ffff:ffff:fffe")), Some(top - 1));
        assert!(r.is_usable(top - 1));
        assert!(!r.is_usable(top));
        assert_eq!(r.last_usable(), Some(top - 1));
        assert_eq!(r.nth_usable(top - 2), Some(top - 1));
        assert_eq!(r.nth_usable(top - 1), None);

        let r = IpRange::parse(
            "2001:db8::/32",
            Some("2001:db8:8000::"),
            None,
            &ex(&["2001:db8:ffff:ffff::/64", "2001:db8:8000::/120"]),
        )
        .unwrap();
        let top = u128::MAX >> 32;
        let low = 1u128 << 95;
        // The top /64 exclude reaches the broadcast address and is clipped to the last usable one.
        assert_eq!(intervals(&r), vec![(low + 256, top - (1 << 64))]);
        assert_eq!(r.usable_count(), (top - 1) - low + 1 - 256 - ((1 << 64) - 1));
        assert!(!r.is_usable(top - 1));
        assert!(r.is_usable(top - (1 << 64)));

        let all = plain("::/0");
        assert_eq!(all.usable_count(), u128::MAX - 1);
        assert_eq!(all.addr_at(u128::MAX), ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));
    }

    #[test]
    fn nth_usable_walks_intervals() {
        let r = IpRange::parse("10.0.0.0/24", Some("10.0.0.10"), Some("10.0.0.20"), &ex(&["10.0.0.12/30"])).unwrap();
        let all: Vec<u128> = (0..r.usable_count()).map(|k| r.nth_usable(k).unwrap()).collect();
        assert_eq!(all, vec![10, 11, 16, 17, 18, 19, 20]);
        assert_eq!(r.nth_usable(7), None);
    }

    fn arb_cidr() -> impl Strategy<Value = IpNet> {
        prop_oneof![
            (any::<u32>(), 0u8..=30).prop_map(|(a, p)| IpNet::new(IpAddr::V4(Ipv4Addr::from(a)), p).unwrap().trunc()),
            (any::<u128>(), 0u8..=126).prop_map(|(a, p)| IpNet::new(IpAddr::V6(Ipv6Addr::from(a)), p).unwrap().trunc()),
        ]
        .prop_filter("not ipv4-mapped", |n| match n {
            IpNet::V6(n) => n.prefix_len() < 96 || n.network().to_ipv4_mapped().is_none(),
            IpNet::V4(_) => true,
        })
    }

    proptest! {
        #[test]
        fn offset_addr_round_trip(cidr in arb_cidr(), raw in any::<u128>()) {
            let r = IpRange::parse(&cidr.to_string(), None, None, &[]).unwrap();
            let top = r.broadcast_offset();
            let offset = if top == u128::MAX { raw } else { raw % (top + 1) };
            let addr = r.addr_at(offset);
            prop_assert!(cidr.contains(&addr));
            prop_assert_eq!(r.offset_of(addr), Some(offset));
            prop_assert_eq!(r.is_usable(offset), offset != 0 && offset != top);
            if top < u128::MAX {
                prop_assert_eq!(r.checked_addr_at(top + 1), None);
            }
        }

        #[test]
        fn usable_intervals_agree_with_is_usable(
            start in 0u32..64, len in 0u32..64, excludes in proptest::collection::vec((0u32..64, 27u8..=32), 0..6)
        ) {
            let end = (start + len).min(63);
            let excludes: Vec<String> = excludes.iter().map(|(o, p)| format!("10.0.0.{o}/{p}")).collect();
            let r = IpRange::parse("10.0.0.0/26", Some(&format!("10.0.0.{start}")), Some(&format!("10.0.0.{end}")),
                &excludes).unwrap();
            let usable: Vec<u128> = (0..64u128).filter(|&o| r.is_usable(o)).collect();
            let from_intervals: Vec<u128> = r.usable_intervals().flatten().collect();
            prop_assert_eq!(&usable, &from_intervals);
            prop_assert_eq!(r.usable_count(), usable.len() as u128);
            for (k, o) in usable.iter().enumerate() {
                prop_assert_eq!(r.nth_usable(k as u128), Some(*o));
            }
            for w in intervals(&r).windows(2) {
                prop_assert!(w[0].1 + 1 < w[1].0);
            }
        }
    }
}
