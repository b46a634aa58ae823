//! Netconf + flat file + `CNI_ARGS` + `runtimeConfig` -> a validated [`IpamConfig`], whose [`Mode`] says how its
//! addresses are kept.
//!
//! The keys and their meaning are Whereabouts' (`pkg/config/config.go`, `pkg/types/types.go` of v0.9.2), so a
//! NetworkAttachmentDefinition written for Whereabouts works unchanged. Where Whereabouts silently drops a mistake
//! (an unknown or camelCase key, a start outside the range, an unparsable bound or exclude), the config is refused
//! with a message that names the key and a CNI error code ([`ConfigError::code`]).
//!
//! ```
//! use hereabouts_ipam::config::{Input, load_with_paths};
//!
//! let stdin = br#"{"cniVersion": "1.0.0", "name": "net1", "type": "macvlan",
//!                  "ipam": {"type": "whereabouts", "range": "10.0.0.0/24", "rangeStart": "10.0.0.10"}}"#;
//! let err = load_with_paths(&Input { stdin, cni_args: "" }, &[]).unwrap_err();
//! assert_eq!(err.code(), 2);
//! assert_eq!(err.to_string(), r#"ipam.rangeStart: unknown key (did you mean "range_start"?)"#);
//! ```
//!
//! DEL and GC read the same config with [`load_for_release`] instead, which never fails: they must release what ADD
//! took even from a config ADD would now refuse, since the runtime replays the config it cached at ADD time.
//!
//! Besides reading the flat file, nothing here does I/O.

mod cni_args;
pub mod duration;
mod error;
mod field;
mod flatfile;
mod json;
mod mode;
mod netconf;
mod plugins;
pub mod provider;
mod ranges;
mod release;
#[cfg(test)]
mod release_props;
#[cfg(test)]
mod release_tests;
mod requested;
mod routing;
#[cfg(test)]
mod routing_tests;
mod selection;
#[cfg(test)]
mod selection_tests;
#[cfg(test)]
mod tests;

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::Serialize;

pub use error::{ConfigError, UnknownKey};
pub use flatfile::{DEFAULT_FLAT_FILE_PATHS, NODE_NAME_FILE};
pub use mode::{Kube, Mode, PersistentIps, Pools, Provider, ReleaseKube, ReleaseMode, Slices};
pub use netconf::{IGNORED_KEYS, IPAM_KEYS};
pub use plugins::ipam_plugins;
pub use release::{ReleaseConfig, load_for_release, load_for_release_with_paths};
pub use routing::{
    Claiming, DEFAULT_BIRD_SETTLE, DEFAULT_BIRD_SOCKET, DEFAULT_PROPAGATION, DEFAULT_REQUESTED_RETRY,
    DEFAULT_ROUTE_PROTOCOL, DEFAULT_ROUTE_TABLE, DEFAULT_STATE_DIR, Daemon, HostRoutes, KEYS as ROUTING_KEYS,
    NODE_KEYS, NodeRouting, RouteTable, node_routing,
};
pub use selection::{RANGES_ANNOTATION, RangeFacts, RangeSelection};

use crate::range::IpRange;
use json::Problems;

/// The `cniVersion`s this plugin speaks.
pub use crate::codes::SUPPORTED_VERSIONS as SUPPORTED_CNI_VERSIONS;

/// The values of `ipam.type` this plugin answers to: its own name, and Whereabouts' (it is a drop-in).
pub const IPAM_TYPES: [&str; 2] = ["hereabouts", "whereabouts"];

/// The time budget of one invocation when `timeout_seconds` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);

/// The longest `timeout_seconds` allowed: a runtime gives up on a plugin well before, and the reconciler takes
/// a claim older than [`crate::ipam::SETTLE_TIME`] for abandoned.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(180);

/// What the CNI binary passes in: the stdin bytes and the environment values it read.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The network config, as read from stdin.
    pub stdin: &'a [u8],
    /// `CNI_ARGS`, may be empty.
    pub cni_args: &'a str,
}

/// The validated configuration of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamConfig {
    /// Top-level `cniVersion` of the netconf, one of [`SUPPORTED_CNI_VERSIONS`].
    pub cni_version: String,
    /// Top-level `name`.
    pub name: String,
    /// `ipam.network_name`, `""` when absent: the prefix of pool and reservation names.
    pub network_name: String,
    /// `range` first (if set), then `ipRanges` in order. Empty only when `addresses` is not. The gateway is already
    /// excluded from every range that contains it.
    pub ranges: Vec<IpRange>,
    /// `ipam.gateway`, returned with every address taken from a range; never handed out.
    pub gateway: Option<IpAddr>,
    /// `ipam.routes`.
    pub routes: Vec<Route>,
    /// `ipam.dns`, `None` when absent or empty.
    pub dns: Option<Dns>,
    /// `ipam.addresses`: static addresses returned as they are, with `GATEWAY=` from `CNI_ARGS` applied.
    pub addresses: Vec<StaticAddress>,
    /// `ipam.log_file`.
    pub log_file: Option<PathBuf>,
    /// `ipam.log_level`, default [`LogLevel::Debug`] as for Whereabouts.
    pub log_level: LogLevel,
    /// Exact addresses asked for: `runtimeConfig.ips`, then `CNI_ARGS` `IP=`, without repeats. Each is a usable
    /// address of one of `ranges`.
    pub requested: Vec<IpAddr>,
    /// The pod, from `CNI_ARGS`; see [`IpamConfig::require_pod`].
    pub pod: PodRef,
    /// `ipam.reconciler_cron_expression`, not checked here.
    pub reconciler_cron_expression: Option<String>,
    /// `ipam.timeout_seconds` (ours), default [`DEFAULT_TIMEOUT`]: the time budget of the invocation.
    pub timeout: Duration,
    /// How the addresses are kept: the mode, with exactly its own settings.
    pub mode: Mode,
    /// Keys accepted and ignored (legacy Whereabouts keys, flat-file keys without effect, `CNI_ARGS` let through by
    /// `IgnoreUnknown`), named as in messages, for a debug log. Values are left out (`etcd_password`).
    pub ignored: Vec<String>,
    /// The flat file whose values were used, if any.
    pub flat_file: Option<PathBuf>,
}

/// A route returned with the addresses; serialises as a CNI result route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Route {
    /// `dst`: the destination network (host bits clear).
    pub dst: IpNet,
    /// `gw`: the next hop; absent means the result's gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// `mtu` (CNI 1.1 route attribute).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// `advmss` (CNI 1.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// `priority` (CNI 1.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// `table` (CNI 1.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// `scope` (CNI 1.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

/// DNS settings returned with the addresses; serialises as CNI's DNS type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dns {
    /// `nameservers`: IP addresses (a link-local one may carry a `%zone`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// `domain`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// `search`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// `options`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// One entry of Whereabouts' `addresses`: returned as it is, never allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticAddress {
    /// The address with its prefix, e.g. `10.10.0.5/24` (host bits kept).
    pub address: IpNet,
    /// The gateway to return with it.
    pub gateway: Option<IpAddr>,
}

/// The pod an invocation is for, from `CNI_ARGS`. Displays as Whereabouts' podref, `namespace/name`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRef {
    /// `K8S_POD_NAMESPACE`, `""` when absent.
    pub namespace: String,
    /// `K8S_POD_NAME`, `""` when absent.
    pub name: String,
    /// `K8S_POD_UID`.
    pub uid: Option<String>,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Whereabouts' log levels (`pkg/logging`), least to most verbose, plus `info`. Parsed case-insensitively.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// `panic`.
    Panic,
    /// `error`.
    Error,
    /// `info` (not a Whereabouts level, which ignores it and stays at `debug`).
    Info,
    /// `verbose`.
    Verbose,
    /// `debug`, the default (Whereabouts' `logging.init`).
    #[default]
    Debug,
}

impl LogLevel {
    /// `debug`, `verbose`, `info`, `error` or `panic`, in any case.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "panic" => Some(Self::Panic),
            "error" => Some(Self::Error),
            "info" => Some(Self::Info),
            "verbose" => Some(Self::Verbose),
            "debug" => Some(Self::Debug),
            _ => None,
        }
    }

    /// The name, as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Panic => "panic",
            Self::Error => "error",
            Self::Info => "info",
            Self::Verbose => "verbose",
            Self::Debug => "debug",
        }
    }

    /// The matching `tracing` level filter: `panic` and `error` -> `error`, `info` and `verbose` -> `info`,
    /// `debug` -> `debug`.
    pub fn tracing_filter(self) -> &'static str {
        match self {
            Self::Panic | Self::Error => "error",
            Self::Info | Self::Verbose => "info",
            Self::Debug => "debug",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl IpamConfig {
    /// The requested address that range `index` gives, if any: each requested address goes to the first range
    /// that can hand it out (ranges may overlap) and gives no other one.
    pub fn requested_for(&self, index: usize) -> Option<IpAddr> {
        requested::by_range(&self.ranges, &self.requested).ok()?.get(index).copied().flatten()
    }

    /// ADD needs the pod (Whereabouts records `namespace/name` with every allocation): refuses, with code 4, a
    /// config whose `CNI_ARGS` lack `K8S_POD_NAMESPACE` or `K8S_POD_NAME`.
    pub fn require_pod(&self) -> Result<(), ConfigError> {
        let missing: Vec<&str> = [("K8S_POD_NAMESPACE", &self.pod.namespace), ("K8S_POD_NAME", &self.pod.name)]
            .into_iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| k)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(ConfigError::CniArgs(format!("{} missing or empty: ADD needs the pod", missing.join(" and "))))
    }
}

/// Loads the config of one invocation, with the flat file looked for in [`DEFAULT_FLAT_FILE_PATHS`].
pub fn load(input: &Input<'_>) -> Result<IpamConfig, ConfigError> {
    let paths: Vec<PathBuf> = DEFAULT_FLAT_FILE_PATHS.iter().map(PathBuf::from).collect();
    load_with_paths(input, &paths)
}

/// Same as [`load`], with the flat-file search paths given explicitly (tests). `ipam.configuration_path`, when
/// set, is used instead of them.
pub fn load_with_paths(input: &Input<'_>, flat_file_paths: &[PathBuf]) -> Result<IpamConfig, ConfigError> {
    let value: serde_json::Value = serde_json::from_slice(input.stdin)
        .map_err(|source| ConfigError::NotJson { key: "stdin".to_string(), source })?;
    let net = netconf::parse_netconf(&value)?;
    let inline = netconf::parse_ipam(net.ipam, field::Origin::Inline, &mut Problems::strict())?;
    netconf::check_type(&inline)?;
    let args = cni_args::parse(input.cni_args)?;
    let flat_file = flatfile::locate(inline.configuration_path.as_ref(), flat_file_paths)?;
    let raw = match &flat_file {
        Some(path) => flatfile::merge(inline, flatfile::read(path, &mut Problems::strict())?),
        None => inline,
    };
    let mut ranges = ranges::build(&raw)?;
    if let Some(gw) = &raw.gateway {
        ranges::apply_gateway(&mut ranges, gw)?;
    }
    let mut addresses = raw.addresses.as_ref().map(|a| a.value.clone()).unwrap_or_default();
    cni_args::apply_gateways(&mut addresses, &args.gateways)?;
    if ranges.is_empty() && addresses.is_empty() {
        return Err(ConfigError::invalid(
            "ipam.range",
            "no range: set ipam.range or ipam.ipRanges (or ipam.addresses for static addresses only)",
        ));
    }
    if let Some(a) = &raw.addresses {
        ranges::check_static(a, &ranges)?;
    }
    let requested = requested::resolve(&net.runtime_ips, &args.ips, &ranges)?;
    let timeout = raw.timeout.as_ref().map_or(DEFAULT_TIMEOUT, |f| f.value);
    let mode = Mode::build(&raw, &ranges, timeout)?.with_persistent_ips(net.persistent_ips)?;
    if matches!(&mode, Mode::Pools(p) if p.persistent_ips.reference.is_some()) && !requested.is_empty() {
        return Err(ConfigError::invalid(
            "args.cni.ipam-claim-reference",
            "not with addresses asked for (runtimeConfig.ips, CNI_ARGS IP=): the IPAMClaim decides the addresses",
        ));
    }
    let mut ignored = raw.ignored;
    ignored.extend(args.ignored);
    Ok(IpamConfig {
        cni_version: net.cni_version,
        name: net.name,
        network_name: raw.network_name.map(|f| f.value).unwrap_or_default(),
        ranges,
        gateway: raw.gateway.map(|f| f.value),
        routes: raw.routes.map(|f| f.value).unwrap_or_default(),
        dns: raw.dns.into_dns(),
        addresses,
        log_file: raw.log_file.map(|f| f.value),
        log_level: raw.log_level.map(|f| f.value).unwrap_or_default(),
        requested,
        pod: PodRef { namespace: args.pod_namespace, name: args.pod_name, uid: args.pod_uid },
        reconciler_cron_expression: raw.reconciler_cron_expression.map(|f| f.value),
        timeout,
        mode,
        ignored,
        flat_file,
    })
}
