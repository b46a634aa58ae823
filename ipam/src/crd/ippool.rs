use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The allocations of one range (one per node slice in slice mode). Named after the range, see `names`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "whereabouts.cni.cncf.io",
    version = "v1alpha1",
    kind = "IPPool",
    root = "IpPool",
    plural = "ippools",
    singular = "ippool",
    printcolumn = r#"{"name":"Range","type":"string","jsonPath":".spec.range"}"#,
    printcolumn = r#"{"name":"Network","type":"string","jsonPath":".metadata.annotations.hereabouts\\.cni\\.cncf\\.io/network-name"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    namespaced
)]
pub struct IpPoolSpec {
    /// Range is a RFC 4632/4291-style string that represents an IP address and prefix length in CIDR notation
    pub range: String,
    /// Allocations is the set of allocated IPs for the given range, keyed by the decimal offset of the address from
    /// the range's network address.
    // Always written, even when empty: Whereabouts' schema requires it and our guarded patches add keys below it.
    #[serde(default)]
    pub allocations: BTreeMap<String, IpAllocation>,
}

/// The owner of one allocated address.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct IpAllocation {
    /// The container id of the sandbox holding the address.
    pub id: String,
    /// The pod holding the address, as `namespace/name`.
    pub podref: String,
    /// The interface name inside the sandbox.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ifname: String,
    /// The UID of the pod (hereabouts addition): tells a pod recreated under the same name from the holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poduid: Option<String>,
    /// When the address was allocated, RFC 3339 (hereabouts addition): fresh allocations get a grace period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<String>,
    /// The node the address was allocated on (hereabouts addition): CNI GC only releases its own node's entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The CNI network (netconf `name`) the address was allocated for (hereabouts addition): pools without a
    /// `network_name` may be shared by several networks, and CNI GC only releases its own network's entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Whether an OverlappingRangeIPReservation guards this address (hereabouts addition): the reconciler puts a
    /// missing one back for a live entry, and knows not to for entries of networks that reserve nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserved: bool,
}
