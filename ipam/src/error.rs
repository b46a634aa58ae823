//! Why a use case failed, and the CNI code each failure answers with.

use std::net::IpAddr;

use crate::budget::RetryError;
use crate::codes::Code;
use crate::store::{Failure, StoreError};

/// Why a use case failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// Every usable address of the range is taken.
    #[error("range {range} (pool {pool}) is exhausted: no free address")]
    Exhausted {
        /// The pool's name.
        pool: String,
        /// The range.
        range: String,
    },
    /// The node's slices, as many as `max_slices_per_node` allows, are full, and no other node's has a free address
    /// to borrow (or the network does not borrow): free slices are left to the other nodes.
    #[error(
        "node slices {pool}: node {node} holds {max} slices (max_slices_per_node), all full, and none of another \
         node's could be borrowed from; free slices are left to other nodes"
    )]
    SliceCap {
        /// The NodeSlicePool.
        pool: String,
        /// The node.
        node: String,
        /// `max_slices_per_node`.
        max: u64,
    },
    /// The requested address is held by another pod.
    #[error("requested address {ip} is taken by {holder}")]
    RequestedTaken {
        /// The address.
        ip: IpAddr,
        /// Who holds it (`namespace/name`), as far as known.
        holder: String,
    },
    /// The requested address may not be handed out (network, broadcast, gateway, excluded, outside the bounds).
    #[error("requested address {ip} is not assignable in range {range}")]
    RequestedUnusable {
        /// The address.
        ip: IpAddr,
        /// The range.
        range: String,
    },
    /// CHECK found no allocation for the attachment in a pool.
    #[error("no allocation of container {container_id} interface {ifname} in pool {pool}")]
    Missing {
        /// The pool's name.
        pool: String,
        /// The container.
        container_id: String,
        /// The interface.
        ifname: String,
    },
    /// The pool object has reached the storage's size limit: no entry can be added to it.
    #[error(
        "pool {pool} cannot grow: the object has reached the storage's size limit (etcd's request limit, \
         1.5 MiB by default, about 5,000 entries) ({message}); use a smaller range per network, or node_slice_size"
    )]
    PoolTooLarge {
        /// The pool's name.
        pool: String,
        /// What the server said.
        message: String,
    },
    /// The server refused a write for another reason than the protocol's own test (a schema, an admission
    /// policy): retrying the same write cannot help.
    #[error("{what}: refused by the API server: {message}")]
    Refused {
        /// The write, e.g. `pool 10.0.0.0-24: add allocation 5`.
        what: String,
        /// What the server said.
        message: String,
    },
    /// The installed CRD prunes a field this config needs (Whereabouts' or its fork's schema instead of
    /// hereabouts'): what the field would hold is dropped on write.
    #[error(
        "the installed CRD {crd} prunes {field}, which {needed_by} needs: apply hereabouts' CRDs (kubectl apply -f \
         crds/), a superset of Whereabouts' that Whereabouts reads and writes too"
    )]
    SchemaPrunes {
        /// e.g. `ippools.whereabouts.cni.cncf.io`.
        crd: String,
        /// e.g. `spec.released`.
        field: String,
        /// The config key that needs it.
        needed_by: String,
    },
    /// The network's NodeSlicePool does not slice the range as the config says (another NAD of the network
    /// differs), or cannot be used.
    #[error("node slices {name}: {message}")]
    SliceMismatch {
        /// The NodeSlicePool's name.
        name: String,
        /// What does not match.
        message: String,
    },
    /// A node-warm pool has no warm address for this node (IaaS provider mode): the next candidate is tried.
    #[error("pool {pool}: no free warm sub-interface on node {node}")]
    NoWarmAddress {
        /// The pool's name.
        pool: String,
        /// The node asking.
        node: String,
    },
    /// No candidate range gave an address of a family the config asks for (IaaS provider mode).
    #[error("no {family} address for node {node}: {}", tried_text(.tried))]
    NoCandidate {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The node asking.
        node: String,
        /// Why each candidate tried gave none (empty: none applies to this node).
        tried: Vec<IpamError>,
    },
    /// The pool exists in another placement mode than the config gives its range (IaaS provider mode: a pool's
    /// mode is fixed for its life).
    #[error("pool {pool}: {message}")]
    PoolPlacement {
        /// The pool's name.
        pool: String,
        /// How the pool and the config differ.
        message: String,
    },
    /// An API request failed.
    #[error(transparent)]
    Store(Box<StoreError>),
    /// The time budget ran out (the API server is unreachable or overloaded).
    #[error("time budget ran out: {0}")]
    Expired(String),
    /// The IaaS provider failed or refused to place the address (what was claimed is rolled back).
    #[error("{0}")]
    Provider(#[from] crate::provider::client::ProviderError),
    /// Every free address of the pool was released too recently (its reuse cooldown): try again later.
    #[error(
        "pool {pool}: every free address was released less than the pool's reuse cooldown ago ({count} cooling; the first is free again at {until})"
    )]
    CoolingDown {
        /// The pool's name.
        pool: String,
        /// How many free addresses are cooling.
        count: usize,
        /// When the first of them may be handed out again (RFC 3339).
        until: String,
    },
    /// The pool was replaced (its network's range changed) since this ADD began: claims of the new pool no longer
    /// read it, so no new address may be claimed in it until an ADD of the old config cannot be under way any more.
    #[error(
        "pool {pool} was replaced at {at} (the network's range changed since this ADD began): no new address is \
         claimed in it; the runtime's retry reads the network's current config"
    )]
    Replaced {
        /// The pool's name.
        pool: String,
        /// When it was marked replaced (RFC 3339).
        at: String,
    },
    /// The ranges a pod chose cannot be used (ranges chosen per pod): an unknown name, a range that does not serve
    /// the node, a malformed annotation.
    #[error(transparent)]
    Choice(crate::config::ConfigError),
    /// The pod names an IPAMClaim that does not exist (yet: KubeVirt makes it before the VM's pod).
    #[error("IPAMClaim {claim} does not exist; it is made before the pod that names it")]
    ClaimMissing {
        /// `namespace/name`.
        claim: String,
    },
    /// The IPAMClaim cannot give this attachment its addresses (another network's, addresses outside the ranges).
    #[error("IPAMClaim {claim}: {reason}")]
    ClaimUnusable {
        /// `namespace/name`.
        claim: String,
        /// Why.
        reason: String,
    },
    /// Another pod of the IPAMClaim recorded other addresses on it meanwhile: this ADD's are given back; the next
    /// try takes the claim's.
    #[error("IPAMClaim {claim} now holds {holds}, recorded by another pod meanwhile; try again")]
    ClaimConflict {
        /// `namespace/name`.
        claim: String,
        /// Its addresses, as recorded.
        holds: String,
    },
    /// Several failures (DEL and GC keep going after one).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Many(Vec<IpamError>),
}

/// What the candidates tried came to, for [`IpamError::NoCandidate`].
fn tried_text(tried: &[IpamError]) -> String {
    if tried.is_empty() {
        return "no candidate range applies to this node (only node-warm pools of other nodes)".into();
    }
    tried.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

impl IpamError {
    /// The CNI error code: spec codes where one fits (11: try again later), ours from 100 up. Several failures
    /// take the first one's code that is not "try again later", so a runtime retries only what can succeed.
    pub fn code(&self) -> Code {
        match self {
            IpamError::Exhausted { .. } | IpamError::SliceCap { .. } => Code::RangeExhausted,
            IpamError::RequestedTaken { .. } | IpamError::RequestedUnusable { .. } => Code::RequestedAddressTaken,
            IpamError::Missing { .. } => Code::AllocationMissing,
            IpamError::PoolTooLarge { .. } => Code::PoolTooLarge,
            IpamError::Refused { .. } | IpamError::SchemaPrunes { .. } => Code::StoreRefused,
            IpamError::SliceMismatch { .. } | IpamError::PoolPlacement { .. } => Code::InvalidConfig,
            IpamError::NoCandidate { tried, .. }
                if tried.iter().any(|e| matches!(e, IpamError::CoolingDown { .. })) =>
            {
                Code::TryAgainLater
            }
            IpamError::NoWarmAddress { .. } | IpamError::NoCandidate { .. } => Code::RangeExhausted,
            IpamError::Store(e) if e.is_transient() => Code::TryAgainLater,
            IpamError::Store(e) if e.failure == Failure::TooLarge => Code::PoolTooLarge,
            IpamError::Store(_) => Code::StoreRefused,
            IpamError::Expired(_) => Code::TryAgainLater,
            IpamError::Provider(e) => e.code(),
            IpamError::Choice(e) => e.code(),
            IpamError::CoolingDown { .. } | IpamError::Replaced { .. } => Code::TryAgainLater,
            IpamError::ClaimMissing { .. } | IpamError::ClaimConflict { .. } => Code::TryAgainLater,
            IpamError::ClaimUnusable { .. } => Code::InvalidConfig,
            IpamError::Many(all) => {
                all.iter().map(IpamError::code).find(|c| *c != Code::TryAgainLater).unwrap_or(Code::TryAgainLater)
            }
        }
    }

    /// `errors` as one error: `None` when empty, the error itself when alone.
    pub fn all(mut errors: Vec<IpamError>) -> Option<IpamError> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(IpamError::Many(errors)),
        }
    }

    pub(crate) fn from_retry(what: &str, err: RetryError<StoreError>) -> Self {
        match err {
            RetryError::Failed(e) if e.is_transient() => IpamError::Expired(format!("{what}: {e}")),
            RetryError::Failed(e) => IpamError::Store(Box::new(e)),
            RetryError::Expired => IpamError::Expired(what.to_string()),
        }
    }
}
