//! The hereabouts IPAM domain, shared by the CNI plugin and the reconciler.
//!
//! The data model is Whereabouts' (group `whereabouts.cni.cncf.io/v1alpha1`), so a cluster can switch in place:
//! see [`crd`].

pub mod crd;
