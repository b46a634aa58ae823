//! `CNI_ARGS`: `K=V;K2=V2;...`, read the way `cnitypes.LoadArgs` reads it into Whereabouts' `IPAMEnvArgs`.
//!
//! Keys are case-sensitive. A pair must have exactly one `=`; an unknown key is an error unless `IgnoreUnknown` is
//! `1`/`true` (case-insensitive, anywhere in the list). Whereabouts lets a repeated key silently override; here a
//! key repeated with a different value is refused.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::StaticAddress;
use super::error::ConfigError;
use super::requested::Requested;

/// The keys this plugin reads. `K8S_POD_INFRA_CONTAINER_ID` is set by every runtime and known to Whereabouts;
/// it is accepted and not used. `K8S_POD_UID` is ours (Multus and the runtimes pass it).
const KNOWN: &[&str] = &[
    "IgnoreUnknown",
    "IP",
    "GATEWAY",
    "K8S_POD_NAME",
    "K8S_POD_NAMESPACE",
    "K8S_POD_UID",
    "K8S_POD_INFRA_CONTAINER_ID",
];

/// What `CNI_ARGS` says.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct CniArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: Option<String>,
    /// `IP=`, comma-separated, each a bare address or `address/prefix`.
    pub ips: Vec<Requested>,
    /// `GATEWAY=`, comma-separated: Whereabouts sets it on every entry of `ipam.addresses` that contains it.
    pub gateways: Vec<IpAddr>,
    /// Unknown keys let through by `IgnoreUnknown`, named as in messages.
    pub ignored: Vec<String>,
}

/// How [`parse_as`] reads `CNI_ARGS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// ADD: as `cnitypes.LoadArgs` does, every key checked.
    Strict,
    /// DEL and GC need only the pod: `IgnoreUnknown` is taken as set whatever its value, and `IP=` and
    /// `GATEWAY=`, which choose addresses, are not read.
    Release,
}

pub(super) fn parse(args: &str) -> Result<CniArgs, ConfigError> {
    parse_as(args, Mode::Strict)
}

/// `CNI_ARGS` for DEL and GC: unknown keys are let through (into `ignored`) as if `IgnoreUnknown` were set, and
/// `IP=`/`GATEWAY=` are left unread. A malformed pair is still an error: the pod it names cannot be trusted.
pub(super) fn parse_for_release(args: &str) -> Result<CniArgs, ConfigError> {
    parse_as(args, Mode::Release)
}

fn parse_as(args: &str, mode: Mode) -> Result<CniArgs, ConfigError> {
    let mut out = CniArgs::default();
    if args.is_empty() {
        return Ok(out);
    }
    let mut pairs: BTreeMap<&str, &str> = BTreeMap::new();
    let mut unknown = Vec::new();
    let mut ignore_unknown = false;
    for pair in args.split(';') {
        let mut kv = pair.split('=');
        let (Some(k), Some(v), None) = (kv.next(), kv.next(), kv.next()) else {
            return Err(ConfigError::CniArgs(format!("{pair:?} is not a KEY=VALUE pair (exactly one \"=\")")));
        };
        if mode == Mode::Release && matches!(k, "IgnoreUnknown" | "IP" | "GATEWAY") {
            continue;
        }
        if k == "IgnoreUnknown" {
            // Multus puts its own `IgnoreUnknown=true` before the runtime's `IgnoreUnknown=1`: spellings of one
            // wish, so any true one wins rather than counting as a conflict.
            ignore_unknown |= match v.to_ascii_lowercase().as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => return Err(ConfigError::CniArgs(format!("IgnoreUnknown={v}: expected 1, true, 0 or false"))),
            };
            continue;
        }
        if let Some(old) = pairs.insert(k, v)
            && old != v
        {
            return Err(ConfigError::CniArgs(format!("{k} is given twice, as {old:?} and {v:?}")));
        }
        if !KNOWN.contains(&k) && !unknown.contains(&k) {
            unknown.push(k);
        }
    }
    if !unknown.is_empty() {
        if !ignore_unknown && mode == Mode::Strict {
            let named: Vec<String> = unknown.iter().map(|k| describe_unknown(k)).collect();
            return Err(ConfigError::CniArgs(format!(
                "unknown keys: {} (set IgnoreUnknown=1 to let unknown keys through)",
                named.join(", ")
            )));
        }
        out.ignored = unknown.iter().map(|k| format!("CNI_ARGS {k}")).collect();
    }
    for (k, v) in pairs {
        match k {
            "K8S_POD_NAME" => out.pod_name = v.to_string(),
            "K8S_POD_NAMESPACE" => out.pod_namespace = v.to_string(),
            "K8S_POD_UID" => out.pod_uid = (!v.is_empty()).then(|| v.to_string()),
            "IP" if !v.is_empty() => out.ips = list(v, "IP")?.iter().map(|s| requested(s)).collect::<Result<_, _>>()?,
            "GATEWAY" if !v.is_empty() => {
                out.gateways = list(v, "GATEWAY")?
                    .iter()
                    .map(|s| {
                        s.parse().map_err(|_| ConfigError::CniArgs(format!("GATEWAY: {s:?} is not an IP address")))
                    })
                    .collect::<Result<_, _>>()?;
            }
            _ => {}
        }
    }
    Ok(out)
}

/// `GATEWAY=`: Whereabouts (`config.handleEnvArgs`) sets each gateway on every entry of `ipam.addresses` that
/// contains it. A gateway that contains none would be dropped there; here it is refused.
pub(super) fn apply_gateways(addresses: &mut [StaticAddress], gateways: &[IpAddr]) -> Result<(), ConfigError> {
    for gw in gateways {
        let mut found = false;
        for a in addresses.iter_mut().filter(|a| a.address.contains(gw)) {
            a.gateway = Some(*gw);
            found = true;
        }
        if !found {
            return Err(ConfigError::CniArgs(format!(
                "GATEWAY: {gw} is inside none of ipam.addresses (it sets the gateway of static addresses only)"
            )));
        }
    }
    Ok(())
}

fn describe_unknown(k: &str) -> String {
    match KNOWN.iter().find(|known| known.eq_ignore_ascii_case(k)) {
        Some(known) => format!("{k} (keys are case-sensitive: did you mean {known}?)"),
        None => k.to_string(),
    }
}

fn list<'v>(v: &'v str, key: &str) -> Result<Vec<&'v str>, ConfigError> {
    v.split(',')
        .map(str::trim)
        .enumerate()
        .map(|(i, s)| match s {
            "" => Err(ConfigError::CniArgs(format!("{key}={v}: entry {i} is empty"))),
            s => Ok(s),
        })
        .collect()
}

fn requested(s: &str) -> Result<Requested, ConfigError> {
    Requested::parse("CNI_ARGS IP", s)
        .ok_or_else(|| ConfigError::CniArgs(format!("IP: {s:?} is not an IP address (bare or address/prefix)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_runtime_args() {
        let args = parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
        )
        .unwrap();
        assert_eq!(args.pod_namespace, "ns");
        assert_eq!(args.pod_name, "pod-0");
        assert_eq!(args.pod_uid.as_deref(), Some("u-1"));
        assert!(args.ignored.is_empty());
    }

    #[test]
    fn empty_is_nothing() {
        assert_eq!(parse("").unwrap(), CniArgs::default());
    }

    #[test]
    fn ignore_unknown_anywhere_and_any_case() {
        let args = parse("FOO=bar;IgnoreUnknown=True").unwrap();
        assert_eq!(args.ignored, ["CNI_ARGS FOO"]);
        let err = parse("FOO=bar;IgnoreUnknown=0").unwrap_err();
        assert!(err.to_string().contains("FOO"), "{err}");
        let err = parse("IgnoreUnknown=yes").unwrap_err();
        assert!(err.to_string().contains("IgnoreUnknown"), "{err}");
    }

    #[test]
    fn case_variant_gets_a_hint() {
        let err = parse("k8s_pod_name=x").unwrap_err();
        assert!(err.to_string().contains("did you mean K8S_POD_NAME"), "{err}");
    }

    #[test]
    fn malformed_pairs() {
        for bad in ["K8S_POD_NAME", "A=b=c", "K8S_POD_NAME=x;", ";"] {
            let err = parse(bad).unwrap_err();
            assert_eq!(err.code(), 4, "{bad}");
            assert!(err.to_string().contains("KEY=VALUE"), "{err}");
        }
    }

    #[test]
    fn conflicting_repeat_refused_identical_repeat_accepted() {
        assert!(parse("K8S_POD_NAME=a;K8S_POD_NAME=a").is_ok());
        let err = parse("K8S_POD_NAME=a;K8S_POD_NAME=b").unwrap_err();
        assert!(err.to_string().contains("K8S_POD_NAME"), "{err}");
    }

    #[test]
    fn ip_and_gateway_lists() {
        let args = parse("IP=10.0.0.5/24, 2001:db8::5;GATEWAY=10.0.0.1").unwrap();
        let ips: Vec<String> = args.ips.iter().map(|r| r.ip.to_string()).collect();
        assert_eq!(ips, ["10.0.0.5", "2001:db8::5"]);
        assert_eq!(args.ips[0].prefix, Some(24));
        assert_eq!(args.ips[1].prefix, None);
        assert_eq!(args.gateways, ["10.0.0.1".parse::<IpAddr>().unwrap()]);
        for bad in ["IP=10.0.0.300", "IP=10.0.0.5,", "GATEWAY=gw"] {
            let err = parse(bad).unwrap_err();
            assert_eq!(err.code(), 4);
            let key = bad.split('=').next().unwrap();
            assert!(err.to_string().contains(key), "{err}");
        }
    }
}
