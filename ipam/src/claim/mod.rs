//! The protocol on the API server, shared by the three modes that keep their addresses there (one pool per range,
//! node slices, provider candidates): claiming one address in one pool with no lock — the reservation is the
//! cluster-wide claim, a guarded patch the pool's — taking it back when an ADD fails half-way, and releasing an
//! attachment's entries. docs/design.md, "The store protocol", says why each step is as it is.
//!
//! A mode tells the claim what it adds through a small [`Policy`]; it tells DEL, CHECK and GC where its entries
//! live through a [`Layout`]. The decisions are pure functions in [`decide`]; the rest reads, asks them, and
//! writes.

mod add;
mod choose;
pub mod decide;
mod ipamclaim;
mod journal;
mod preferred;
mod reclaim;
mod release;
pub mod replaces;
mod reservation;

pub(crate) use add::{Claim, Plain, Policy, Steer, Target};
pub use choose::{IPAMCLAIMS_CLUSTER_ROLE, IPAMCLAIMS_VALUE, RANGES_CLUSTER_ROLE, RANGES_VALUE, statefulset_ordinal};
pub(crate) use choose::{PodOnce, choose_ranges};
pub(crate) use ipamclaim::{ClaimRead, resolve as resolve_ipamclaim};
pub use ipamclaim::{NETWORKS_ANNOTATION, reference_in};
pub use journal::ROLLBACK_GRACE;
pub(crate) use journal::{Journal, Written, remove_entry};
pub(crate) use preferred::preferred_ip;
pub use preferred::{PREFERRED_IP_ANNOTATION, preferred_in};
pub use reclaim::{
    Reclaimed, Restored, address_of, pool_scope, reclaim, release_orphan, reservation_of, reservations_of,
    restore_reservation, understand,
};
pub(crate) use release::{Layout, Place, check, gc, read_pool, release};
pub use reservation::release_if_ours;

use decide::Me;

use crate::config::{IpamConfig, Kube, ReleaseConfig, ReleaseKube};
use crate::range::IpRange;
use crate::request::Request;

/// The network a DEL, CHECK or GC acts on: what names its pools and reservations.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The netconf `name`: GC releases only entries recorded for this network.
    pub network: &'a str,
    /// `ipam.network_name`: the prefix of pool and reservation names.
    pub network_name: &'a str,
    /// The ranges, whose CIDRs name the pools.
    pub ranges: &'a [IpRange],
    /// Whether the network claims addresses with reservations.
    pub overlapping_ranges: bool,
}

impl<'a> Scope<'a> {
    /// The scope of `cfg`, on the API server as `kube` says.
    pub fn of(cfg: &'a IpamConfig, kube: &Kube) -> Self {
        Self {
            network: &cfg.name,
            network_name: &cfg.network_name,
            ranges: &cfg.ranges,
            overlapping_ranges: kube.overlapping_ranges,
        }
    }

    /// The scope of the DEL or GC config `cfg`, on the API server as `kube` says.
    pub fn of_release(cfg: &'a ReleaseConfig, kube: &ReleaseKube) -> Self {
        Self {
            network: &cfg.name,
            network_name: &cfg.network_name,
            ranges: &cfg.ranges,
            overlapping_ranges: kube.overlapping_ranges,
        }
    }
}

/// Who claims, under which settings: the same for every pool of one ADD.
#[derive(Debug, Clone)]
pub(crate) struct Claimant<'a> {
    /// The attachment.
    pub me: Me<'a>,
    /// The node the ADD runs on.
    pub node: &'a str,
    /// The config: the network's names and the pod.
    pub cfg: &'a IpamConfig,
    /// How the API server is used and addresses are picked.
    pub kube: &'a Kube,
}

impl<'a> Claimant<'a> {
    /// The claimant of `req` under `cfg` (whose pod reference is `podref`) and `kube`.
    pub fn new(cfg: &'a IpamConfig, kube: &'a Kube, req: &'a Request, podref: &'a str) -> Self {
        Self {
            me: Me { podref, ifname: &req.ifname, container: &req.container_id, claim: None },
            node: &req.node,
            cfg,
            kube,
        }
    }

    /// The same claimant, its addresses those of the IPAMClaim `claim` (in the pod's namespace).
    pub fn for_claim(mut self, claim: Option<&'a str>) -> Self {
        self.me.claim = claim;
        self
    }
}
