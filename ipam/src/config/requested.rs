//! Exact addresses asked for by the runtime: `runtimeConfig.ips` (Multus' `ips` capability) and `CNI_ARGS` `IP=`.

use std::net::IpAddr;

use ipnet::IpNet;

use super::error::ConfigError;
use super::ranges::cidr_list;
use crate::range::IpRange;

/// One requested address, with the key it came from and the prefix it was written with, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Requested {
    pub key: String,
    pub ip: IpAddr,
    pub prefix: Option<u8>,
}

impl Requested {
    /// `10.0.0.5` or `10.0.0.5/24`.
    pub(super) fn parse(key: &str, s: &str) -> Option<Self> {
        if let Ok(net) = s.parse::<IpNet>() {
            return Some(Self { key: key.to_string(), ip: net.addr(), prefix: Some(net.prefix_len()) });
        }
        s.parse().ok().map(|ip| Self { key: key.to_string(), ip, prefix: None })
    }
}

/// `runtimeConfig.ips` first, then `IP=`, without repeats; each must be a usable address of one of `ranges`.
pub(super) fn resolve(
    runtime: &[(String, String)],
    cni_args: &[Requested],
    ranges: &[IpRange],
) -> Result<Vec<IpAddr>, ConfigError> {
    let mut all = Vec::with_capacity(runtime.len() + cni_args.len());
    for (key, s) in runtime {
        let r = Requested::parse(key, s)
            .ok_or_else(|| ConfigError::invalid(key, format!("{s:?} is not an IP address (bare or address/prefix)")))?;
        all.push(r);
    }
    all.extend(cni_args.iter().cloned());
    let mut out: Vec<IpAddr> = Vec::with_capacity(all.len());
    for r in &all {
        check(r, ranges)?;
        if out.contains(&r.ip) {
            continue;
        }
        out.push(r.ip);
        // each range gives one address: one asked of a range that already gives another could never be handed out
        if let Err(first) = by_range(ranges, &out) {
            let range =
                ranges.iter().find(|rg| rg.cidr().contains(&r.ip)).map_or_else(String::new, |rg| rg.cidr().to_string());
            return Err(ConfigError::invalid(
                &r.key,
                format!(
                    "{} and {first} both lie in range {range}, which gives one address per attachment: ask for one",
                    r.ip
                ),
            ));
        }
    }
    Ok(out)
}

/// Which range gives which requested address: each address, in order, goes to the first range that can hand it
/// out and gives no other. `Err` names an address already given by the range(s) the next one needs.
pub(crate) fn by_range(ranges: &[IpRange], requested: &[IpAddr]) -> Result<Vec<Option<IpAddr>>, IpAddr> {
    let mut given: Vec<Option<IpAddr>> = vec![None; ranges.len()];
    for ip in requested {
        let can = |rg: &IpRange| rg.offset_of(*ip).is_some_and(|o| rg.is_usable(o) && o <= rg.max_offset());
        match ranges.iter().enumerate().find(|(i, rg)| given[*i].is_none() && can(rg)) {
            Some((i, _)) => given[i] = Some(*ip),
            None => {
                let first = ranges.iter().enumerate().find(|(_, rg)| can(rg)).and_then(|(i, _)| given[i]);
                return Err(first.unwrap_or(*ip));
            }
        }
    }
    Ok(given)
}

fn check(r: &Requested, ranges: &[IpRange]) -> Result<(), ConfigError> {
    let ip = r.ip;
    let containing: Vec<&IpRange> = ranges.iter().filter(|rg| rg.cidr().contains(&ip)).collect();
    if containing.is_empty() {
        let reason = if ranges.is_empty() {
            format!("{ip} is requested but there is no range to take it from (ipam.addresses only)")
        } else {
            format!("{ip} is outside every range ({})", cidr_list(ranges))
        };
        return Err(ConfigError::invalid(&r.key, reason));
    }
    if let Some(p) = r.prefix {
        let host = if ip.is_ipv4() { 32 } else { 128 };
        if p != host && !containing.iter().any(|rg| rg.cidr().prefix_len() == p) {
            return Err(ConfigError::invalid(
                &r.key,
                format!("{ip}/{p}: the prefix differs from that of its range {}", containing[0].cidr()),
            ));
        }
    }
    if !containing.iter().any(|rg| rg.offset_of(ip).is_some_and(|o| rg.is_usable(o) && o <= rg.max_offset())) {
        let cidrs: Vec<String> = containing.iter().map(|rg| rg.cidr().to_string()).collect();
        return Err(ConfigError::invalid(
            &r.key,
            format!(
                "{ip} cannot be handed out from {}: it is the network or broadcast address, the gateway, excluded, \
                 outside range_start..range_end, or 2^63 or more above the network address",
                cidrs.join(", ")
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(list: &[&str]) -> Vec<IpRange> {
        list.iter().map(|r| IpRange::parse(r, None, None, &[]).unwrap()).collect()
    }

    fn runtime(ips: &[&str]) -> Vec<(String, String)> {
        ips.iter().enumerate().map(|(i, ip)| (format!("runtimeConfig.ips[{i}]"), ip.to_string())).collect()
    }

    #[test]
    fn one_address_per_range() {
        let dual = ranges(&["10.0.0.0/24", "2001:db8::/64"]);
        let ok = resolve(&runtime(&["10.0.0.5", "2001:db8::5", "10.0.0.5/24"]), &[], &dual).unwrap();
        assert_eq!(ok, ["10.0.0.5".parse::<IpAddr>().unwrap(), "2001:db8::5".parse().unwrap()]);
        let err = resolve(&runtime(&["10.0.0.5", "10.0.0.6"]), &[], &dual).unwrap_err();
        assert_eq!(err.code(), 7);
        assert_eq!(
            err.to_string(),
            "runtimeConfig.ips[1]: 10.0.0.6 and 10.0.0.5 both lie in range 10.0.0.0/24, which gives one address per \
             attachment: ask for one"
        );
        let from_args = [Requested::parse("CNI_ARGS IP", "10.0.0.7").unwrap()];
        let err = resolve(&runtime(&["10.0.0.5"]), &from_args, &dual).unwrap_err();
        assert!(err.to_string().starts_with("CNI_ARGS IP: 10.0.0.7 and 10.0.0.5"), "{err}");
    }
}
