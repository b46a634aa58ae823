//! `ipam.iaas_provider`: a range whose addresses are cloud sub-interfaces, created by an IaaS provider over HTTPS
//! (the contract: docs/provider.md). This reads and checks the section; [`crate::provider`] talks to the provider.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use super::duration::{self, GoDuration};
use super::error::ConfigError;
use super::json::{check_keys, string};
use super::netconf::RawIpam;
use crate::range::IpRange;

/// The keys of `ipam.iaas_provider`.
pub const PROVIDER_KEYS: &[&str] =
    &["url", "ca_file", "client_cert_file", "client_key_file", "http_request_timeout", "parent_interface"];

/// `http_request_timeout` when the key is absent: the seed's default, above a rate-limited provider's worst case
/// (30 s of queueing and 16 s of cloud call).
pub const DEFAULT_HTTP_REQUEST_TIMEOUT: &str = "50s";

/// A static ceiling on one provider call, whatever the invocation's budget.
pub const MAX_HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// `ipam.iaas_provider`, checked ([`parse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// `https://host[:port]`; the contract's paths go below it.
    pub url: http::Uri,
    /// The PEM CA the provider's certificate must chain to (no system store).
    pub ca_file: PathBuf,
    /// A client certificate and its key (PEM), when the provider asks for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// The most one call may take, < 2m and < the invocation's budget.
    pub http_request_timeout: GoDuration,
    /// The host interface the sub-interfaces hang off; its MAC is the requests' `parentNicMac`.
    pub parent_interface: String,
}

/// Reads `section` (the value of `ipam.iaas_provider`) for an invocation whose time budget is `budget`.
pub fn parse(section: &Map<String, Value>, budget: Duration) -> Result<ProviderConfig, ConfigError> {
    let key = |k: &str| format!("ipam.iaas_provider.{k}");
    check_keys(section, PROVIDER_KEYS, &[], key)?;
    let get = |k: &str| section.get(k).map_or(Ok(None), |v| string(v, &key(k)));

    let url_text = get("url")?.ok_or_else(|| ConfigError::invalid(key("url"), "required: the provider's https URL"))?;
    let url: http::Uri =
        url_text.parse().map_err(|e| ConfigError::invalid(key("url"), format!("{url_text:?} is not a URL: {e}")))?;
    if url.scheme_str() != Some("https") {
        return Err(ConfigError::invalid(key("url"), format!("{url_text:?}: only https is allowed (TLS is verified)")));
    }
    if url.host().is_none_or(str::is_empty) {
        return Err(ConfigError::invalid(key("url"), format!("{url_text:?} has no host")));
    }
    if url.path() != "/" && !url.path().is_empty() {
        return Err(ConfigError::invalid(
            key("url"),
            format!("{url_text:?}: give scheme, host and port only; the API paths are the contract's"),
        ));
    }
    let ca_file = get("ca_file")?.map(PathBuf::from).ok_or_else(|| {
        ConfigError::invalid(key("ca_file"), "required: the PEM CA the provider's certificate is checked against")
    })?;
    let client_cert = match (get("client_cert_file")?, get("client_key_file")?) {
        (Some(cert), Some(key_file)) => Some((PathBuf::from(cert), PathBuf::from(key_file))),
        (None, None) => None,
        (Some(_), None) => return Err(ConfigError::invalid(key("client_key_file"), "required with client_cert_file")),
        (None, Some(_)) => return Err(ConfigError::invalid(key("client_cert_file"), "required with client_key_file")),
    };
    let timeout_text = get("http_request_timeout")?.unwrap_or_else(|| DEFAULT_HTTP_REQUEST_TIMEOUT.to_string());
    let http_request_timeout = request_timeout(&timeout_text, budget)
        .map_err(|reason| ConfigError::invalid(key("http_request_timeout"), reason))?;
    let parent_interface = get("parent_interface")?.ok_or_else(|| {
        ConfigError::invalid(key("parent_interface"), "required: the host interface the sub-interfaces hang off")
    })?;
    if parent_interface.len() > 15
        || parent_interface.contains(['/', ' ', '\t', '\n', ':'])
        || parent_interface == "."
        || parent_interface == ".."
    {
        return Err(ConfigError::invalid(
            key("parent_interface"),
            format!("{parent_interface:?} is not an interface name"),
        ));
    }
    Ok(ProviderConfig { url, ca_file, client_cert, http_request_timeout, parent_interface })
}

/// How each of `ranges` (built from `raw`: `range`, then `ipRanges` in order) is placed. Without a provider every
/// range is ordinary, and an `ipRanges` entry naming `node_name` or `iaas_provider` is refused. With one, `range`
/// and every entry are provider-backed global pools unless the entry says `"iaas_provider": false` (ordinary) or
/// names a `node_name` (a node-warm pool bound to that node); an IPv4 entry naming a `paired_range` (IPv6, the
/// range right after it in `ranges`) is a paired dual-stack candidate. (No two ranges share a pool: `ranges`
/// refuses it.)
pub(super) fn placements(raw: &RawIpam<'_>, ranges: &[IpRange], provider: bool) -> Result<Vec<Placement>, ConfigError> {
    let mut out = Vec::with_capacity(ranges.len());
    if raw.range.is_some() {
        out.push(if provider { Placement::Provider(Mode::Global) } else { Placement::Ordinary });
    }
    let entries = raw.ip_ranges.as_ref().map(|l| (l.value.as_slice(), l.origin));
    for entry in entries.map(|(e, _)| e).unwrap_or_default() {
        let origin = entries.expect("entries come from the list").1;
        let key = |k: &str| origin.key(&format!("ipRanges[{}].{k}", entry.index));
        let placement = match (provider, entry.iaas_provider, &entry.node_name) {
            (false, Some(_), _) => {
                return Err(ConfigError::invalid(key("iaas_provider"), "only with ipam.iaas_provider"));
            }
            (false, None, Some(_)) => {
                return Err(ConfigError::invalid(key("node_name"), "only with ipam.iaas_provider (a node-warm pool)"));
            }
            (false, None, None) => Placement::Ordinary,
            (true, Some(false), Some(_)) => {
                return Err(ConfigError::invalid(
                    key("node_name"),
                    "a node-warm pool is provider-backed: not with \"iaas_provider\": false",
                ));
            }
            (true, Some(false), None) => Placement::Ordinary,
            (true, _, Some(node)) => Placement::Provider(Mode::NodeWarm { node: node.clone() }),
            (true, _, None) => Placement::Provider(Mode::Global),
        };
        let Some(_) = &entry.paired_range else {
            out.push(placement);
            continue;
        };
        let refuse = |why: &str| Err(ConfigError::invalid(key("paired_range"), why));
        match placement {
            _ if !provider => return refuse("only with ipam.iaas_provider (paired dual-stack sub-interfaces)"),
            Placement::Ordinary => {
                return refuse("a paired range is provider-backed: not with \"iaas_provider\": false");
            }
            Placement::Provider(Mode::NodeWarm { .. }) => {
                return refuse("not with node_name: paired sub-interfaces are placed in global pools only");
            }
            _ => {}
        }
        let (v4, v6) = (out.len(), out.len() + 1);
        match (ranges.get(v4).map(|r| r.cidr().addr()), ranges.get(v6).map(|r| r.cidr().addr())) {
            (Some(a), Some(b)) if a.is_ipv4() && b.is_ipv6() => {}
            _ => return refuse("pairs an IPv4 range (range) with an IPv6 one (paired_range)"),
        }
        out.push(Placement::Paired { v6 });
        out.push(Placement::PairedV6 { v4 });
    }
    if out.len() != ranges.len() {
        // build() refuses an entry it cannot read, so this is a bug, not a config mistake
        return Err(ConfigError::invalid("ipam.ipRanges", "internal: ranges and their placements differ in number"));
    }
    Ok(out)
}

/// `text` as a Go duration that is > 0, below [`MAX_HTTP_REQUEST_TIMEOUT`] and below `budget`.
fn request_timeout(text: &str, budget: Duration) -> Result<GoDuration, String> {
    let d = duration::parse(text).map_err(|e| e.to_string())?;
    if d.negative || d.value.is_zero() {
        return Err(format!("{text:?} must be greater than 0"));
    }
    if d.value >= MAX_HTTP_REQUEST_TIMEOUT {
        return Err(format!("{text:?} must be less than 2m"));
    }
    if d.value >= budget {
        return Err(format!(
            "{text:?} must be less than the invocation's time budget ({}s, ipam.timeout_seconds)",
            budget.as_secs_f64()
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codes::Code;

    const BUDGET: Duration = Duration::from_secs(90);

    fn section(extra: Value) -> Map<String, Value> {
        let mut base = json!({"url": "https://provider.example:8443", "ca_file": "/etc/provider/ca.pem", "parent_interface": "eth1"});
        base.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        base.as_object().unwrap().clone()
    }

    #[test]
    fn a_minimal_section_takes_the_default_timeout() {
        let c = parse(&section(json!({})), BUDGET).unwrap();
        assert_eq!(c.http_request_timeout.value, Duration::from_secs(50));
        assert_eq!(c.http_request_timeout.text, "50s");
        assert_eq!(c.url.host(), Some("provider.example"));
        assert_eq!(c.parent_interface, "eth1");
        assert!(c.client_cert.is_none());
    }

    #[test]
    fn every_invalid_http_request_timeout_is_refused_naming_the_key() {
        for (value, says) in [
            (json!("50"), "missing unit"),
            (json!("fifty seconds"), "not a Go duration"),
            (json!("5sec"), "unknown unit"),
            (json!("0"), "must be greater than 0"),
            (json!("0s"), "must be greater than 0"),
            (json!("-5s"), "must be greater than 0"),
            (json!("2m"), "must be less than 2m"),
            (json!("1h"), "must be less than 2m"),
            (json!("1m30s"), "must be less than the invocation's time budget (90s"),
            (json!("95s"), "must be less than the invocation's time budget"),
        ] {
            let err = parse(&section(json!({"http_request_timeout": value})), BUDGET).unwrap_err();
            assert_eq!(err.code(), Code::InvalidConfig, "{value}");
            let text = err.to_string();
            assert!(text.starts_with("ipam.iaas_provider.http_request_timeout: "), "{text}");
            assert!(text.contains(says), "{value}: {text}");
        }
        let err = parse(&section(json!({"http_request_timeout": 50})), BUDGET).unwrap_err();
        assert_eq!(err.code(), Code::Decode);
        assert!(err.to_string().starts_with("ipam.iaas_provider.http_request_timeout: expected a string"), "{err}");
        assert!(parse(&section(json!({"http_request_timeout": "1m29s"})), BUDGET).is_ok());
        assert!(parse(&section(json!({"http_request_timeout": "20s"})), Duration::from_secs(20)).is_err());
    }

    #[test]
    fn the_other_keys_are_checked() {
        let refused = |extra: Value, key: &str| {
            let err = parse(&section(extra.clone()), BUDGET).unwrap_err().to_string();
            assert!(err.contains(&format!("ipam.iaas_provider.{key}")), "{extra}: {err}");
        };
        refused(json!({"url": "http://provider.example"}), "url");
        refused(json!({"url": "https://provider.example/v1/apis"}), "url");
        refused(json!({"url": "not a url"}), "url");
        refused(json!({"url": null}), "url");
        refused(json!({"ca_file": ""}), "ca_file");
        refused(json!({"client_cert_file": "/c.pem"}), "client_key_file");
        refused(json!({"client_key_file": "/k.pem"}), "client_cert_file");
        refused(json!({"parent_interface": "eth0/1"}), "parent_interface");
        refused(json!({"parent_interface": "a-name-longer-than-15"}), "parent_interface");
        refused(json!({"httpRequestTimeout": "50s"}), "httpRequestTimeout");
        let both = parse(&section(json!({"client_cert_file": "/c.pem", "client_key_file": "/k.pem"})), BUDGET).unwrap();
        assert_eq!(both.client_cert, Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem"))));
    }
}

/// A provider-backed pool's placement mode, derived from its shape (bound to a node or not) and fixed for its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Bound to one node, where the provider pre-creates sub-interfaces: only those are handed out.
    NodeWarm { node: String },
    /// No node: addresses are placed on demand and their sub-interfaces cached on the node that used them last.
    Global,
}

/// How a range of a config hands out addresses: ordinary, or through the provider in one placement mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// No provider: the range's pool as in every other config.
    Ordinary,
    /// Provider-backed, in this mode.
    Provider(Mode),
    /// A provider-backed IPv4 range (global pool) whose sub-interfaces also carry an address of the IPv6 range at
    /// index `v6` of the config's ranges: both or neither, and the IPv6 one chosen at creation stays with the
    /// sub-interface for its life.
    Paired { v6: usize },
    /// The IPv6 range of a pair: never a candidate of its own; its addresses are taken with their IPv4 partner's.
    PairedV6 { v4: usize },
}

impl Placement {
    /// The candidate class of a range placed so.
    pub fn class(&self) -> Class {
        match self {
            Placement::Ordinary => Class::Ordinary,
            Placement::Provider(_) => Class::Provider,
            Placement::Paired { .. } | Placement::PairedV6 { .. } => Class::PairedProvider,
        }
    }

    /// Whether the range is an interface's candidate of its own (the IPv6 half of a pair is not).
    pub fn is_candidate(&self) -> bool {
        !matches!(self, Placement::PairedV6 { .. })
    }

    /// The node the range's pool is bound to: `Some` for a node-warm pool only.
    pub fn bound_node(&self) -> Option<&str> {
        match self {
            Placement::Provider(Mode::NodeWarm { node }) => Some(node),
            _ => None,
        }
    }
}

/// The class of a candidate range: an interface's candidates are narrowed to the highest class present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// A range without a provider.
    Ordinary,
    /// A provider-backed range (node-warm or global).
    Provider,
    /// A paired dual-stack provider range: both families or failure, never a silent single stack.
    PairedProvider,
}
