//! The use cases: assign, release, check and gc, orchestrating config, allocator and store under the protocol of
//! DESIGN §5.

mod assign;
mod journal;
mod reclaim;
mod release;

pub use assign::assign;
pub use reclaim::{Reclaimed, address_of, reclaim};
pub use release::{Attachment, check, gc, release};

use std::net::IpAddr;

use crate::budget::RetryError;
use crate::store::StoreError;

/// Error codes of our own, from 100 up as the CNI spec reserves them for plugins.
pub mod codes {
    /// Every usable address of a range is taken.
    pub const RANGE_EXHAUSTED: u32 = 100;
    /// An exact address was requested that another pod holds, or that may not be handed out.
    pub const REQUESTED_ADDRESS_TAKEN: u32 = 101;
    /// CHECK found no allocation for the attachment.
    pub const ALLOCATION_MISSING: u32 = 102;
    /// The API server refused a request (forbidden, invalid): not worth retrying as is.
    pub const STORE_REFUSED: u32 = 103;
}

/// Who asks: one attachment of one pod, on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The node this invocation runs on.
    pub node: String,
}

/// One address handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// The address.
    pub ip: IpAddr,
    /// The prefix length of its range.
    pub prefix_len: u8,
    /// The configured gateway, if it lies in this range.
    pub gateway: Option<IpAddr>,
}

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
    /// An API request failed.
    #[error(transparent)]
    Store(Box<StoreError>),
    /// The time budget ran out (the API server is unreachable or overloaded).
    #[error("time budget ran out: {0}")]
    Expired(String),
}

impl IpamError {
    /// The CNI error code: spec codes where one fits (11: try again later), ours from 100 up.
    pub fn code(&self) -> u32 {
        match self {
            IpamError::Exhausted { .. } => codes::RANGE_EXHAUSTED,
            IpamError::RequestedTaken { .. } | IpamError::RequestedUnusable { .. } => codes::REQUESTED_ADDRESS_TAKEN,
            IpamError::Missing { .. } => codes::ALLOCATION_MISSING,
            IpamError::Store(e) if e.is_transient() => 11,
            IpamError::Store(_) => codes::STORE_REFUSED,
            IpamError::Expired(_) => 11,
        }
    }

    fn from_retry(what: &str, err: RetryError<StoreError>) -> Self {
        match err {
            RetryError::Failed(e) if e.is_transient() => IpamError::Expired(format!("{what}: {e}")),
            RetryError::Failed(e) => IpamError::Store(Box::new(e)),
            RetryError::Expired => IpamError::Expired(what.to_string()),
        }
    }
}
