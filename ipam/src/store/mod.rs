//! The Kubernetes store: IPPools and OverlappingRangeIPReservations in one namespace, written with the guarded
//! patches and creates of DESIGN §5. Every call here is one API request; retrying is the caller's business.

mod connect;
mod pool;
mod reservation;

pub use connect::{ConnectError, connect, namespace_of};
pub use pool::{AddOutcome, RemoveOutcome};
pub use reservation::ReserveOutcome;

use kube::{Api, Client};

use crate::crd::{IpPool, OverlappingRangeIpReservation};

/// A failed API request, with the operation and the object it was about.
#[derive(Debug, thiserror::Error)]
#[error("{kind} {name}: {op}: {}", describe(source))]
pub struct StoreError {
    /// `pool` or `reservation`.
    pub kind: &'static str,
    /// The object's name.
    pub name: String,
    /// What was attempted, e.g. `patch allocation 5`.
    pub op: String,
    /// What the client or the server said.
    #[source]
    pub source: kube::Error,
}

/// The server's own words for an API error (kube's Display of it prints the whole status structure).
fn describe(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("{} {}: {}", status.code, status.reason, status.message),
        other => other.to_string(),
    }
}

impl StoreError {
    fn new(kind: &'static str, name: &str, op: impl Into<String>, source: kube::Error) -> Self {
        Self { kind, name: name.to_string(), op: op.into(), source }
    }

    /// Whether the request may succeed if tried again: the server was unreachable, overloaded or timed out, as
    /// opposed to refusing the request.
    pub fn is_transient(&self) -> bool {
        match &self.source {
            kube::Error::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
            kube::Error::SerdeError(_) | kube::Error::BuildRequest(_) | kube::Error::InferConfig(_) => false,
            _ => true,
        }
    }

    /// The HTTP status the server answered with, if it answered.
    pub fn status_code(&self) -> Option<u16> {
        match &self.source {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }
}

/// The pools and reservations of one namespace.
#[derive(Clone)]
pub struct Store {
    pools: Api<IpPool>,
    reservations: Api<OverlappingRangeIpReservation>,
    namespace: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

impl Store {
    /// A store over `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            pools: Api::namespaced(client.clone(), namespace),
            reservations: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
        }
    }

    /// The namespace the objects live in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
}
