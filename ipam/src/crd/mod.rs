//! The custom resources hereabouts stores its state in: Whereabouts' own, with optional additions only, so objects
//! written by either binary stay readable by the other.

pub mod drift;
mod ipamclaim;
mod ippool;
mod nodeslice;
mod reservation;

pub use ipamclaim::{IPAMCLAIM_GROUP, IpamClaim, IpamClaimSpec, IpamClaimStatus, OwnerPod};
pub use ippool::{IpAllocation, IpPool, IpPoolSpec, SubInterfaceRecord};
pub use nodeslice::{NodeSliceAllocation, NodeSlicePool, NodeSlicePoolSpec, NodeSlicePoolStatus};
pub use reservation::{OverlappingRangeIpReservation, OverlappingRangeIpReservationSpec};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Multus' NetworkAttachmentDefinition (`k8s.cni.cncf.io/v1`), read as a dynamic object: its `spec.config` is a
/// network config in a string.
pub fn nad_resource() -> kube::core::ApiResource {
    let gvk = kube::core::GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition");
    kube::core::ApiResource::from_gvk_with_plural(&gvk, "network-attachment-definitions")
}

/// The API group of every hereabouts (and Whereabouts) resource.
pub const GROUP: &str = "whereabouts.cni.cncf.io";

/// Every CRD hereabouts uses, with the file name Whereabouts ships it under (`doc/crds/`).
pub fn definitions() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("whereabouts.cni.cncf.io_ippools.yaml", IpPool::crd()),
        ("whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml", OverlappingRangeIpReservation::crd()),
        ("whereabouts.cni.cncf.io_nodeslicepools.yaml", node_slice_pool_crd()),
    ]
}

/// Whereabouts' NodeSlicePool has no status subresource: its node-slice controller writes `status` with the
/// object (create, update), which a subresource would silently drop, leaving every slice unassigned.
fn node_slice_pool_crd() -> CustomResourceDefinition {
    let mut crd = NodeSlicePool::crd();
    for version in &mut crd.spec.versions {
        version.subresources = None;
    }
    crd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_whereabouts() {
        let names: Vec<_> = definitions().into_iter().map(|(_, crd)| crd.metadata.name.unwrap()).collect();
        assert_eq!(
            names,
            [
                "ippools.whereabouts.cni.cncf.io",
                "overlappingrangeipreservations.whereabouts.cni.cncf.io",
                "nodeslicepools.whereabouts.cni.cncf.io"
            ]
        );
        for (_, crd) in definitions() {
            assert!(crd.spec.versions.iter().all(|v| v.subresources.is_none()), "Whereabouts' CRDs have none");
            assert_eq!(crd.spec.scope, "Namespaced");
            assert_eq!(crd.spec.versions[0].name, "v1alpha1");
        }
    }
}
