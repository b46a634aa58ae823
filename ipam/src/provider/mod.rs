//! IaaS provider candidates ([`Mode::Provider`](crate::config::Mode::Provider)): ranges whose addresses are cloud
//! sub-interfaces that an external provider creates and releases over HTTPS (the contract: docs/provider.md).
//!
//! - [`add`](add()) is the ADD: the config's ranges are the interface's candidates, narrowed by class; [`check`] is
//!   the CHECK. DEL and GC release the candidates' pools like any pool; the leader reconciler asks the provider to
//!   release the sub-interfaces.
//! - [`placement`] decides without I/O which free address to take and whether that needs a provider call.
//! - The client speaks the contract: its requests and answers, verified TLS, and one call's time budget — the
//!   deadline is the earlier of `http_request_timeout` from now and the invocation's own, and
//!   `X-Request-Timeout-Ms` tells the provider what is left of it just before the request is sent, so that a
//!   provider can refuse work it cannot finish before taking a rate-limit token.

mod add;
pub(crate) mod client;
mod place;
pub mod placement;

pub use crate::config::provider::ProviderConfig;
pub use add::IGNORED_CANDIDATES_REASON;
pub(crate) use add::{add, check};

use crate::crd::IpAllocation;
pub use client::{
    ALLOCATE_PATH, AllocateRequest, AllocateResponse, ProviderClient, ProviderError, RELEASE_PATH, ReleaseRequest,
    SubEniRequest, SubEniResponse, TIMEOUT_HEADER,
};

/// The container id of the leader's hold on an address whose sub-interface the provider is releasing.
pub const HOLD_ID: &str = "hereabouts-provider-release";
/// The pod reference of that hold: not `namespace/name`, so no sweep ever judges it as a pod's.
pub const HOLD_PODREF: &str = "hereabouts:provider-release";

/// The leader's hold on an address while the provider releases its sub-interface: an entry no pod owns, so no
/// ADD takes the address (and has the provider move it) while the cloud may be deleting it.
pub fn hold_entry() -> IpAllocation {
    IpAllocation { id: HOLD_ID.into(), podref: HOLD_PODREF.into(), ..IpAllocation::default() }
}
