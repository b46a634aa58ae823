//! The allocation mode: which of the four ways of keeping addresses a config asks for, chosen once when the config
//! is read, each variant carrying exactly its own settings. Every verb matches on it in one place
//! ([`crate::verbs`]); nothing else asks which mode it runs in.
//!
//! | mode | chosen by | where the addresses are kept |
//! |---|---|---|
//! | [`Mode::Pools`] | the default | one IPPool per range, as Whereabouts |
//! | [`Mode::Slices`] | `node_slice_size` | a NodeSlicePool cutting the range into slices, one IPPool per node and slice |
//! | [`Mode::Provider`] | `iaas_provider` | one IPPool per candidate range, the addresses placed by an IaaS provider |
//! | [`Mode::RouteTable`] | `"datastore": "routetable"` | host routes in the node's routing table, spread by a routing daemon |
//!
//! The combinations that make no sense (a provider's ranges sliced, a StatefulSet's sticky address in a node's
//! slice, API-server keys with the routing table) are refused here with the key named, so no variant can hold
//! them.

use std::path::PathBuf;
use std::time::Duration;

use super::error::ConfigError;
use super::netconf::RawIpam;
use super::provider::{self, Placement, ProviderConfig};
use super::routing::{HostRoutes, RouteTable, Routing};
use super::selection::RangeSelection;
use super::{ranges, selection};
use crate::allocator::Strategy;
use crate::cut::SliceSize;
use crate::range::IpRange;

/// How an invocation keeps its addresses; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// One IPPool per range (Whereabouts' default).
    Pools(Pools),
    /// Node slices (`node_slice_size`).
    Slices(Slices),
    /// IaaS provider candidates (`iaas_provider`).
    Provider(Box<Provider>),
    /// The routing table (`"datastore": "routetable"`): no API server.
    RouteTable(RouteTable),
}

/// What every mode that keeps its addresses on the API server shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kube {
    /// `ipam.kubernetes.kubeconfig`. Whereabouts refuses a config without one; the verbs say so when they need it.
    pub kubeconfig: Option<PathBuf>,
    /// `ipam.enable_overlapping_ranges`, default `true`: claim each address cluster-wide with an
    /// OverlappingRangeIPReservation.
    pub overlapping_ranges: bool,
    /// `ipam.allocation_strategy` (ours): `"lowest"` (default) or `"random"`.
    pub strategy: Strategy,
    /// `ipam.reuse_cooldown_seconds` (ours): the reuse cooldown an ADD sets on the pools it uses (`Some(0)` takes it
    /// away; `None` leaves each pool's as it is). A pool's cooldown, whoever set it, is what its ADDs and releases
    /// honour ([`crate::cooldown`]).
    pub reuse_cooldown: Option<u64>,
    /// `announce_routes`: a host route for each allocated address, for a routing daemon to advertise.
    pub announce: Option<HostRoutes>,
}

/// One IPPool per range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pools {
    /// The API server and how ADDs allocate.
    pub kube: Kube,
    /// `ipam.pod_ranges`, each range's `name`, `node_selector` and `sticky_statefulset`: how an ADD chooses among
    /// the ranges. Inactive by default: every range gives an address, as in Whereabouts.
    pub selection: RangeSelection,
    /// The StatefulSet that controls the pod, as the ADD read it (sticky ranges only; never from the config).
    pub owner_statefulset: Option<String>,
    /// Top-level `allowPersistentIPs` (the key KubeVirt reads before it makes IPAMClaims for a VM's networks): an
    /// attachment whose network selection element names an IPAMClaim gets the claim's addresses.
    pub persistent_ips: PersistentIps,
    /// `preferred_ip_annotation` (the maintained Whereabouts fork's `preferred-ip`): an ADD reads the pod's
    /// `whereabouts.cni.cncf.io/preferred-ip` and takes that address when it is free, else the usual choice.
    pub preferred_ip: bool,
}

/// `allowPersistentIPs`, and the IPAMClaim the runtime named, if it did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PersistentIps {
    /// `allowPersistentIPs`: an ADD reads the pod's network selection elements for its IPAMClaim.
    pub allowed: bool,
    /// `args.cni["ipam-claim-reference"]`: the IPAMClaim, named by the runtime (no pod read). Multus hands an
    /// element's `cni-args` to the plugin there; it does not pass `ipam-claim-reference` itself.
    pub reference: Option<String>,
}

/// Node slices: one range cut into slices listed in a NodeSlicePool, each node allocating in its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slices {
    /// The API server and how ADDs allocate.
    pub kube: Kube,
    /// `node_selector` of the range and `pod_ranges` (no sticky StatefulSet addresses: a pod recreated on another
    /// node looks in that node's slices).
    pub selection: RangeSelection,
    /// `node_slice_size`.
    pub size: SliceSize,
    /// `warm_addresses` (ours): how many attachments' addresses the node agent keeps claimed in advance on each
    /// node ([`crate::warm`]); `0`, none. The binary alone ignores it.
    pub warm: u64,
    /// `max_slices_per_node` (ours, as Calico caps blocks per host): once a node holds this many slices it
    /// borrows from other nodes' slices rather than claim another; `None`, no cap.
    pub max_slices: Option<u64>,
    /// `min_node_slice_size` (ours): adaptive slices, a node's first slice this size, each next twice as large up
    /// to `size` ([`crate::slices::growth`]); `None`, every slice is `size`.
    pub min_size: Option<SliceSize>,
}

/// IaaS provider candidates: the ranges are an interface's candidates, their addresses cloud sub-interfaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    /// The API server and how ADDs allocate.
    pub kube: Kube,
    /// `ipam.iaas_provider`.
    pub provider: ProviderConfig,
    /// How each of the config's ranges is placed: with a provider the ranges are an interface's candidates, one
    /// address per IP family from the first candidate of the highest class that gives one
    /// (`provider::placement::narrow`).
    pub placements: Vec<Placement>,
}

impl Mode {
    /// The mode `raw` (with its `ranges`, and the invocation's `timeout`) asks for; refuses the combinations no
    /// mode has, naming the key.
    pub(super) fn build(raw: &RawIpam<'_>, ranges: &[IpRange], timeout: Duration) -> Result<Mode, ConfigError> {
        let size = match &raw.node_slice_size {
            Some(size) => Some(ranges::check_node_slice(ranges, size)?),
            None => None,
        };
        let provider = raw.iaas_provider.as_ref().map(|f| provider::parse(&f.value, timeout)).transpose()?;
        if provider.is_some() && size.is_some() {
            return Err(ConfigError::invalid(
                "ipam.iaas_provider",
                "not with node_slice_size: a provider-backed range is placed by its provider, not sliced by node",
            ));
        }
        let placements = provider::placements(raw, ranges, provider.is_some())?;
        let selection = selection::parse(raw, ranges, provider.is_some())?;
        let routing = raw.routing.check(
            &[
                ("node_slice_size", raw.node_slice_size.is_some()),
                ("iaas_provider", provider.is_some()),
                ("pod_ranges", raw.pod_ranges.is_some()),
                ("sticky_statefulset", raw.sticky_statefulset.is_some() || raw_sticky_ranges(raw)),
                ("reuse_cooldown_seconds", raw.reuse_cooldown.is_some()),
                ("warm_addresses", raw.warm_addresses.is_some()),
                ("max_slices_per_node", raw.max_slices_per_node.is_some()),
                ("min_node_slice_size", raw.min_node_slice_size.is_some()),
                ("preferred_ip_annotation", raw.preferred_ip_annotation.is_some()),
                ("large_offsets", raw.large_offsets.is_some()),
            ],
            raw.configuration_path.is_some(),
        )?;
        let announce = match routing {
            Routing::RouteTable(table) => {
                if let Some(f) = &raw.strategy {
                    return Err(ConfigError::invalid(
                        f.origin.key("allocation_strategy"),
                        "the routing-table datastore always picks at random (two nodes must not try the same \
                         address first)",
                    ));
                }
                ranges::check_exclude_counts(ranges, table.claiming.exclude_first, table.claiming.exclude_last)?;
                return Ok(Mode::RouteTable(table));
            }
            Routing::Kubernetes { announce } => announce,
        };
        let kube = Kube {
            kubeconfig: raw.kubeconfig.as_ref().map(|f| f.value.clone()),
            overlapping_ranges: raw.overlapping_ranges.as_ref().is_none_or(|f| f.value),
            strategy: raw.strategy.as_ref().map(|f| f.value).unwrap_or_default(),
            reuse_cooldown: raw.reuse_cooldown.as_ref().map(|f| f.value),
            announce,
        };
        let warm = raw.warm_addresses.as_ref().map_or(0, |f| f.value);
        if let Some(f) = raw.warm_addresses.as_ref().filter(|f| f.value > 0) {
            let key = f.origin.key("warm_addresses");
            if size.is_none() {
                return Err(ConfigError::invalid(
                    key,
                    "needs node_slice_size: the reserve is held in the node's slices",
                ));
            }
            if kube.announce.is_some() {
                return Err(ConfigError::invalid(
                    key,
                    "not with announce_routes: the node agent, which holds the reserve, cannot add host routes",
                ));
            }
        }
        let max_slices = raw.max_slices_per_node.as_ref().map(|f| f.value);
        if let Some(f) = raw.max_slices_per_node.as_ref().filter(|_| size.is_none()) {
            return Err(ConfigError::invalid(
                f.origin.key("max_slices_per_node"),
                "needs node_slice_size: it caps the slices of the range a node claims",
            ));
        }
        let min_size = match (&raw.min_node_slice_size, &size) {
            (None, _) => None,
            (Some(min), Some(size)) => Some(ranges::check_min_slice(ranges, size, min)?),
            (Some(min), None) => {
                return Err(ConfigError::invalid(
                    min.origin.key("min_node_slice_size"),
                    "needs node_slice_size: it is the size of a node's first slice, node_slice_size the largest",
                ));
            }
        };
        let preferred_ip = raw.preferred_ip_annotation.as_ref().is_some_and(|f| f.value);
        if let Some(f) =
            raw.preferred_ip_annotation.as_ref().filter(|f| f.value && (provider.is_some() || size.is_some()))
        {
            return Err(ConfigError::invalid(
                f.origin.key("preferred_ip_annotation"),
                "only with one pool per range: a node's slices, or a provider's candidates, decide where an address \
                 may come from",
            ));
        }
        Ok(match (provider, size) {
            (Some(provider), _) => Mode::Provider(Box::new(Provider { kube, provider, placements })),
            (None, Some(size)) => Mode::Slices(Slices { kube, selection, size, warm, max_slices, min_size }),
            (None, None) => Mode::Pools(Pools {
                kube,
                selection,
                owner_statefulset: None,
                persistent_ips: PersistentIps::default(),
                preferred_ip,
            }),
        })
    }

    /// The settings shared by the modes on the API server; `None` for the routing table.
    pub fn kube(&self) -> Option<&Kube> {
        match self {
            Mode::Pools(m) => Some(&m.kube),
            Mode::Slices(m) => Some(&m.kube),
            Mode::Provider(m) => Some(&m.kube),
            Mode::RouteTable(_) => None,
        }
    }

    /// How a DEL or GC of this config finds what ADD wrote.
    pub fn release_mode(&self) -> ReleaseMode {
        let of = |kube: &Kube| ReleaseKube {
            kubeconfig: kube.kubeconfig.clone(),
            overlapping_ranges: kube.overlapping_ranges,
            announce: kube.announce.clone(),
        };
        match self {
            Mode::Pools(m) => ReleaseMode::Pools(of(&m.kube)),
            Mode::Provider(m) => ReleaseMode::Pools(of(&m.kube)),
            Mode::Slices(m) => ReleaseMode::Slices(of(&m.kube)),
            Mode::RouteTable(t) => ReleaseMode::RouteTable(t.routes.clone()),
        }
    }
}

impl Mode {
    /// Sets what the netconf's top level says of IPAMClaims (`allowPersistentIPs`, `args.cni`); refuses it where
    /// the mode cannot keep a claim's addresses for its next pod.
    pub(super) fn with_persistent_ips(mut self, persistent: PersistentIps) -> Result<Mode, ConfigError> {
        if persistent.reference.is_some() && !persistent.allowed {
            return Err(ConfigError::invalid(
                "args.cni.ipam-claim-reference",
                "an IPAMClaim is named but the network does not allow persistent IPs: set \"allowPersistentIPs\": \
                 true at the top level of the network's config",
            ));
        }
        if !persistent.allowed {
            return Ok(self);
        }
        match &mut self {
            Mode::Pools(pools) => pools.persistent_ips = persistent,
            _ => {
                return Err(ConfigError::invalid(
                    "allowPersistentIPs",
                    "only with one pool per range: node slices, an IaaS provider and the routing table keep \
                     addresses per node, and a VM's pod moves between nodes",
                ));
            }
        }
        Ok(self)
    }
}

impl Pools {
    /// `cfg` (whose mode this is) and these settings with only the ranges at `keep`, for a pod whose StatefulSet
    /// is `owner` (ranges chosen per pod or node).
    pub fn narrowed(
        &self,
        cfg: &super::IpamConfig,
        keep: &[usize],
        owner: Option<String>,
    ) -> (super::IpamConfig, Pools) {
        let pools = Pools {
            kube: self.kube.clone(),
            selection: self.selection.narrowed(keep),
            owner_statefulset: owner,
            persistent_ips: self.persistent_ips.clone(),
            preferred_ip: self.preferred_ip,
        };
        (cfg.with_ranges(keep, Mode::Pools(pools.clone())), pools)
    }

    /// The StatefulSet an entry in `range` (one of `ranges`) records, when the range is sticky.
    pub fn sticky_statefulset(&self, ranges: &[IpRange], range: &IpRange) -> Option<String> {
        self.selection.sticky_statefulset(ranges, range, self.owner_statefulset.as_deref())
    }
}

impl Slices {
    /// The sizes a claim cuts a free slice to: from `min_node_slice_size` (adaptive slices; else `node_slice_size`)
    /// up to `node_slice_size`. A free slice of the size wanted is claimed whole, as Whereabouts' layout has them;
    /// one larger (a NodeSlicePool cut for a larger `node_slice_size`, changed in place since) is cut.
    pub fn growth(&self) -> crate::slices::growth::Growth {
        let smallest = self.min_size.as_ref().unwrap_or(&self.size).prefix();
        crate::slices::growth::Growth { largest: self.size.prefix(), smallest }
    }

    /// `cfg` (whose mode this is) and these settings with only the ranges at `keep` (ranges chosen per pod or
    /// node).
    pub fn narrowed(&self, cfg: &super::IpamConfig, keep: &[usize]) -> (super::IpamConfig, Slices) {
        let slices = Slices {
            kube: self.kube.clone(),
            selection: self.selection.narrowed(keep),
            size: self.size.clone(),
            warm: self.warm,
            max_slices: self.max_slices,
            min_size: self.min_size.clone(),
        };
        (cfg.with_ranges(keep, Mode::Slices(slices.clone())), slices)
    }
}

/// Whether an `ipRanges` entry asks for sticky addresses (the routing-table datastore has no StatefulSets).
fn raw_sticky_ranges(raw: &RawIpam<'_>) -> bool {
    raw.ip_ranges.as_ref().is_some_and(|r| r.value.iter().any(|e| e.sticky_statefulset.is_some()))
}

/// Where a DEL or GC finds what ADD wrote, as read leniently ([`super::ReleaseConfig`]). The provider's
/// candidates are pools like any other here: the provider's sub-interfaces are released by the leader reconciler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseMode {
    /// One IPPool per range.
    Pools(ReleaseKube),
    /// The slices of the range's NodeSlicePool.
    Slices(ReleaseKube),
    /// The node's routing table.
    RouteTable(HostRoutes),
}

/// What a DEL or GC on the API server needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseKube {
    /// `ipam.kubernetes.kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `ipam.enable_overlapping_ranges`, default `true`.
    pub overlapping_ranges: bool,
    /// `announce_routes`: the host routes ADD installed, removed first.
    pub announce: Option<HostRoutes>,
}

impl Default for ReleaseMode {
    fn default() -> Self {
        ReleaseMode::Pools(ReleaseKube { kubeconfig: None, overlapping_ranges: true, announce: None })
    }
}

impl ReleaseMode {
    /// What `raw` (with the `ranges` read of it) says, leniently: whatever could be read of the mode's keys. A
    /// `node_slice_size` that cannot slice the range made no NodeSlicePool: whatever was allocated is in the pool.
    pub(super) fn read(raw: &RawIpam<'_>, ranges: &[IpRange]) -> ReleaseMode {
        let kube = ReleaseKube {
            kubeconfig: raw.kubeconfig.as_ref().map(|f| f.value.clone()),
            overlapping_ranges: raw.overlapping_ranges.as_ref().is_none_or(|f| f.value),
            announce: raw.routing.announced(raw.configuration_path.is_some()),
        };
        let sliced = raw.node_slice_size.as_ref().is_some_and(|size| ranges::check_node_slice(ranges, size).is_ok());
        match (raw.routing.route_table(raw.configuration_path.is_some()), sliced) {
            (Some(routes), _) => ReleaseMode::RouteTable(routes),
            (None, true) => ReleaseMode::Slices(kube),
            (None, false) => ReleaseMode::Pools(kube),
        }
    }

    /// The API server settings; `None` for the routing table.
    pub fn kube(&self) -> Option<&ReleaseKube> {
        match self {
            ReleaseMode::Pools(k) | ReleaseMode::Slices(k) => Some(k),
            ReleaseMode::RouteTable(_) => None,
        }
    }
}
