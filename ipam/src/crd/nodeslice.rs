use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A range cut into per-node slices (node-slice mode).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "whereabouts.cni.cncf.io",
    version = "v1alpha1",
    kind = "NodeSlicePool",
    plural = "nodeslicepools",
    singular = "nodeslicepool",
    category = "hereabouts",
    doc = "A network's range cut into slices of `sliceSize`, and which node holds each (status): slice mode (`node_slice_size`). A node allocates from its own slices' pools and claims a free slice with a guarded patch when they are full.",
    printcolumn = r#"{"name":"Range","type":"string","jsonPath":".spec.range"}"#,
    printcolumn = r#"{"name":"Slice","type":"string","jsonPath":".spec.sliceSize"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    namespaced,
    status = "NodeSlicePoolStatus"
)]
pub struct NodeSlicePoolSpec {
    /// The whole range, in CIDR notation, that is cut into slices.
    pub range: String,
    /// The prefix length of each node's slice, e.g. `/28`.
    #[serde(rename = "sliceSize")]
    pub slice_size: String,
}

/// Which node holds which slice.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NodeSlicePoolStatus {
    /// One entry per slice; an empty node name is a free slice.
    #[serde(default)]
    pub allocations: Vec<NodeSliceAllocation>,
}

/// One slice of a [`NodeSlicePool`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NodeSliceAllocation {
    /// The node the slice belongs to; empty when free.
    #[serde(rename = "nodeName")]
    pub node_name: String,
    /// The slice, in CIDR notation.
    #[serde(rename = "sliceRange")]
    pub slice_range: String,
}
