//! The config as DEL and GC read it: leniently, because they cannot be told to use a corrected one.
//!
//! Multus and the container runtimes replay to DEL the config they cached at ADD time, so correcting a
//! NetworkAttachmentDefinition does not reach it, and a DEL that fails leaves the pod Terminating for good. A
//! config the strict loader refuses (one that upstream Whereabouts accepted and ADDed with, or one written before a
//! check was added) must still release what its ranges hold. So [`load_for_release`] never fails: it reads what
//! it can with the strict loader's per-key rules and reports everything it passed over in
//! [`ReleaseConfig::warnings`]. Whatever the strict loader accepts is read exactly as it reads it.
//!
//! ```
//! use hereabouts_ipam::config::{Input, load_for_release_with_paths};
//!
//! let stdin = br#"{"cniVersion": "0.2.0", "name": "net1", "type": "macvlan",
//!                  "ipam": {"type": "whereabouts", "range": "10.0.0.0/24", "rangeStart": "10.0.0.10"}}"#;
//! let c = load_for_release_with_paths(&Input { stdin, cni_args: "" }, &[]);
//! assert_eq!(c.ranges[0].cidr().to_string(), "10.0.0.0/24");
//! assert!(c.warnings.iter().any(|w| w.starts_with("ipam.rangeStart: unknown key")));
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use super::field::Origin;
use super::json::{Problems, object, string};
use super::netconf::RawIpam;
use super::{
    ConfigError, DEFAULT_FLAT_FILE_PATHS, DEFAULT_TIMEOUT, Input, IpamConfig, LogLevel, PodRef, ReleaseMode, cni_args,
    flatfile, load_with_paths, netconf, ranges,
};
use crate::range::IpRange;

/// What DEL and GC need of the config, read leniently so that a release never fails on a config ADD would refuse.
///
/// When the strict loader accepts the config, every field is what it says and `warnings` is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseConfig {
    /// Top-level `cniVersion` as given, `""` when absent or not a string: only used to format the reply.
    pub cni_version: String,
    /// Top-level `name`, `""` when absent: GC matches entries by it.
    pub name: String,
    /// `ipam.network_name`, `""` when absent: the prefix of pool and reservation names.
    pub network_name: String,
    /// Every range whose CIDR could be read: `range`, then `ipRanges` in order. A range the strict rules refuse is
    /// its whole CIDR, which is enough to name its pool and map offsets to addresses.
    pub ranges: Vec<IpRange>,
    /// The flat file read, if any.
    pub flat_file: Option<PathBuf>,
    /// `ipam.log_file`.
    pub log_file: Option<PathBuf>,
    /// `ipam.log_level`, default [`LogLevel::Debug`].
    pub log_level: LogLevel,
    /// `ipam.timeout_seconds`, default [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// The pod, from `CNI_ARGS` when they could be read; otherwise unknown (empty).
    pub pod: PodRef,
    /// Where ADD kept what it wrote: the mode, as far as DEL and GC need it.
    pub mode: ReleaseMode,
    /// Every problem that was passed over, as a sentence naming the key, for a warning log: first why the strict
    /// loader refused the config (followed by what was done about it, when that is more than leaving the key out).
    /// Empty when it accepted it.
    pub warnings: Vec<String>,
}

impl From<IpamConfig> for ReleaseConfig {
    fn from(c: IpamConfig) -> Self {
        Self {
            cni_version: c.cni_version,
            name: c.name,
            network_name: c.network_name,
            ranges: c.ranges,
            mode: c.mode.release_mode(),
            flat_file: c.flat_file,
            log_file: c.log_file,
            log_level: c.log_level,
            timeout: c.timeout,
            pod: c.pod,
            warnings: Vec::new(),
        }
    }
}

/// Loads the config of a DEL or GC, with the flat file looked for in [`DEFAULT_FLAT_FILE_PATHS`]. Never fails.
pub fn load_for_release(input: &Input<'_>) -> ReleaseConfig {
    let paths: Vec<PathBuf> = DEFAULT_FLAT_FILE_PATHS.iter().map(PathBuf::from).collect();
    load_for_release_with_paths(input, &paths)
}

/// Same as [`load_for_release`], with the flat-file search paths given explicitly (tests).
pub fn load_for_release_with_paths(input: &Input<'_>, flat_file_paths: &[PathBuf]) -> ReleaseConfig {
    match load_with_paths(input, flat_file_paths) {
        Ok(c) => c.into(),
        Err(refusal) => lenient(input, flat_file_paths, &refusal),
    }
}

/// The warnings, each once: the lenient pass meets the strict refusal again, in the same words, sometimes followed
/// by `; ` and what it did about it, which then completes the earlier warning in its place.
#[derive(Debug)]
struct Warnings(Vec<String>);

impl Warnings {
    fn push(&mut self, w: String) {
        let earlier =
            self.0.iter_mut().find(|e| w == **e || w.strip_prefix(e.as_str()).is_some_and(|r| r.starts_with("; ")));
        match earlier {
            Some(e) => *e = w,
            None => self.0.push(w),
        }
    }

    fn extend(&mut self, ws: impl IntoIterator<Item = String>) {
        for w in ws {
            self.push(w);
        }
    }
}

fn lenient(input: &Input<'_>, flat_file_paths: &[PathBuf], refusal: &ConfigError) -> ReleaseConfig {
    let mut warnings = Warnings(vec![refusal.to_string()]);
    let pod = match cni_args::parse_for_release(input.cni_args) {
        Ok(args) => {
            warnings.extend(args.ignored.iter().map(|k| format!("{k}: unknown key, ignored")));
            PodRef { namespace: args.pod_namespace, name: args.pod_name, uid: args.pod_uid }
        }
        Err(e) => {
            warnings.push(format!("{e}; the pod is unknown"));
            PodRef::default()
        }
    };
    let mut out = ReleaseConfig {
        cni_version: String::new(),
        name: String::new(),
        network_name: String::new(),
        ranges: Vec::new(),
        mode: ReleaseMode::default(),
        flat_file: None,
        log_file: None,
        log_level: LogLevel::default(),
        timeout: DEFAULT_TIMEOUT,
        pod,
        warnings: Vec::new(),
    };
    if let Some(top) = top_level(input.stdin, &mut warnings) {
        // Any version: it only shapes the reply, and a runtime replays whatever it sent to ADD.
        out.cni_version = read(&top, "cniVersion", string, &mut warnings).unwrap_or_default();
        out.name = read(&top, "name", string, &mut warnings).unwrap_or_else(|| {
            warnings.push(ConfigError::invalid("name", "missing: the CNI spec requires the network name").to_string());
            String::new()
        });
        match read(&top, "ipam", object, &mut warnings) {
            Some(ipam) => read_ipam(ipam, flat_file_paths, &mut out, &mut warnings),
            None if matches!(top.get("ipam"), None | Some(Value::Null)) => {
                warnings.push(ConfigError::invalid("ipam", "missing: this is an IPAM plugin").to_string());
            }
            None => {}
        }
    }
    out.warnings = warnings.0;
    out
}

/// Stdin as a JSON object; `None` (with a warning) when it is not one.
fn top_level(stdin: &[u8], warnings: &mut Warnings) -> Option<Map<String, Value>> {
    match serde_json::from_slice::<Value>(stdin) {
        Ok(Value::Object(top)) => Some(top),
        Ok(other) => {
            warnings.push(super::json::wrong_type("stdin", "a JSON object", &other).to_string());
            None
        }
        Err(source) => {
            warnings.push(ConfigError::NotJson { key: "stdin".to_string(), source }.to_string());
            None
        }
    }
}

/// A top-level key read with `how`; absent, `null` or of the wrong type is `None`, the last with a warning.
fn read<'v, T>(
    top: &'v Map<String, Value>,
    key: &str,
    how: impl Fn(&'v Value, &str) -> Result<Option<T>, ConfigError>,
    warnings: &mut Warnings,
) -> Option<T> {
    let v = top.get(key)?;
    how(v, key).unwrap_or_else(|e| {
        warnings.push(e.to_string());
        None
    })
}

fn read_ipam(ipam: &Map<String, Value>, flat_file_paths: &[PathBuf], out: &mut ReleaseConfig, warnings: &mut Warnings) {
    let mut problems = Problems::lenient();
    let inline = parse_or_empty(netconf::parse_ipam(ipam, Origin::Inline, &mut problems), warnings);
    warnings.extend(std::mem::take(&mut problems.warnings));
    if let Err(e) = netconf::check_type(&inline) {
        warnings.push(e.to_string());
    }
    let flat_file = locate(&inline, flat_file_paths, warnings);
    out.flat_file.clone_from(&flat_file);
    let raw = match &flat_file {
        Some(path) => match flatfile::read(path, &mut problems) {
            Ok(flat) => flatfile::merge(inline, flat),
            Err(e) => {
                warnings.push(format!("{e}; read without the flat file"));
                inline
            }
        },
        None => inline,
    };
    warnings.extend(problems.warnings);
    let mut range_warnings = Vec::new();
    let mut ranges = ranges::build_for_release(&raw, &mut range_warnings);
    warnings.extend(range_warnings);
    // The gateway changes no pool name or offset; it is excluded only so that a range equals the one ADD built.
    if let Some(gw) = &raw.gateway
        && !ranges.is_empty()
        && let Err(e) = ranges::apply_gateway(&mut ranges, gw)
    {
        warnings.push(e.to_string());
    }
    if ranges.is_empty() {
        warnings.push("ipam.range: no range could be read: there is nothing to release".to_string());
    }
    warnings.extend(raw.ignored.iter().map(|k| format!("ignored: {k}")));
    out.mode = ReleaseMode::read(&raw, &ranges);
    out.network_name = raw.network_name.map(|f| f.value).unwrap_or_default();
    out.ranges = ranges;
    out.log_file = raw.log_file.map(|f| f.value);
    out.log_level = raw.log_level.map(|f| f.value).unwrap_or_default();
    out.timeout = raw.timeout.map_or(DEFAULT_TIMEOUT, |f| f.value);
}

/// Lenient parsing notes its mistakes instead of failing; should that ever change, the release still goes on.
fn parse_or_empty<'p>(parsed: Result<RawIpam<'p>, ConfigError>, warnings: &mut Warnings) -> RawIpam<'p> {
    parsed.unwrap_or_else(|e| {
        warnings.push(e.to_string());
        RawIpam::default()
    })
}

/// The flat file, as the strict loader finds it; a `configuration_path` that cannot be used is passed over for the
/// default paths, as Whereabouts does.
fn locate(inline: &RawIpam<'_>, paths: &[PathBuf], warnings: &mut Warnings) -> Option<PathBuf> {
    if let Some(configured) = &inline.configuration_path {
        match flatfile::locate(Some(configured), paths) {
            Ok(found) => return found,
            Err(e) => warnings.push(format!("{e}; the default paths are tried instead")),
        }
    }
    flatfile::locate(None, paths).unwrap_or_else(|e| {
        warnings.push(format!("{e}; read without the flat file"));
        None
    })
}
