//! The IPAMClaim of the network plumbing working group (`ipamclaims.k8s.cni.cncf.io`, v1alpha1): a VM's claim on
//! its secondary network's addresses, made by KubeVirt (its ipam-extensions) before the VM's pod, named in the pod's
//! network selection element (`ipam-claim-reference`). Its CRD is upstream's, installed with KubeVirt; hereabouts
//! reads the claim and writes its status, as OVN-Kubernetes does.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the IPAMClaim.
pub const IPAMCLAIM_GROUP: &str = "k8s.cni.cncf.io";

/// What the claim is for.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "k8s.cni.cncf.io",
    version = "v1alpha1",
    kind = "IPAMClaim",
    root = "IpamClaim",
    plural = "ipamclaims",
    singular = "ipamclaim",
    status = "IpamClaimStatus",
    namespaced
)]
pub struct IpamClaimSpec {
    /// The network the claim is for: the netconf `name` of the network attachment (not the NAD's object name).
    pub network: String,
    /// The pod interface the claim is for.
    pub interface: String,
}

/// What the IPAM plugin gave the claim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct IpamClaimStatus {
    /// The addresses, as `address/prefix` (OVN-Kubernetes' form; a bare address is read too).
    #[serde(default)]
    pub ips: Vec<String>,
    /// The pod that holds them now.
    #[serde(default, rename = "ownerPod", skip_serializing_if = "Option::is_none")]
    pub owner_pod: Option<OwnerPod>,
}

/// The pod a claim's addresses were last given to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct OwnerPod {
    /// The pod's name (the claim's namespace).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}
