//! The keys of host routes: the routing-table datastore (`"datastore": "routetable"`, docs/routetable.md) and the Kubernetes mode's announcement of each allocated address (`announce_routes`).
//!
//! Both install one host route (a /32 or /128) per address, with a protocol number of their own, in a table of
//! their choice, so that a routing daemon can pick them out of the kernel's table and advertise them; both keep a
//! node-local record per address so that DEL and GC know which route belongs to which attachment
//! ([`crate::routetable::records`]).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::error::ConfigError;
use super::field::{Field, Origin, sourced};
use super::json::{boolean, string, uint, uint32};

/// The table the routes go to unless `route_table` says otherwise: `main`.
pub const DEFAULT_ROUTE_TABLE: u32 = 254;
/// The routes' protocol number unless `route_protocol` says otherwise (the routetable IPAM plugin's default).
pub const DEFAULT_ROUTE_PROTOCOL: u8 = 192;
/// How long a claim waits for a competing claim to arrive before it re-checks (the routetable IPAM plugin's
/// default).
pub const DEFAULT_PROPAGATION: Duration = Duration::from_millis(100);
/// How long a requested address that is taken is waited for between tries (the routetable IPAM
/// plugin's default).
pub const DEFAULT_REQUESTED_RETRY: Duration = Duration::from_millis(100);
/// Where the node-local records live unless `route_state_dir` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni/hereabouts/routes";
/// The longest `propagation_timeout_ms` and `requested_address_retry_ms`: a minute, well inside any budget.
const MAX_WAIT_MS: u64 = 60_000;

/// The keys this module reads.
pub const KEYS: &[&str] = &[
    "datastore",
    "route_table",
    "route_protocol",
    "route_device",
    "route_state_dir",
    "propagation_timeout_ms",
    "requested_address_retry_ms",
    "exclude_first",
    "exclude_last",
    "announce_routes",
];

/// Where a config keeps its allocations, as the `datastore` key says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Datastore {
    /// IPPool and OverlappingRangeIPReservation objects on the API server (the default, Whereabouts' only one).
    #[default]
    Kubernetes,
    /// The node's routing table, kept consistent across nodes by a routing daemon.
    RouteTable,
}

/// The host routes a config installs: where, with which protocol number, and where their records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoutes {
    /// `route_table`, default [`DEFAULT_ROUTE_TABLE`].
    pub table: u32,
    /// `route_protocol`, default [`DEFAULT_ROUTE_PROTOCOL`].
    pub protocol: u8,
    /// `route_device`: the link the routes point at; else the node's link with an address in the range.
    pub device: Option<String>,
    /// `route_state_dir`, default [`DEFAULT_STATE_DIR`].
    pub state_dir: PathBuf,
}

/// How the routing-table datastore claims an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claiming {
    /// `propagation_timeout_ms`, default [`DEFAULT_PROPAGATION`].
    pub propagation: Duration,
    /// `requested_address_retry_ms`, default [`DEFAULT_REQUESTED_RETRY`].
    pub requested_retry: Duration,
    /// `exclude_first`: this many usable addresses at the start of each range are never handed out.
    pub exclude_first: u64,
    /// `exclude_last`: this many usable addresses at the end of each range are never handed out.
    pub exclude_last: u64,
}

/// The routing-table datastore's settings: [`super::Mode::RouteTable`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTable {
    /// Where the claims go, as host routes.
    pub routes: HostRoutes,
    /// How an address is claimed.
    pub claiming: Claiming,
}

/// What the routing keys make of a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Routing {
    /// The API server keeps the addresses; with `announce_routes`, a host route is installed for each.
    Kubernetes { announce: Option<HostRoutes> },
    /// The routing table keeps them.
    RouteTable(RouteTable),
}

/// The routing keys as given, inline or in the flat file.
#[derive(Debug, Clone, Default)]
pub(super) struct RawRouting<'p> {
    pub datastore: Field<'p, Datastore>,
    pub table: Field<'p, u32>,
    pub protocol: Field<'p, u8>,
    pub device: Field<'p, String>,
    pub state_dir: Field<'p, PathBuf>,
    pub propagation: Field<'p, Duration>,
    pub requested_retry: Field<'p, Duration>,
    pub exclude_first: Field<'p, u64>,
    pub exclude_last: Field<'p, u64>,
    pub announce: Field<'p, bool>,
}

/// Reads key `name` (one of [`KEYS`]); `ignored` gets a `datastore` that names the Kubernetes store, which changes
/// nothing (Whereabouts' configs still carry `"datastore": "kubernetes"`).
pub(super) fn parse_key<'p>(
    raw: &mut RawRouting<'p>,
    name: &str,
    v: &Value,
    origin: Origin<'p>,
    ignored: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let key = origin.key(name);
    let key = key.as_str();
    match name {
        "datastore" => match string(v, key)?.as_deref() {
            None => {}
            // etcd was Whereabouts' other store, long removed there; its configs run on the API server
            Some("kubernetes" | "etcd") => ignored.push(key.to_string()),
            Some("routetable") => raw.datastore = sourced(origin, Some(Datastore::RouteTable)),
            Some(other) => {
                return Err(ConfigError::invalid(
                    key,
                    format!("{other:?}: expected \"kubernetes\" (the default) or \"routetable\""),
                ));
            }
        },
        "route_table" => {
            let table = uint32(v, key)?;
            // 0 is "unspecified" to the kernel, 253..=255 are default, main and local: only main is a sensible one
            if let Some(t @ (0 | 253 | 255)) = table {
                return Err(ConfigError::invalid(key, format!("{t}: not a table for host routes (254 is main)")));
            }
            raw.table = sourced(origin, table);
        }
        "route_protocol" => {
            let protocol = match uint32(v, key)?.map(|p| (p, u8::try_from(p))) {
                // 0..=4 are the kernel's own (unspec, redirect, kernel, boot, static): a daemon could not tell ours
                Some((_, Ok(p @ 5..))) => Some(p),
                Some((p, _)) => {
                    return Err(ConfigError::invalid(key, format!("{p}: must be 5 to 255 (0 to 4 are the kernel's)")));
                }
                None => None,
            };
            raw.protocol = sourced(origin, protocol);
        }
        "route_device" => raw.device = sourced(origin, string(v, key)?.map(|d| device(d, key)).transpose()?),
        "route_state_dir" => {
            let dir = string(v, key)?.map(PathBuf::from);
            if let Some(d) = &dir
                && !d.is_absolute()
            {
                return Err(ConfigError::invalid(key, format!("{:?} is not an absolute path", d.display())));
            }
            raw.state_dir = sourced(origin, dir);
        }
        "propagation_timeout_ms" => raw.propagation = sourced(origin, uint(v, key)?.map(|n| wait(n, key)).transpose()?),
        "requested_address_retry_ms" => {
            raw.requested_retry = sourced(origin, uint(v, key)?.map(|n| wait(n, key)).transpose()?);
        }
        "exclude_first" => raw.exclude_first = sourced(origin, uint(v, key)?),
        "exclude_last" => raw.exclude_last = sourced(origin, uint(v, key)?),
        "announce_routes" => raw.announce = sourced(origin, boolean(v, key)?),
        _ => unreachable!("only KEYS are passed here"),
    }
    Ok(())
}

fn device(d: String, key: &str) -> Result<String, ConfigError> {
    // the kernel's IFNAMSIZ is 16 with the NUL
    if d.is_empty() || d.len() > 15 || d.contains(['/', ' ']) {
        return Err(ConfigError::invalid(key, format!("{d:?} is not a link name (1 to 15 characters, no '/')")));
    }
    Ok(d)
}

fn wait(n: u64, key: &str) -> Result<Duration, ConfigError> {
    if n > MAX_WAIT_MS {
        return Err(ConfigError::invalid(key, format!("{n}: must be 0 to {MAX_WAIT_MS} (milliseconds)")));
    }
    Ok(Duration::from_millis(n))
}

impl<'p> RawRouting<'p> {
    /// Whereabouts' merge: the inline value where there is one, else the flat file's.
    pub(super) fn merge(self, flat: Self) -> Self {
        Self {
            datastore: self.datastore.or(flat.datastore),
            table: self.table.or(flat.table),
            protocol: self.protocol.or(flat.protocol),
            device: self.device.or(flat.device),
            state_dir: self.state_dir.or(flat.state_dir),
            propagation: self.propagation.or(flat.propagation),
            requested_retry: self.requested_retry.or(flat.requested_retry),
            exclude_first: self.exclude_first.or(flat.exclude_first),
            exclude_last: self.exclude_last.or(flat.exclude_last),
            announce: self.announce.or(flat.announce),
        }
    }

    /// The datastore, the Kubernetes one unless `datastore` says `routetable`.
    pub(super) fn datastore(&self) -> Datastore {
        self.datastore.as_ref().map(|f| f.value).unwrap_or_default()
    }

    /// The host routes as the keys say (where a config installs any).
    fn routes(&self) -> HostRoutes {
        HostRoutes {
            table: self.table.as_ref().map_or(DEFAULT_ROUTE_TABLE, |f| f.value),
            protocol: self.protocol.as_ref().map_or(DEFAULT_ROUTE_PROTOCOL, |f| f.value),
            device: self.device.as_ref().map(|f| f.value.clone()),
            state_dir: self.state_dir.as_ref().map_or_else(|| PathBuf::from(DEFAULT_STATE_DIR), |f| f.value.clone()),
        }
    }

    /// With `announce_routes` (and the Kubernetes datastore), the routes ADD installs for each address.
    pub(super) fn announced(&self) -> Option<HostRoutes> {
        let announce = self.announce.as_ref().is_some_and(|f| f.value);
        (self.datastore() == Datastore::Kubernetes && announce).then(|| self.routes())
    }

    /// With the routing-table datastore, where its claims are.
    pub(super) fn route_table(&self) -> Option<HostRoutes> {
        (self.datastore() == Datastore::RouteTable).then(|| self.routes())
    }

    /// Checks the keys against the datastore and says what they make of the config. `others` are the keys of the
    /// rest of the config that need the API server, set or not.
    pub(super) fn check(&self, others: &[(&str, bool)]) -> Result<Routing, ConfigError> {
        let set = |f: Option<Origin<'_>>, k: &str| f.map(|o| o.key(k));
        let claim_keys = [
            set(self.propagation.as_ref().map(|f| f.origin), "propagation_timeout_ms"),
            set(self.requested_retry.as_ref().map(|f| f.origin), "requested_address_retry_ms"),
            set(self.exclude_first.as_ref().map(|f| f.origin), "exclude_first"),
            set(self.exclude_last.as_ref().map(|f| f.origin), "exclude_last"),
        ];
        let route_keys = [
            set(self.table.as_ref().map(|f| f.origin), "route_table"),
            set(self.protocol.as_ref().map(|f| f.origin), "route_protocol"),
            set(self.device.as_ref().map(|f| f.origin), "route_device"),
            set(self.state_dir.as_ref().map(|f| f.origin), "route_state_dir"),
        ];
        if self.datastore() == Datastore::Kubernetes {
            if let Some(key) = claim_keys.into_iter().flatten().next() {
                return Err(ConfigError::invalid(key, "only with \"datastore\": \"routetable\""));
            }
            let announce = self.announced();
            if announce.is_none()
                && let Some(key) = route_keys.into_iter().flatten().next()
            {
                return Err(ConfigError::invalid(
                    key,
                    "only with \"datastore\": \"routetable\" or \"announce_routes\": true",
                ));
            }
            return Ok(Routing::Kubernetes { announce });
        }
        if let Some(f) = &self.announce {
            return Err(ConfigError::invalid(
                f.origin.key("announce_routes"),
                "the routing-table datastore announces every address; the key is for the Kubernetes datastore",
            ));
        }
        if let Some((key, _)) = others.iter().find(|(_, set)| *set) {
            return Err(ConfigError::invalid(
                format!("ipam.{key}"),
                "not with \"datastore\": \"routetable\": it needs the API server, which that datastore does not use",
            ));
        }
        let claiming = Claiming {
            propagation: self.propagation.as_ref().map_or(DEFAULT_PROPAGATION, |f| f.value),
            requested_retry: self.requested_retry.as_ref().map_or(DEFAULT_REQUESTED_RETRY, |f| f.value),
            exclude_first: self.exclude_first.as_ref().map_or(0, |f| f.value),
            exclude_last: self.exclude_last.as_ref().map_or(0, |f| f.value),
        };
        Ok(Routing::RouteTable(RouteTable { routes: self.routes(), claiming }))
    }
}
