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
        // each range gives one address: a second one asked of the same range could never be handed out
        if let Some(range) = ranges.iter().find(|rg| rg.cidr().contains(&r.ip))
            && let Some(first) = out.iter().find(|ip| range.cidr().contains(*ip))
        {
            return Err(ConfigError::invalid(
                &r.key,
                format!(
                    "{} and {first} both lie in range {}, which gives one address per attachment: ask for one",
                    r.ip,
                    range.cidr()
                ),
            ));
        }
        out.push(r.ip);
    }
    Ok(out)
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
    if !containing.iter().any(|rg| rg.offset_of(ip).is_some_and(|o| rg.is_usable(o))) {
        let cidrs: Vec<String> = containing.iter().map(|rg| rg.cidr().to_string()).collect();
        return Err(ConfigError::invalid(
            &r.key,
            format!(
                "{ip} cannot be handed out from {}: it is the network or broadcast address, the gateway, excluded, \
                 or outside range_start..range_end",
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
