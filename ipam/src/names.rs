//! Whereabouts-compatible names of pools and reservations.
//!
//! These must match Whereabouts v0.9.2 byte for byte, or a mixed fleet would keep two pools for one range and
//! the reservations would stop being a cluster-wide claim. The Go originals are in
//! `pkg/storage/kubernetes/ipam.go`: `IPPoolName` and `normalizeRange` (pools), `NormalizeIP` (reservations),
//! and `getNodeSliceName` / `pkg/node-controller/controller.go` `getSliceName` (node-slice pools).
//!
//! The range in a pool name is the *normalised CIDR* as Go prints it (`net.IPNet.String()`), never the `range`
//! string of the config: Whereabouts' `LoadIPAMConfig` (`pkg/config/config.go`) rewrites every range, including
//! `A-B/len` ones, to `ipNet.String()` of its CIDR before any pool is named. So `10.0.0.5/24` and
//! `10.0.0.10-10.0.0.20/24` both live in pool `10.0.0.0-24`, and that same string is the pool's `spec.range`
//! ([`range_string`]).

use std::net::IpAddr;

use ipnet::IpNet;

/// Whether `name` can name a namespaced object (a DNS-1123 subdomain: at most 253 characters of lower-case letters,
/// digits, `-` and `.`, starting and ending with a letter or digit).
pub fn is_dns_subdomain(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    name.len() <= 253
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// An IP address as Go's `net.IP.String()` prints it, which is what Whereabouts puts into names.
///
/// IPv6 follows RFC 5952 (lower-case hex, the first longest run of two or more zero groups as `::`), exactly like
/// Rust's `Display`. The one difference is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`): Go's `net.IP` cannot
/// tell it from the IPv4 address and prints `a.b.c.d`.
pub fn go_ip_string(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => a.to_string(),
        },
    }
}

/// A CIDR as Go's `net.IPNet.String()` prints it: the network address (host bits dropped), `/`, the prefix. This
/// is the range string Whereabouts names pools after and writes into `spec.range`.
///
/// An IPv4-mapped IPv6 network of prefix 96 or more prints as the IPv4 network with the prefix less 96, as in Go.
pub fn range_string(cidr: IpNet) -> String {
    let cidr = cidr.trunc();
    if let IpNet::V6(n) = cidr
        && n.prefix_len() >= 96
        && let Some(v4) = n.network().to_ipv4_mapped()
    {
        return format!("{v4}/{}", n.prefix_len() - 96);
    }
    format!("{}/{}", go_ip_string(cidr.network()), cidr.prefix_len())
}

/// Whereabouts' `normalizeRange`: `:` and `/` become `-`, after a `0` is appended to a string ending in `:`.
///
/// Range strings always end in the prefix length, so the trailing-`:` rule never fires for them; it is kept
/// because it is part of the Go function.
fn normalize_range(range: &str) -> String {
    let mut s = range.to_string();
    if s.ends_with(':') {
        s.push('0');
    }
    s.replace([':', '/'], "-")
}

/// Prefixes `name` with `<network_name>-` unless the network is unnamed (Whereabouts' `UnnamedNetwork`, `""`).
fn with_network(network_name: &str, name: String) -> String {
    if network_name.is_empty() { name } else { format!("{network_name}-{name}") }
}

/// The name of the IPPool of `cidr`, e.g. `10.0.0.0-8`, `net-a-10.0.0.0-8`, `fd00-0-0-10---64`.
///
/// `cidr` is normalised first (host bits dropped), as Whereabouts names pools only after normalising the range.
pub fn pool_name(network_name: &str, cidr: IpNet) -> String {
    with_network(network_name, normalize_range(&range_string(cidr)))
}

/// The name of the IPPool of one node's slice of a range (node-slice mode): `<node>-<slice>`, or
/// `<network_name>-<node>-<slice>` for a named network, e.g. `net-a-node-1-10.0.0.0-24`.
///
/// `cidr` is the node's slice (its `sliceRange` in the NodeSlicePool's status), not the whole range: Whereabouts
/// swaps the slice in before naming the pool (`IPManagementKubernetesUpdate`). The same name is the node's leader
/// election Lease in that mode.
pub fn slice_pool_name(network_name: &str, node: &str, cidr: IpNet) -> String {
    with_network(network_name, format!("{node}-{}", normalize_range(&range_string(cidr))))
}

/// Whether `pool_name` is a name [`slice_pool_name`] gives `node`'s pool of the slice `cidr` in some network (a
/// name that could be another node's too, `a-b` against `b`, counts: callers take it as a hint only).
pub fn may_be_slice_pool_of(pool_name: &str, node: &str, cidr: IpNet) -> bool {
    let suffix = format!("-{}", normalize_range(&range_string(cidr)));
    pool_name
        .strip_suffix(&suffix)
        .is_some_and(|rest| rest == node || rest.strip_suffix(node).is_some_and(|network| network.ends_with('-')))
}

/// The node a slice pool named `pool_name` of the network `network_name` for the slice `cidr` belongs to: the inverse
/// of [`slice_pool_name`], or `None` when the name is not of that form.
pub fn node_of_slice_pool<'a>(pool_name: &'a str, network_name: &str, cidr: IpNet) -> Option<&'a str> {
    let suffix = format!("-{}", normalize_range(&range_string(cidr)));
    let rest = pool_name.strip_suffix(&suffix)?;
    let node = if network_name.is_empty() { rest } else { rest.strip_prefix(network_name)?.strip_prefix('-')? };
    (!node.is_empty()).then_some(node)
}

/// The name of the NodeSlicePool of a network: its `network_name`, or, for an unnamed network, the `name` of the
/// CNI network configuration (the NAD's config). Not derived from the range: NADs of one network share it.
pub fn node_slice_pool_name(network_name: &str, config_name: &str) -> String {
    if network_name.is_empty() { config_name.to_string() } else { network_name.to_string() }
}

/// The `network_name` a pool named `pool_name` for `cidr` belongs to (the inverse of [`pool_name`]), or `None`
/// when the name is not of that form (a slice pool, or a pool named by another tool).
pub fn network_of_pool(pool_name: &str, cidr: IpNet) -> Option<String> {
    let range = normalize_range(&range_string(cidr));
    if pool_name == range {
        return Some(String::new());
    }
    pool_name.strip_suffix(&range)?.strip_suffix('-').filter(|n| !n.is_empty()).map(str::to_string)
}

/// The name of the OverlappingRangeIPReservation of `ip`, e.g. `2001--1`, `net-a-10.0.0.1`.
///
/// Whereabouts' `NormalizeIP`: the Go form of the address with a `0` appended when it ends in `:` (so
/// `2001:db8::` is `2001-db8--0`, a name cannot end in `-`), then `:` replaced by `-`.
pub fn reservation_name(network_name: &str, ip: IpAddr) -> String {
    let mut s = go_ip_string(ip);
    if s.ends_with(':') {
        s.push('0');
    }
    with_network(network_name, s.replace(':', "-"))
}

/// The name the maintained Whereabouts fork (telekom/whereabouts) gives the reservation of an IPv6 address: all
/// eight groups written out, e.g. `net-a-2001-0db8-0000-0000-0000-0000-0000-0001`; `None` for IPv4, which it names
/// as upstream does. It reads upstream's name only as a fallback, and hereabouts writes upstream's, so each looks
/// for both ([`reservation_names`]).
pub fn expanded_reservation_name(network_name: &str, ip: IpAddr) -> Option<String> {
    let IpAddr::V6(v6) = ip else { return None };
    let groups: Vec<String> = v6.segments().iter().map(|g| format!("{g:04x}")).collect();
    Some(with_network(network_name, groups.join("-")))
}

/// Every name a reservation of `ip` may have: upstream Whereabouts' (what hereabouts writes) first, then the
/// fork's expanded IPv6 form.
pub fn reservation_names(network_name: &str, ip: IpAddr) -> Vec<String> {
    let mut names = vec![reservation_name(network_name, ip)];
    names.extend(expanded_reservation_name(network_name, ip));
    names
}

/// The address a reservation `name` of `network` stands for, if it lies in `range`: the inverse of
/// [`reservation_name`] (and of [`expanded_reservation_name`]), checked by computing the name again.
pub fn reservation_address(name: &str, network: &str, range: &crate::range::IpRange) -> Option<IpAddr> {
    let rest = if network.is_empty() { name } else { name.strip_prefix(network)?.strip_prefix('-')? };
    let ip: IpAddr = if range.cidr().addr().is_ipv4() {
        IpAddr::V4(rest.parse().ok()?)
    } else {
        IpAddr::V6(rest.replace('-', ":").parse().ok()?)
    };
    (range.cidr().contains(&ip) && reservation_names(network, ip).iter().any(|n| n == name)).then_some(ip)
}

#[cfg(test)]
mod network_of_pool_tests {
    use super::*;

    #[test]
    fn inverts_pool_name() {
        for (net, cidr) in [("", "10.0.0.0/8"), ("net-a", "10.0.0.0/8"), ("x", "fd00:0:0:10::/64")] {
            let cidr: IpNet = cidr.parse().unwrap();
            assert_eq!(network_of_pool(&pool_name(net, cidr), cidr).as_deref(), Some(net));
        }
        let cidr: IpNet = "10.0.0.0/8".parse().unwrap();
        assert_eq!(network_of_pool("something-else", cidr), None);
        assert_eq!(network_of_pool("-10.0.0.0-8", cidr), None);
    }

    #[test]
    fn node_of_slice_pool_inverts_slice_pool_name() {
        for (net, node, cidr) in
            [("", "node-a", "10.0.0.0/26"), ("net", "node-1", "10.0.0.64/26"), ("n", "w", "fd00::/72")]
        {
            let cidr: IpNet = cidr.parse().unwrap();
            assert_eq!(node_of_slice_pool(&slice_pool_name(net, node, cidr), net, cidr), Some(node));
        }
        let cidr: IpNet = "10.0.0.0/26".parse().unwrap();
        assert_eq!(node_of_slice_pool("net-10.0.0.0-26", "net", cidr), None, "no node");
        assert_eq!(node_of_slice_pool("other-a-10.0.0.0-26", "net", cidr), None, "another network");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    // Expected values below were produced by running Whereabouts v0.9.2's IPPoolName, normalizeRange and
    // NormalizeIP (copied verbatim into a Go program) on net.ParseCIDR / net.ParseIP of the same inputs.

    #[test]
    fn pool_names_match_whereabouts() {
        for (cidr, unnamed, named) in [
            ("10.0.0.0/8", "10.0.0.0-8", "net-a-10.0.0.0-8"),
            ("10.0.0.5/24", "10.0.0.0-24", "net-a-10.0.0.0-24"),
            ("192.168.2.0/24", "192.168.2.0-24", "net-a-192.168.2.0-24"),
            ("0.0.0.0/0", "0.0.0.0-0", "net-a-0.0.0.0-0"),
            ("fd00:0:0:10::/64", "fd00-0-0-10---64", "net-a-fd00-0-0-10---64"),
            ("2001:db8::/32", "2001-db8---32", "net-a-2001-db8---32"),
            ("2001:db8:0:0:1:0:0:0/80", "2001-db8-0-0-1---80", "net-a-2001-db8-0-0-1---80"),
            ("fd00::/8", "fd00---8", "net-a-fd00---8"),
            ("::/0", "---0", "net-a----0"),
            ("2001:db8:1:0:0:1::/96", "2001-db8-1--1-0-0-96", "net-a-2001-db8-1--1-0-0-96"),
            ("FD00:ABCD::/48", "fd00-abcd---48", "net-a-fd00-abcd---48"),
            ("1:0:0:1:0:0:0:0/64", "1-0-0-1---64", "net-a-1-0-0-1---64"),
            ("2001:db8:5422:5::/64", "2001-db8-5422-5---64", "net-a-2001-db8-5422-5---64"),
            ("::ffff:10.0.0.0/104", "10.0.0.0-8", "net-a-10.0.0.0-8"),
        ] {
            assert_eq!(pool_name("", net(cidr)), unnamed, "{cidr}");
            assert_eq!(pool_name("net-a", net(cidr)), named, "{cidr}");
        }
    }

    #[test]
    fn pool_name_of_a_first_last_range_is_that_of_its_cidr() {
        let r = crate::range::IpRange::parse("192.168.2.225-192.168.2.230/24", None, None, &[]).unwrap();
        assert_eq!(pool_name("", r.cidr()), "192.168.2.0-24");
        let r =
            crate::range::IpRange::parse("2001:db8:5422:5::-2001:db8:5422:5:7fff:ffff:ffff:ffff/64", None, None, &[])
                .unwrap();
        assert_eq!(pool_name("", r.cidr()), "2001-db8-5422-5---64");
    }

    #[test]
    fn range_strings_are_go_cidr_strings() {
        assert_eq!(range_string(net("10.0.0.5/24")), "10.0.0.0/24");
        assert_eq!(range_string(net("fd00:0:0:10::/64")), "fd00:0:0:10::/64");
        assert_eq!(range_string(net("2001:db8:0:0:1:0:0:0/80")), "2001:db8:0:0:1::/80");
        assert_eq!(range_string(net("::ffff:10.0.0.0/104")), "10.0.0.0/8");
    }

    #[test]
    fn slice_pool_names_match_whereabouts() {
        assert_eq!(slice_pool_name("", "node-1", net("10.0.0.0/8")), "node-1-10.0.0.0-8");
        assert_eq!(slice_pool_name("net-a", "node-1", net("10.0.0.0/8")), "net-a-node-1-10.0.0.0-8");
        assert_eq!(slice_pool_name("net-a", "node-1", net("10.0.4.0/24")), "net-a-node-1-10.0.4.0-24");
        assert_eq!(slice_pool_name("", "node-1", net("fd00:0:0:10::/64")), "node-1-fd00-0-0-10---64");
        assert_eq!(slice_pool_name("net-a", "node-1", net("2001:db8::/32")), "net-a-node-1-2001-db8---32");
        assert_eq!(node_slice_pool_name("net-a", "my-nad-config"), "net-a");
        for (name, node, yes) in [
            ("net-a-node-1-10.0.4.0-24", "node-1", true),
            ("node-1-10.0.4.0-24", "node-1", true),
            ("net-a-node-11-10.0.4.0-24", "node-1", false),
            ("net-a-node-1-10.0.5.0-24", "node-1", false),
            ("net-a-xnode-1-10.0.4.0-24", "node-1", false),
        ] {
            assert_eq!(may_be_slice_pool_of(name, node, net("10.0.4.0/24")), yes, "{name} of {node}");
        }
        assert_eq!(node_slice_pool_name("", "my-nad-config"), "my-nad-config");
    }

    #[test]
    fn reservation_names_match_whereabouts() {
        for (addr, unnamed, named) in [
            ("10.0.0.1", "10.0.0.1", "net-a-10.0.0.1"),
            ("2001::1", "2001--1", "net-a-2001--1"),
            ("2001:db8::", "2001-db8--0", "net-a-2001-db8--0"),
            ("::", "--0", "net-a---0"),
            ("::1", "--1", "net-a---1"),
            ("fd00:0:0:10::", "fd00-0-0-10--0", "net-a-fd00-0-0-10--0"),
            ("2001:db8:0:1:0:0:0:1", "2001-db8-0-1--1", "net-a-2001-db8-0-1--1"),
            ("2001:0:0:1:0:0:1:0", "2001--1-0-0-1-0", "net-a-2001--1-0-0-1-0"),
            ("::ffff:10.0.0.1", "10.0.0.1", "net-a-10.0.0.1"),
            ("1:0:0:0:1:0:0:0", "1--1-0-0-0", "net-a-1--1-0-0-0"),
            ("2001:DB8::ABCD", "2001-db8--abcd", "net-a-2001-db8--abcd"),
            ("1:2:3:4:5:6:7:0", "1-2-3-4-5-6-7-0", "net-a-1-2-3-4-5-6-7-0"),
            ("1:2:3:4:5:6:0:0", "1-2-3-4-5-6--0", "net-a-1-2-3-4-5-6--0"),
        ] {
            assert_eq!(reservation_name("", ip(addr)), unnamed, "{addr}");
            assert_eq!(reservation_name("net-a", ip(addr)), named, "{addr}");
        }
    }

    #[test]
    fn the_forks_expanded_ipv6_names_are_read_too() {
        let one = ip("2001:db8::1");
        assert_eq!(
            reservation_names("net-a", one),
            ["net-a-2001-db8--1", "net-a-2001-0db8-0000-0000-0000-0000-0000-0001"]
        );
        assert_eq!(reservation_names("", ip("10.0.0.1")), ["10.0.0.1"], "IPv4 has one name");
        let range = crate::range::IpRange::parse("2001:db8::/64", None, None, &[]).unwrap();
        for name in reservation_names("net-a", one) {
            assert_eq!(reservation_address(&name, "net-a", &range), Some(one), "{name}");
        }
        assert_eq!(reservation_address("net-a-2001-db8-0-0-0-0-0-1", "net-a", &range), None, "a form nobody writes");
    }
}
