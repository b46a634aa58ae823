//! The routing-table datastore ([`Mode::RouteTable`](crate::config::Mode::RouteTable), `"datastore": "routetable"`;
//! its contract: docs/routetable.md) and the Kubernetes modes' announcement of addresses as host routes
//! (`announce_routes`).
//!
//! With the routing-table datastore no API server is involved: an address is in use when the node's routing table
//! has a host route to it, and a routing daemon on every node (BIRD in the tests and docs/configuration.md) spreads the host
//! routes this plugin installs, so every node sees every address in use. An ADD picks a free address at random,
//! records it on the node ([`records`]), installs the host route with its own protocol number and a metric that
//! carries the claim's time ([`claim`]), waits for the propagation delay and looks again: if a claim as early as
//! its own arrived meanwhile, it withdraws and picks again. DEL removes the route (so the daemon withdraws it
//! everywhere) and the record; GC those of attachments the runtime no longer has; CHECK that both are there.
//!
//! Before an ADD claims anything it asks the node's routing daemon ([`bird`]) whether every other node's claims
//! have reached this node, and answers "try again later" until they have. A node's reconciler re-runs the claim
//! verdict on the claims the node holds ([`audit`]) and reports what collides; CHECK runs the same verdict.
//!
//! The use cases ([`assign`], [`release`], [`gc`], [`check`], [`announce`], [`audit`]) work on any [`Table`]: the
//! kernel's ([`KernelTable`]) or the tests' own.

pub mod bird;
pub mod claim;
mod kernel;
mod ops;
pub mod records;

use std::future::Future;
use std::net::IpAddr;

use ipnet::IpNet;

pub use bird::{Bird, NotReady, RoutingDaemon};
pub use claim::{HostRoute, Verdict};
pub use kernel::KernelTable;
pub use ops::{
    Audited, ClaimState, Claimed, METADATA_ADDRESSES, announce, assign, audit, check, gc, release, remove, status,
};

use crate::codes::Code;

/// The `nameserver` addresses of a `resolv.conf` (a link-local one's `%zone` dropped).
pub fn nameservers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|a| a.split('%').next()?.parse().ok())
        .collect()
}

/// The kernel's local table, where the node's own addresses are.
pub const LOCAL_TABLE: u32 = 255;

/// A route of any prefix, as far as telling where the host sends an address goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetRoute {
    /// Its destination.
    pub dst: IpNet,
    /// Its protocol number.
    pub protocol: u8,
    /// The link it points at, when it names one.
    pub link: Option<u32>,
    /// Its next hop, if any.
    pub gateway: Option<IpAddr>,
}

/// A node's routing tables, as far as this datastore uses them.
pub trait Table {
    /// The host routes of `table` to addresses of `net`, any protocol.
    fn host_routes(&self, table: u32, net: IpNet) -> impl Future<Output = Result<Vec<HostRoute>, TableError>>;

    /// The routes of `table`, any prefix but the host routes', whose destination overlaps `net`.
    fn routes_over(&self, table: u32, net: IpNet) -> impl Future<Output = Result<Vec<NetRoute>, TableError>>;

    /// Installs `route` pointing at link `link`; [`TableError::Exists`] when the table has that very route.
    fn add(&self, route: &HostRoute, link: u32) -> impl Future<Output = Result<(), TableError>>;

    /// Deletes exactly `route` (destination, table, protocol, metric); one that is not there is no error.
    fn delete(&self, route: &HostRoute) -> impl Future<Output = Result<(), TableError>>;

    /// The index of the link the routes of `net` point at: `device`, else the link with an address in `net`.
    fn link_for(&self, device: Option<&str>, net: IpNet) -> impl Future<Output = Result<u32, TableError>>;
}

/// Why the routing table could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TableError {
    /// The table has the route already.
    #[error("the table has route {} (table {}, proto {}, metric {}) already", route.dst, route.table, route.protocol, route.metric)]
    Exists {
        /// The route.
        route: HostRoute,
    },
    /// `route_device` names no link of this node.
    #[error("ipam.route_device {device:?}: no such link on this node")]
    NoLink {
        /// The name.
        device: String,
    },
    /// No link of this node has an address in the range, and `route_device` is not set.
    #[error("no link on this node has an address in {range}: set ipam.route_device to the link the routes point at")]
    NoLinkInRange {
        /// The range.
        range: IpNet,
    },
    /// A netlink request failed.
    #[error("{op}: {detail}")]
    Netlink {
        /// What was asked.
        op: &'static str,
        /// The kernel's or the library's answer.
        detail: String,
    },
}

/// Why a use case of the routing-table datastore failed.
#[derive(Debug, thiserror::Error)]
pub enum RouteTableError {
    /// The routing table.
    #[error(transparent)]
    Table(#[from] TableError),
    /// The node-local records.
    #[error(transparent)]
    Records(#[from] records::RecordError),
    /// Every address of a range has a host route (or is excluded).
    #[error("range {range} is exhausted: every address it may hand out has a host route on this node")]
    Exhausted {
        /// The range.
        range: IpNet,
    },
    /// A requested address stayed taken for the whole time budget.
    #[error(
        "requested address {ip} is taken (a host route to it is in table {table}) and stayed so until the time budget ran out"
    )]
    RequestedTaken {
        /// The address.
        ip: IpAddr,
        /// The table.
        table: u32,
    },
    /// The time budget ran out while claims kept colliding.
    #[error("the time budget ran out after {collisions} collisions: no address could be claimed in {range}")]
    Expired {
        /// The range still without an address.
        range: IpNet,
        /// How many claims collided.
        collisions: u32,
    },
    /// CHECK: the attachment lacks its address or route.
    #[error("{0}")]
    Missing(String),
    /// CHECK: a claim as early as the attachment's, or earlier, holds its address too.
    #[error(
        "{ip}: another claim as early as ours or earlier holds the address too (ours: metric {ours}; theirs: metric {}, proto {}, table {}): the reconciler reports it; a person decides which pod keeps it",
        competitor.metric, competitor.protocol, competitor.table
    )]
    Conflict {
        /// The address.
        ip: IpAddr,
        /// Our route's metric.
        ours: u32,
        /// The earliest competing route.
        competitor: HostRoute,
    },
    /// The address may not be claimed on this node: the host sends it somewhere already.
    #[error("{ip} may not be claimed on this node: it is {why}")]
    Reserved {
        /// The address.
        ip: IpAddr,
        /// What it is.
        why: String,
    },
    /// The routing daemon has not given this node every other node's claims yet.
    #[error(transparent)]
    NotReady(#[from] NotReady),
}

impl RouteTableError {
    /// The CNI error code.
    pub fn code(&self) -> Code {
        match self {
            Self::Table(TableError::NoLink { .. } | TableError::NoLinkInRange { .. }) => Code::InvalidConfig,
            Self::Table(_) | Self::Records(_) => Code::Io,
            Self::Exhausted { .. } => Code::RangeExhausted,
            Self::RequestedTaken { .. } => Code::RequestedAddressTaken,
            Self::Expired { .. } => Code::TryAgainLater,
            Self::Missing(_) | Self::Conflict { .. } => Code::AllocationMissing,
            Self::Reserved { .. } => Code::InvalidConfig,
            Self::NotReady(_) => Code::TryAgainLater,
        }
    }
}
