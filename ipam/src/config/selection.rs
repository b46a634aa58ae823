//! Ranges chosen per pod: `ipam.pod_ranges`, `ipRanges[].name` and `ipRanges[].node_selector`.
//!
//! Whereabouts gives every attachment one address from *each* range of its config. With `"pod_ranges": true` a pod
//! names the ranges it wants in the annotation [`RANGES_ANNOTATION`], and its namespace's annotation of the same key
//! is the default for pods without one (Calico's `cni.projectcalico.org/ipv4pools` on pods and namespaces). A range
//! with a `node_selector` serves only nodes whose labels it selects. Both are read from the API server by the ADD
//! (and CHECK) of a config that uses them, and by no other.
//!
//! This module parses the keys and makes the choice from what was read; it does no I/O.

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::error::ConfigError;
use super::netconf::RawIpam;
use super::{IpamConfig, requested};
use crate::range::IpRange;
use crate::selector::LabelSelector;

/// The pod (and namespace) annotation that names the ranges an ADD uses, when the config has `"pod_ranges": true`.
///
/// Its value is a JSON list of range references (`["blue", "198.18.2.0/24"]`), a comma-separated list of them
/// (`blue,red`), or a JSON object keyed by network (the netconf `name`) for a pod on several such networks
/// (`{"net1": ["blue"], "net2": ["green"]}`); a network the object does not name falls back to the namespace. A
/// reference is a range's `name` or its CIDR as the pool names it.
pub const RANGES_ANNOTATION: &str = "hereabouts.cni.cncf.io/ranges";

/// How a config chooses among its ranges. The vectors follow [`IpamConfig::ranges`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSelection {
    /// `ipam.pod_ranges`: the pod's (else its namespace's) [`RANGES_ANNOTATION`] chooses.
    pub by_pod: bool,
    /// Each range's `name`, if it has one (`range` never does).
    pub names: Vec<Option<String>>,
    /// Each range's `node_selector`, if it has one.
    pub node_selectors: Vec<Option<LabelSelector>>,
    /// Whether each range keeps a StatefulSet pod's address for its next incarnation (`sticky_statefulset`, per
    /// entry or for the whole config): the ADD reads the pod's owner.
    pub sticky: Vec<bool>,
}

impl RangeSelection {
    /// Whether an ADD must read the node's labels.
    pub fn reads_node(&self) -> bool {
        self.node_selectors.iter().any(Option::is_some)
    }

    /// Whether an ADD reads the pod (its annotation, or its owner for a sticky range).
    pub fn reads_pod(&self) -> bool {
        self.by_pod || self.sticky.contains(&true)
    }

    /// Whether an ADD reads anything of the pod or the node.
    pub fn is_active(&self) -> bool {
        self.reads_pod() || self.reads_node()
    }

    /// Whether a pod annotation of `value` makes the choice for `network` (or is an error to report), so that
    /// the namespace's default need not be read: every form does but an object that does not name the network.
    pub fn decides(value: &str, network: &str) -> bool {
        !matches!(references(value, network), Ok(None))
    }

    /// How a message names range `index`: `blue (198.18.1.0/24)`, or the CIDR alone.
    fn describe(&self, ranges: &[IpRange], index: usize) -> String {
        match self.names.get(index).cloned().flatten() {
            Some(name) => format!("{name} ({})", ranges[index].cidr()),
            None => ranges[index].cidr().to_string(),
        }
    }
}

/// What a choice is made from, as read from the API server for one ADD.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeFacts {
    /// The pod's [`RANGES_ANNOTATION`], if it has one (a pod the server does not know has none).
    pub pod: Option<String>,
    /// Its namespace's, if it has one (read only when the pod has none).
    pub namespace: Option<String>,
    /// The node's labels, when a range has a node selector; `None`: the node was not found.
    pub node_labels: Option<BTreeMap<String, String>>,
    /// The StatefulSet that controls the pod, when a range is sticky and the pod is named as its pods are.
    pub statefulset: Option<String>,
}

/// Reads `pod_ranges` and each entry's `name` and `node_selector`. Not with `iaas_provider`, whose candidates
/// already choose among the ranges.
pub(super) fn parse(raw: &RawIpam<'_>, ranges: &[IpRange], provider: bool) -> Result<RangeSelection, ConfigError> {
    let mut selection =
        RangeSelection { by_pod: raw.pod_ranges.as_ref().is_some_and(|f| f.value), ..Default::default() };
    let sticky_default = raw.sticky_statefulset.as_ref().is_some_and(|f| f.value);
    if provider && let Some(f) = raw.sticky_statefulset.as_ref().filter(|f| f.value) {
        return Err(ConfigError::invalid(
            f.origin.key("sticky_statefulset"),
            "not with ipam.iaas_provider: a provider-backed address belongs to its cloud sub-interface",
        ));
    }
    if raw.range.is_some() {
        selection.names.push(None);
        selection.node_selectors.push(None);
        selection.sticky.push(sticky_default);
    }
    if let Some(list) = &raw.ip_ranges {
        for entry in &list.value {
            let key = |k: &str| list.origin.key(&format!("ipRanges[{}].{k}", entry.index));
            if let Some(name) = &entry.name {
                if !is_range_name(name) {
                    return Err(ConfigError::invalid(
                        key("name"),
                        format!(
                            "{name:?}: 1 to 63 lower-case letters, digits and '-', starting and ending with a letter or digit"
                        ),
                    ));
                }
                if selection.names.iter().flatten().any(|n| n == name) {
                    return Err(ConfigError::invalid(key("name"), format!("{name:?} names an earlier range too")));
                }
            }
            let selector = entry
                .node_selector
                .as_deref()
                .map(|s| LabelSelector::parse(s).map_err(|why| ConfigError::invalid(key("node_selector"), why)))
                .transpose()?;
            if provider && (entry.name.is_some() || selector.is_some()) {
                let which = if selector.is_some() { "node_selector" } else { "name" };
                return Err(ConfigError::invalid(
                    key(which),
                    "not with ipam.iaas_provider: its candidate ranges are chosen by class and node_name",
                ));
            }
            if provider && entry.sticky_statefulset == Some(true) {
                return Err(ConfigError::invalid(
                    key("sticky_statefulset"),
                    "not with ipam.iaas_provider: a provider-backed address belongs to its cloud sub-interface",
                ));
            }
            selection.names.push(entry.name.clone());
            selection.node_selectors.push(selector);
            selection.sticky.push(entry.sticky_statefulset.unwrap_or(sticky_default));
            if entry.paired_range.is_some() {
                selection.names.push(None);
                selection.node_selectors.push(None);
                selection.sticky.push(false);
            }
        }
    }
    if provider && let Some(f) = raw.pod_ranges.as_ref().filter(|f| f.value) {
        return Err(ConfigError::invalid(
            f.origin.key("pod_ranges"),
            "not with ipam.iaas_provider: its candidate ranges are chosen by class and node_name",
        ));
    }
    if raw.node_slice_size.is_some() && selection.sticky.contains(&true) {
        // a pod recreated on another node looks for its entry in that node's slices, not where the old one was
        let key =
            raw.sticky_statefulset.as_ref().map_or("ipam.ipRanges".to_string(), |f| f.origin.key("sticky_statefulset"));
        return Err(ConfigError::invalid(
            key,
            "not with node_slice_size: a StatefulSet's pod recreated on another node would not find its address",
        ));
    }
    debug_assert!(selection.names.len() == ranges.len() || ranges.is_empty());
    Ok(selection)
}

fn is_range_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The references in an annotation value for `network`; `Ok(None)` when an object form does not name it.
fn references(value: &str, network: &str) -> Result<Option<Vec<String>>, String> {
    let text = value.trim();
    let list = match text.chars().next() {
        Some('[') => {
            serde_json::from_str::<Vec<String>>(text).map_err(|e| format!("not a JSON list of strings: {e}"))?
        }
        Some('{') => {
            let by_network = serde_json::from_str::<BTreeMap<String, Vec<String>>>(text)
                .map_err(|e| format!("not a JSON object of lists of strings: {e}"))?;
            match by_network.get(network) {
                Some(list) => list.clone(),
                None => return Ok(None),
            }
        }
        _ => text.split(',').map(|s| s.trim().to_string()).collect(),
    };
    let list: Vec<String> = list.into_iter().map(|s| s.trim().to_string()).collect();
    if list.is_empty() || list.iter().any(String::is_empty) {
        return Err("an empty range reference: name at least one range, and none empty".into());
    }
    Ok(Some(list))
}

impl RangeSelection {
    /// The ranges of `cfg` this ADD of its pod on `node` uses, by index: the pod's annotation (else its namespace's,
    /// else every range), less the ranges whose node selector leaves `node` out. A range the pod names that does
    /// not exist or does not serve the node is an error, as is a node that no range serves; so is a requested
    /// address (`ips`, `IP=`) outside the chosen ranges.
    pub fn choose(&self, cfg: &IpamConfig, node: &str, facts: &RangeFacts) -> Result<Vec<usize>, ConfigError> {
        let pod_source = format!("annotation {RANGES_ANNOTATION} of pod {}", cfg.pod);
        let ns_source = format!("annotation {RANGES_ANNOTATION} of namespace {}", cfg.pod.namespace);
        let mut asked: Option<(String, Vec<String>)> = None;
        if self.by_pod {
            for (source, value) in [(pod_source, &facts.pod), (ns_source, &facts.namespace)] {
                let Some(value) = value else { continue };
                let refs = references(value, &cfg.name).map_err(|why| ConfigError::invalid(&source, why))?;
                if let Some(refs) = refs {
                    asked = Some((source, refs));
                    break;
                }
            }
        }
        let serves = |i: usize| match &self.node_selectors[i] {
            None => true,
            Some(s) => facts.node_labels.as_ref().is_some_and(|labels| s.matches(labels)),
        };
        let all: Vec<String> = (0..cfg.ranges.len()).map(|i| self.describe(&cfg.ranges, i)).collect();
        let keep: Vec<usize> = match &asked {
            Some((source, refs)) => {
                let mut keep = Vec::new();
                for r in refs {
                    let index = self.range_index(&cfg.ranges, r).ok_or_else(|| {
                        ConfigError::invalid(
                            source,
                            format!("{r:?} names no range of network {} (its ranges: {})", cfg.name, all.join(", ")),
                        )
                    })?;
                    if !serves(index) {
                        let selector = self.node_selectors[index].as_ref().map(ToString::to_string).unwrap_or_default();
                        return Err(ConfigError::invalid(
                            source,
                            format!(
                                "range {} serves only nodes matching {selector:?}; {}",
                                all[index],
                                node_verdict(node, facts)
                            ),
                        ));
                    }
                    if !keep.contains(&index) {
                        keep.push(index);
                    }
                }
                keep.sort_unstable();
                keep
            }
            None => (0..cfg.ranges.len()).filter(|i| serves(*i)).collect(),
        };
        if keep.is_empty() {
            return Err(ConfigError::invalid(
                "ipam.ipRanges",
                format!(
                    "no range of network {} serves node {node}: {} (ranges: {})",
                    cfg.name,
                    match facts.node_labels {
                        Some(_) => "it matches the node_selector of none".to_string(),
                        None => format!("every range has a node_selector and {}", node_verdict(node, facts)),
                    },
                    all.join(", ")
                ),
            ));
        }
        let ranges: Vec<IpRange> = keep.iter().map(|i| cfg.ranges[*i].clone()).collect();
        if let Err(ip) = requested::by_range(&ranges, &cfg.requested) {
            let chosen: Vec<String> = keep.iter().map(|i| all[*i].clone()).collect();
            return Err(ConfigError::invalid(
                "requested address",
                format!("{ip} lies in no range chosen for pod {} (chosen: {})", cfg.pod, chosen.join(", ")),
            ));
        }
        Ok(keep)
    }

    /// The selection of the ranges at `keep` only.
    pub fn narrowed(&self, keep: &[usize]) -> RangeSelection {
        RangeSelection {
            by_pod: self.by_pod,
            names: keep.iter().map(|i| self.names[*i].clone()).collect(),
            node_selectors: keep.iter().map(|i| self.node_selectors[*i].clone()).collect(),
            sticky: keep.iter().map(|i| self.sticky[*i]).collect(),
        }
    }

    /// The StatefulSet an entry in `range` (one of `ranges`) records: `owner`, the pod's, when `range` is sticky.
    pub fn sticky_statefulset(&self, ranges: &[IpRange], range: &IpRange, owner: Option<&str>) -> Option<String> {
        let owner = owner?;
        let index = ranges.iter().position(|r| r.cidr() == range.cidr())?;
        self.sticky.get(index).copied().unwrap_or(false).then(|| owner.to_string())
    }

    /// The range a reference names: its `name`, or its CIDR.
    fn range_index(&self, ranges: &[IpRange], reference: &str) -> Option<usize> {
        let by_name = self.names.iter().position(|n| n.as_deref() == Some(reference));
        by_name.or_else(|| {
            let net: IpNet = reference.parse().ok()?;
            ranges.iter().position(|r| r.cidr() == net)
        })
    }
}

impl IpamConfig {
    /// This config with only the ranges at `keep`, and `mode` (narrowed alike by the caller).
    pub fn with_ranges(&self, keep: &[usize], mode: super::Mode) -> IpamConfig {
        IpamConfig { ranges: keep.iter().map(|i| self.ranges[*i].clone()).collect(), mode, ..self.clone() }
    }
}

fn node_verdict(node: &str, facts: &RangeFacts) -> String {
    match facts.node_labels {
        Some(_) => format!("node {node} does not match it"),
        None => format!("node {node} is not a Node the API server knows"),
    }
}
