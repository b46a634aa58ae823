//! The keys of host routes: the routing-table datastore (`"datastore": "routetable"`, docs/routetable.md) and the Kubernetes mode's announcement of each allocated address (`announce_routes`).
//!
//! Both install one host route (a /32 or /128) per address, with a protocol number of their own, in a table of
//! their choice, so that a routing daemon can pick them out of the kernel's table and advertise them; both keep a
//! node-local record per address so that DEL and GC know which route belongs to which attachment
//! ([`crate::routetable::records`]).
//!
//! Where the routes go, where their records live and which daemon to ask ([`NODE_KEYS`]) are the node's: only the
//! node's own flat file sets them. Whoever writes a network's config (a NetworkAttachmentDefinition) could
//! otherwise point the plugin, which runs as root on the host, at any directory, table or socket of the node.

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
/// Where BIRD's control socket is unless `bird_socket` says otherwise (Debian's `bird2`).
pub const DEFAULT_BIRD_SOCKET: &str = "/run/bird/bird.ctl";
/// How long a BGP session must have been established before its initial exchange counts as done, unless
/// `bird_settle_ms` says otherwise (routetable/bird.rs says why a time).
pub const DEFAULT_BIRD_SETTLE: Duration = Duration::from_secs(3);
/// The longest `propagation_timeout_ms`, `requested_address_retry_ms` and `bird_settle_ms`: a minute, well inside
/// any budget.
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
    "bird_socket",
    "bird_settle_ms",
];

/// The keys only the node's own flat file may set: they name the node's links, tables, directories and sockets,
/// which the author of a network's config (a NetworkAttachmentDefinition) must not point the plugin at.
pub const NODE_KEYS: &[&str] =
    &["route_table", "route_protocol", "route_device", "route_state_dir", "bird_socket", "bird_settle_ms"];

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

/// The routing daemon the routing-table datastore asks whether this node has every other node's claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// `bird_socket`, default [`DEFAULT_BIRD_SOCKET`]: BIRD's control socket.
    pub socket: PathBuf,
    /// `bird_settle_ms`, default [`DEFAULT_BIRD_SETTLE`]: how long a session must have been established.
    pub settle: Duration,
}

/// The routing-table datastore's settings: [`super::Mode::RouteTable`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTable {
    /// Where the claims go, as host routes.
    pub routes: HostRoutes,
    /// How an address is claimed.
    pub claiming: Claiming,
    /// Whom an ADD asks first.
    pub daemon: Daemon,
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
    pub bird_socket: Field<'p, PathBuf>,
    pub bird_settle: Field<'p, Duration>,
    /// Node keys the inline config set where the flat file sets them too: the flat file's value is kept (a lenient
    /// DEL must find the node's records), and strict loading still refuses the config for them.
    pub overridden: Vec<(&'static str, Origin<'p>)>,
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
        "route_state_dir" => raw.state_dir = sourced(origin, absolute(v, key)?),
        "bird_socket" => raw.bird_socket = sourced(origin, absolute(v, key)?),
        "bird_settle_ms" => raw.bird_settle = sourced(origin, uint(v, key)?.map(|n| wait(n, key)).transpose()?),
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

fn absolute(v: &Value, key: &str) -> Result<Option<PathBuf>, ConfigError> {
    let path = string(v, key)?.map(PathBuf::from);
    if let Some(p) = &path
        && !p.is_absolute()
    {
        return Err(ConfigError::invalid(key, format!("{:?} is not an absolute path", p.display())));
    }
    Ok(path)
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
    /// Node keys are the flat file's where it has them.
    pub(super) fn merge(self, flat: Self) -> Self {
        let overridden = self
            .node_keys()
            .into_iter()
            .zip(flat.node_keys())
            .filter_map(|((key, inline), (_, node))| inline.filter(|_| node.is_some()).map(|o| (key, o)))
            .collect();
        Self {
            datastore: self.datastore.or(flat.datastore),
            table: flat.table.or(self.table),
            protocol: flat.protocol.or(self.protocol),
            device: flat.device.or(self.device),
            state_dir: flat.state_dir.or(self.state_dir),
            propagation: self.propagation.or(flat.propagation),
            requested_retry: self.requested_retry.or(flat.requested_retry),
            exclude_first: self.exclude_first.or(flat.exclude_first),
            exclude_last: self.exclude_last.or(flat.exclude_last),
            announce: self.announce.or(flat.announce),
            bird_socket: flat.bird_socket.or(self.bird_socket),
            bird_settle: flat.bird_settle.or(self.bird_settle),
            overridden,
        }
    }

    /// The datastore, the Kubernetes one unless `datastore` says `routetable`.
    pub(super) fn datastore(&self) -> Datastore {
        self.datastore.as_ref().map(|f| f.value).unwrap_or_default()
    }

    /// The node keys as given, each with where it came from.
    fn node_keys(&self) -> [(&'static str, Option<Origin<'p>>); 6] {
        [
            ("route_table", self.table.as_ref().map(|f| f.origin)),
            ("route_protocol", self.protocol.as_ref().map(|f| f.origin)),
            ("route_device", self.device.as_ref().map(|f| f.origin)),
            ("route_state_dir", self.state_dir.as_ref().map(|f| f.origin)),
            ("bird_socket", self.bird_socket.as_ref().map(|f| f.origin)),
            ("bird_settle_ms", self.bird_settle.as_ref().map(|f| f.origin)),
        ]
    }

    /// The first node key ([`NODE_KEYS`]) that comes from somewhere else than the node's own flat file: the
    /// inline config, or a flat file the network's config chose with `configuration_path` (`chosen_file`), which
    /// may be any file on the node, one a pod wrote included.
    fn foreign_node_key(&self, chosen_file: bool) -> Option<ConfigError> {
        let set = self.overridden.iter().map(|(k, o)| (*k, Some(*o))).chain(self.node_keys());
        let (key, origin) =
            set.into_iter().find_map(|(k, o)| o.filter(|o| !trusted(*o, chosen_file)).map(|o| (k, o)))?;
        let why = match origin {
            Origin::Inline => "a node setting: only the node's own flat file sets it, not the network's config",
            Origin::FlatFile(_) => {
                "a node setting: only the node's own flat file sets it, not one the network's config names with \
                 configuration_path"
            }
        };
        Some(ConfigError::invalid(origin.key(key), why))
    }

    /// The host routes as the node's keys say (where a config installs any); a node key from anywhere else is
    /// passed over (strict loading refuses it first, [`Self::check`]).
    fn routes(&self, chosen_file: bool) -> HostRoutes {
        let node = |o: Origin<'_>| trusted(o, chosen_file);
        HostRoutes {
            table: self.table.as_ref().filter(|f| node(f.origin)).map_or(DEFAULT_ROUTE_TABLE, |f| f.value),
            protocol: self.protocol.as_ref().filter(|f| node(f.origin)).map_or(DEFAULT_ROUTE_PROTOCOL, |f| f.value),
            device: self.device.as_ref().filter(|f| node(f.origin)).map(|f| f.value.clone()),
            state_dir: self
                .state_dir
                .as_ref()
                .filter(|f| node(f.origin))
                .map_or_else(|| PathBuf::from(DEFAULT_STATE_DIR), |f| f.value.clone()),
        }
    }

    /// With `announce_routes` (and the Kubernetes datastore), the routes ADD installs for each address.
    pub(super) fn announced(&self, chosen_file: bool) -> Option<HostRoutes> {
        let announce = self.announce.as_ref().is_some_and(|f| f.value);
        (self.datastore() == Datastore::Kubernetes && announce).then(|| self.routes(chosen_file))
    }

    /// With the routing-table datastore, where its claims are.
    pub(super) fn route_table(&self, chosen_file: bool) -> Option<HostRoutes> {
        (self.datastore() == Datastore::RouteTable).then(|| self.routes(chosen_file))
    }

    /// Checks the keys against the datastore and says what they make of the config. `others` are the keys of the
    /// rest of the config that need the API server, set or not; `chosen_file`, whether the flat file read is one
    /// the config named (`configuration_path`) rather than the node's own.
    pub(super) fn check(&self, others: &[(&str, bool)], chosen_file: bool) -> Result<Routing, ConfigError> {
        if let Some(e) = self.foreign_node_key(chosen_file) {
            return Err(e);
        }
        let set = |f: Option<Origin<'_>>, k: &str| f.map(|o| o.key(k));
        let claim_keys = [
            set(self.propagation.as_ref().map(|f| f.origin), "propagation_timeout_ms"),
            set(self.requested_retry.as_ref().map(|f| f.origin), "requested_address_retry_ms"),
            set(self.exclude_first.as_ref().map(|f| f.origin), "exclude_first"),
            set(self.exclude_last.as_ref().map(|f| f.origin), "exclude_last"),
        ];
        if self.datastore() == Datastore::Kubernetes {
            if let Some(key) = claim_keys.into_iter().flatten().next() {
                return Err(ConfigError::invalid(key, "only with \"datastore\": \"routetable\""));
            }
            // the node keys are the node's, shared by every network on it: a network that uses none of them is
            // not wrong to leave them alone
            let announce = self.announced(chosen_file);
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
        let daemon = Daemon {
            socket: self.bird_socket.as_ref().map_or_else(|| PathBuf::from(DEFAULT_BIRD_SOCKET), |f| f.value.clone()),
            settle: self.bird_settle.as_ref().map_or(DEFAULT_BIRD_SETTLE, |f| f.value),
        };
        Ok(Routing::RouteTable(RouteTable { routes: self.routes(chosen_file), claiming, daemon }))
    }
}

/// The routing settings of a node, as its own flat file says (the reconciler's claim checker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRouting {
    /// `"datastore": "routetable"` is the node's default.
    pub route_table: bool,
    /// `"announce_routes": true` is the node's default.
    pub announce: bool,
    /// The host routes and their records.
    pub routes: HostRoutes,
    /// The routing daemon.
    pub daemon: Daemon,
}

impl Default for NodeRouting {
    /// A node without a flat file.
    fn default() -> Self {
        Self {
            route_table: false,
            announce: false,
            routes: RawRouting::default().routes(false),
            daemon: Daemon { socket: PathBuf::from(DEFAULT_BIRD_SOCKET), settle: DEFAULT_BIRD_SETTLE },
        }
    }
}

/// The routing settings of the node's flat file at `path` (the defaults where it sets none).
pub fn node_routing(path: &std::path::Path) -> Result<NodeRouting, ConfigError> {
    let raw = super::flatfile::read(path, &mut super::json::Problems::strict())?.routing;
    let daemon = Daemon {
        socket: raw.bird_socket.as_ref().map_or_else(|| PathBuf::from(DEFAULT_BIRD_SOCKET), |f| f.value.clone()),
        settle: raw.bird_settle.as_ref().map_or(DEFAULT_BIRD_SETTLE, |f| f.value),
    };
    Ok(NodeRouting {
        route_table: raw.datastore() == Datastore::RouteTable,
        announce: raw.announce.as_ref().is_some_and(|f| f.value),
        routes: raw.routes(false),
        daemon,
    })
}

/// Whether a node key from `origin` is the node's administrator's: the node's own flat file, not the inline
/// config nor a file the config chose.
fn trusted(origin: Origin<'_>, chosen_file: bool) -> bool {
    matches!(origin, Origin::FlatFile(_)) && !chosen_file
}
