//! The hereabouts IPAM domain, shared by the CNI plugin and the reconciler.
//!
//! The data model is Whereabouts' (group `whereabouts.cni.cncf.io/v1alpha1`), so a cluster can switch in place:
//! see [`crd`]. [`range`] and [`allocator`] are pure and tested without a server; [`store`] is the only module that
//! talks to the API server, and [`ipam`] orchestrates them into the use cases (assign, release, check, gc).

pub mod allocator;
pub mod budget;
pub mod clock;
pub mod codes;
pub mod config;
pub mod cooldown;
pub mod crd;
pub mod entropy;
pub mod ipam;
pub mod names;
pub mod provider;
pub mod range;
pub mod routetable;
pub mod selector;
pub mod slices;
pub mod store;
