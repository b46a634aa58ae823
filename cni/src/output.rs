//! Results in the layout each CNI version expects.

use hereabouts_ipam::Assigned;
use hereabouts_ipam::codes::{NEWEST_VERSION, SUPPORTED_VERSIONS};
use hereabouts_ipam::config::IpamConfig;
use serde_json::{Value, json};

/// The `cniVersion` of the config on stdin, for error messages; the newest supported when it cannot be read.
pub fn requested_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| NEWEST_VERSION.to_string())
}

/// The result of VERSION.
pub fn version_result(stdin: &[u8]) -> String {
    json!({"cniVersion": requested_version(stdin), "supportedVersions": SUPPORTED_VERSIONS}).to_string()
}

/// The result of ADD: the assigned addresses (and the static `addresses`), routes and DNS. Versions before 1.0.0
/// carry a `version` field on each IP.
pub fn add_result(cfg: &IpamConfig, assigned: &[Assigned]) -> String {
    let legacy = !cfg.cni_version.starts_with("1.");
    let ip_entry = |address: String, is_v4: bool, gateway: Option<std::net::IpAddr>| {
        let mut entry = json!({"address": address});
        if legacy {
            entry["version"] = json!(if is_v4 { "4" } else { "6" });
        }
        if let Some(gw) = gateway {
            entry["gateway"] = json!(gw.to_string());
        }
        entry
    };
    let mut ips: Vec<Value> =
        assigned.iter().map(|a| ip_entry(format!("{}/{}", a.ip, a.prefix_len), a.ip.is_ipv4(), a.gateway)).collect();
    ips.extend(cfg.addresses.iter().map(|s| ip_entry(s.address.to_string(), s.address.addr().is_ipv4(), s.gateway)));
    let mut result = json!({"cniVersion": cfg.cni_version, "ips": ips});
    if !cfg.routes.is_empty() {
        result["routes"] = serde_json::to_value(&cfg.routes).unwrap_or(Value::Null);
    }
    if let Some(dns) = &cfg.dns {
        result["dns"] = serde_json::to_value(dns).unwrap_or(Value::Null);
    }
    result.to_string()
}
