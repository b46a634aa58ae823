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
    category = "hereabouts",
    doc = "The addresses of one range (one node slice in slice mode) and who holds each: one entry per allocated address, keyed by its offset in the range. Written by the CNI plugin with guarded JSON patches; entries of gone pods are released by the reconciler. `kubectl hereabouts ipam show` summarises them.",
    printcolumn = r#"{"name":"Range","type":"string","jsonPath":".spec.range"}"#,
    printcolumn = r#"{"name":"Network","type":"string","jsonPath":".metadata.annotations.hereabouts\\.cni\\.cncf\\.io/network-name"}"#,
    printcolumn = r#"{"name":"Allocated","type":"string","description":"Entries, as the leader reconciler last counted them","jsonPath":".metadata.annotations.hereabouts\\.cni\\.cncf\\.io/allocated"}"#,
    printcolumn = r#"{"name":"Usable","type":"string","description":"Addresses the creating config may hand out","jsonPath":".metadata.annotations.hereabouts\\.cni\\.cncf\\.io/usable-addresses"}"#,
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
    /// IaaS provider mode (hereabouts addition): the cloud sub-interface of each address that has one, by the same
    /// offset as `allocations`. Written by the CNI plugin when the provider created or moved one, and by the
    /// provider itself (it may set `vlan` to -1 while it unbinds an idle one, which is then never handed out).
    /// Kept when the address is released: the sub-interface stays cached on its node for the next pod there.
    #[serde(default, rename = "subInterfaces", skip_serializing_if = "BTreeMap::is_empty")]
    pub sub_interfaces: BTreeMap<String, SubInterfaceRecord>,
    /// IaaS provider mode (hereabouts addition): the node a node-warm pool is bound to, set when the pool is
    /// created and fixed for its life; absent for every other pool (a global provider pool among them).
    #[serde(default, rename = "nodeName", skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Reuse cooldown (hereabouts addition): when each recently released address was released (RFC 3339), by the
    /// same offset as `allocations`. Written with the release by every releaser of a pool whose annotation
    /// `hereabouts.cni.cncf.io/reuse-cooldown-seconds` is set; an ADD does not hand out an address until that long
    /// after. Each release prunes the records that have expired, so the map holds only recent releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<BTreeMap<String, String>>,
}

/// A cloud sub-interface of one address (IaaS provider mode).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubInterfaceRecord {
    /// The node it is attached to.
    pub node: String,
    /// Its MAC address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// Its VLAN ID; -1 while the provider unbinds it.
    #[serde(default)]
    pub vlan: i64,
    /// The MAC of the host interface it hangs off, when known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent_nic_mac: String,
    /// In dual stack, the IPv6 address paired with it when it was created; it stays for the sub-interface's life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paired_address: Option<String>,
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
    /// Sticky StatefulSet addresses (hereabouts addition): the StatefulSet that owns the pod, recorded by an ADD in
    /// a range with `sticky_statefulset`. DEL and GC leave such an entry for the pod recreated under the same name;
    /// the reconciler releases it once the StatefulSet is gone or no longer has the pod's ordinal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statefulset: Option<String>,
    /// Persistent addresses (hereabouts addition): the IPAMClaim (`ipamclaims.k8s.cni.cncf.io`, in the pod's
    /// namespace) the address belongs to. The address is the claim's, not the pod's: the next pod of the claim (a
    /// VM's pod after a live migration or a restart) takes the entry over, DEL and GC leave it, and the reconciler
    /// releases it once the claim is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipamclaim: Option<String>,
    /// The container (`id`) the fields above that hereabouts adds were written for (hereabouts addition). Whereabouts
    /// and its maintained fork give the entry of a pod recreated under the same name to the new pod by rewriting only
    /// `id`: then `poduid`, `allocated`, `node` and `network` describe an earlier sandbox, and nothing is judged by
    /// them ([`IpAllocation::is_recorded`]).
    #[serde(default, rename = "recordedFor", skip_serializing_if = "Option::is_none")]
    pub recorded_for: Option<String>,
}

impl IpAllocation {
    /// Whether the fields hereabouts adds describe this entry's sandbox: they were written for the container it
    /// records now. An entry another tool took over (or one written before this field existed) is judged by its
    /// pod reference alone.
    pub fn is_recorded(&self) -> bool {
        self.recorded_for.as_deref() == Some(self.id.as_str())
    }

    /// The pod UID, if it describes this entry's sandbox ([`Self::is_recorded`]).
    pub fn recorded_uid(&self) -> Option<&str> {
        self.poduid.as_deref().filter(|_| self.is_recorded())
    }
}
