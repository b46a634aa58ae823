use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The cluster-wide claim on one address across every pool whose range contains it. Named after the address.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "whereabouts.cni.cncf.io",
    version = "v1alpha1",
    kind = "OverlappingRangeIPReservation",
    root = "OverlappingRangeIpReservation",
    plural = "overlappingrangeipreservations",
    singular = "overlappingrangeipreservation",
    category = "hereabouts",
    doc = "The cluster-wide claim of one address, named after it: across overlapping ranges no two pods hold one address, because only one reservation of that name can exist. Made before the pool entry on ADD, deleted after it on DEL.",
    printcolumn = r#"{"name":"PodRef","type":"string","jsonPath":".spec.podref"}"#,
    printcolumn = r#"{"name":"Interface","type":"string","jsonPath":".spec.ifname"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".metadata.labels.hereabouts\\.cni\\.cncf\\.io/node"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    namespaced
)]
pub struct OverlappingRangeIpReservationSpec {
    /// The container id of the sandbox holding the address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub containerid: String,
    /// The interface name inside the sandbox.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ifname: String,
    /// The pod holding the address, as `namespace/name`.
    pub podref: String,
    /// The IPAMClaim (in the pod's namespace) the address belongs to (hereabouts addition): the next pod of the
    /// claim takes the reservation over as an earlier sandbox's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipamclaim: Option<String>,
}
