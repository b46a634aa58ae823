//! The flat file: an `ipam` object on the node's disk whose values fill what the inline config leaves empty.
//!
//! Whereabouts (`config.GetFlatIPAM`) looks at `configuration_path` first, then
//! `/etc/kubernetes/cni/net.d/whereabouts.d/whereabouts.conf`, `/etc/cni/net.d/whereabouts.d/whereabouts.conf`,
//! `/host/etc/cni/net.d/whereabouts.d/whereabouts.conf`, and reads the first that exists. The file is the `ipam`
//! object itself (not nested), with the same keys. `config.LoadIPAMConfig` then runs `mergo.Merge(&n, flatipam)`:
//! every field the inline config leaves at its zero value (`""`, empty list, absent) is taken from the file, struct
//! fields (`kubernetes`, `dns`) key by key; `enable_overlapping_ranges` is saved before and restored after the
//! merge, so only the inline value (default `true`) counts.
//!
//! Differences here: `/etc/cni/net.d/hereabouts.d/hereabouts.conf` is looked at first; a `configuration_path`
//! that does not exist is refused instead of skipped; no file at all is fine (Whereabouts fails with "config file
//! not found"); unknown keys in the file are refused.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::error::ConfigError;
use super::field::{Origin, Sourced};
use super::json::{Problems, wrong_type};
use super::netconf::{RawDns, RawIpam, parse_ipam};

/// Where the flat file is looked for when `configuration_path` is not set, in this order.
pub const DEFAULT_FLAT_FILE_PATHS: [&str; 4] = [
    "/etc/cni/net.d/hereabouts.d/hereabouts.conf",
    "/etc/kubernetes/cni/net.d/whereabouts.d/whereabouts.conf",
    "/etc/cni/net.d/whereabouts.d/whereabouts.conf",
    "/host/etc/cni/net.d/whereabouts.d/whereabouts.conf",
];

/// The file beside the flat file holding the node's name (`spec.nodeName`), which install-cni writes from the
/// downward API; Whereabouts reads the same `<configuration directory>/nodename`.
pub const NODE_NAME_FILE: &str = "nodename";

/// The flat file to read: `configuration_path` (which must exist), else the first of `paths` that exists.
pub(super) fn locate(
    configured: Option<&Sourced<'_, PathBuf>>,
    paths: &[PathBuf],
) -> Result<Option<PathBuf>, ConfigError> {
    if let Some(c) = configured {
        let key = c.origin.key("configuration_path");
        return match std::fs::metadata(&c.value) {
            Ok(_) => Ok(Some(c.value.clone())),
            Err(e) if absent(&e) => Err(ConfigError::invalid(key, format!("{} does not exist", c.value.display()))),
            Err(source) => Err(ConfigError::Io { key, path: c.value.clone(), source }),
        };
    }
    for path in paths {
        match std::fs::metadata(path) {
            Ok(_) => return Ok(Some(path.clone())),
            Err(e) if absent(&e) => {}
            Err(source) => return Err(ConfigError::Io { key: "flat file".to_string(), path: path.clone(), source }),
        }
    }
    Ok(None)
}

fn absent(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory)
}

/// Reads and checks the flat file at `path`. Lenient `problems` pass over mistakes in its keys, but not a file that
/// cannot be read or is not a JSON object.
pub(super) fn read<'p>(path: &'p Path, problems: &mut Problems) -> Result<RawIpam<'p>, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Io {
        key: "flat file".to_string(),
        path: path.to_path_buf(),
        source,
    })?;
    let key = format!("flat file {}", path.display());
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|source| ConfigError::NotJson { key: key.clone(), source })?;
    let serde_json::Value::Object(map) = &value else { return Err(wrong_type(&key, "a JSON object", &value)) };
    parse_ipam(map, Origin::FlatFile(path), problems)
}

/// Whereabouts' merge: the inline value where there is one, else the flat file's.
pub(super) fn merge<'p>(inline: RawIpam<'p>, flat: RawIpam<'p>) -> RawIpam<'p> {
    let mut ignored = inline.ignored;
    ignored.extend(flat.ignored);
    let without_effect = [
        (flat.type_.as_ref().map(|f| f.origin), "type", "the inline ipam.type decides"),
        (flat.configuration_path.as_ref().map(|f| f.origin), "configuration_path", "only the inline one is followed"),
        (
            flat.overlapping_ranges.as_ref().map(|f| f.origin),
            "enable_overlapping_ranges",
            "as for Whereabouts, only the inline value counts (default true)",
        ),
    ];
    for (origin, key, why) in without_effect {
        if let Some(origin) = origin {
            ignored.push(format!("{}: {why}", origin.key(key)));
        }
    }
    RawIpam {
        type_: inline.type_,
        range: inline.range.or(flat.range),
        range_start: inline.range_start.or(flat.range_start),
        range_end: inline.range_end.or(flat.range_end),
        exclude: inline.exclude.or(flat.exclude),
        ip_ranges: inline.ip_ranges.or(flat.ip_ranges),
        gateway: inline.gateway.or(flat.gateway),
        routes: inline.routes.or(flat.routes),
        dns: RawDns {
            nameservers: inline.dns.nameservers.or(flat.dns.nameservers),
            domain: inline.dns.domain.or(flat.dns.domain),
            search: inline.dns.search.or(flat.dns.search),
            options: inline.dns.options.or(flat.dns.options),
        },
        addresses: inline.addresses.or(flat.addresses),
        network_name: inline.network_name.or(flat.network_name),
        overlapping_ranges: inline.overlapping_ranges,
        kubeconfig: inline.kubeconfig.or(flat.kubeconfig),
        configuration_path: inline.configuration_path,
        log_file: inline.log_file.or(flat.log_file),
        log_level: inline.log_level.or(flat.log_level),
        node_slice_size: inline.node_slice_size.or(flat.node_slice_size),
        min_node_slice_size: inline.min_node_slice_size.or(flat.min_node_slice_size),
        reconciler_cron_expression: inline.reconciler_cron_expression.or(flat.reconciler_cron_expression),
        strategy: inline.strategy.or(flat.strategy),
        timeout: inline.timeout.or(flat.timeout),
        iaas_provider: inline.iaas_provider.or(flat.iaas_provider),
        pod_ranges: inline.pod_ranges.or(flat.pod_ranges),
        reuse_cooldown: inline.reuse_cooldown.or(flat.reuse_cooldown),
        sticky_statefulset: inline.sticky_statefulset.or(flat.sticky_statefulset),
        warm_addresses: inline.warm_addresses.or(flat.warm_addresses),
        max_slices_per_node: inline.max_slices_per_node.or(flat.max_slices_per_node),
        enable_l3: inline.enable_l3.or(flat.enable_l3),
        preferred_ip_annotation: inline.preferred_ip_annotation.or(flat.preferred_ip_annotation),
        large_offsets: inline.large_offsets.or(flat.large_offsets),
        routing: inline.routing.merge(flat.routing),
        ignored,
    }
}
