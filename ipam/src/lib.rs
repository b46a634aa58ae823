//! The hereabouts IPAM domain, shared by the CNI plugin, the reconciler and `kubectl hereabouts`.
//!
//! Where to start: [`config::load`] reads an invocation's config, whose [`Mode`] says how its addresses are kept;
//! the five [`verbs`] ([`add`], [`check`], [`status`], [`del`], [`gc`]) each match on the mode once and hand over to
//! that mode's module. docs/design.md tells the same story at length.
//!
//! | layer | modules |
//! |---|---|
//! | what is asked | [`config`] (the [`Mode`]), [`request`] |
//! | the verbs | [`verbs`], with the machine behind a [`Host`] and the node's [`lock`] |
//! | the modes | [`pools`] (one pool per range), [`slices`] (node slices), [`provider`] (IaaS candidates), [`routetable`] (the routing table) |
//! | the protocol on the API server | [`claim`]: one address claimed in one pool, rolled back, released; pure decisions in [`claim::decide`]; what a new pool replaces in [`claim::replaces`] |
//! | the reconciler's rules | [`reconcile`]: whether an entry or a reservation may go, and the guarded writes that give it back |
//! | storage | [`store`]: narrow traits per concern, the live [`KubeStore`], the fault-injecting [`MemoryStore`], the guarded patches of [`store::guard`] |
//! | pure parts | [`range`], [`allocator`], [`names`], [`crd`], [`cooldown`], [`selector`] |
//!
//! The data model is Whereabouts' (group `whereabouts.cni.cncf.io/v1alpha1`), so a cluster can switch in place.

pub mod allocator;
pub mod budget;
pub mod claim;
pub mod clock;
pub mod codes;
pub mod config;
pub mod cooldown;
pub mod crd;
pub mod cut;
pub mod entropy;
pub mod error;
pub mod lock;
pub mod marks;
pub mod names;
pub mod pools;
pub mod provider;
pub mod range;
pub mod reconcile;

pub mod request;
pub mod routetable;
pub mod selector;
pub mod slices;
pub mod store;
pub mod verbs;
pub mod warm;

pub use codes::Code;
pub use config::{IpamConfig, Mode, ReleaseConfig};
pub use error::IpamError;
pub use request::{Assigned, Attachment, Request, SETTLE_TIME};
pub use store::{KubeStore, MemoryStore, Store};
pub use verbs::{Host, LiveHost, VerbError, add, check, del, gc, status};
