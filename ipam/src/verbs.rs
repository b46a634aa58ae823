//! The CNI verbs over a validated config: ADD, CHECK and STATUS of an [`IpamConfig`], DEL and GC of a
//! [`ReleaseConfig`]. Each matches on the mode once, here; what a mode does is in its own module ([`crate::pools`],
//! [`crate::slices`], [`crate::provider`], [`crate::routetable`]). The CNI binary reads the wire into a config and a
//! [`Request`], calls one of these, and writes the answer back; it decides nothing about modes.
//!
//! What an invocation needs of the machine it runs on — a store from a kubeconfig, the kernel's routing table, the
//! host lock's directory — comes through a [`Host`], so that tests can give their own.

use std::future::Future;
use std::path::{Path, PathBuf};

use crate::budget::Budget;
use crate::claim::{self, Layout, Scope};
use crate::codes::Code;
use crate::config::{ConfigError, IpamConfig, Kube, Mode, ReleaseConfig, ReleaseKube, ReleaseMode};
use crate::error::IpamError;
use crate::lock::{self, HostLock};
use crate::pools::{self, OnePool};
use crate::provider;
use crate::request::{Assigned, Attachment, Request};
use crate::routetable::{self, Bird, KernelTable, RouteTableError, RoutingDaemon, Table, TableError};
use crate::slices::{self, Sliced};
use crate::store::{self, ConnectError, KubeStore, PoolStore, Store};

/// What an invocation needs of the machine it runs on.
pub trait Host {
    /// The store a kubeconfig leads to.
    type Store: Store;
    /// The node's routing table.
    type Table: Table;

    /// A store from the kubeconfig at `path`, in the namespace its current context names.
    fn connect(&self, kubeconfig: &Path) -> impl Future<Output = Result<Self::Store, ConnectError>>;

    /// The node's routing table (the routing-table datastore, `announce_routes`).
    fn table(&self) -> Result<Self::Table, TableError>;

    /// Where the host lock's files go; `None`: invocations do not take turns.
    fn lock_dir(&self) -> Option<PathBuf>;

    /// Where the attachment marks go ([`crate::marks`]); `None`: every ADD looks for an earlier try's entry.
    fn marks_dir(&self) -> Option<PathBuf> {
        None
    }

    /// The node's boot, which the attachment marks are kept by; `None`: every ADD looks.
    fn boot_id(&self) -> Option<String> {
        crate::marks::boot_id()
    }

    /// The node's routing daemon, as the node's flat file describes it (the routing-table datastore).
    fn routing_daemon(&self, daemon: &crate::config::Daemon) -> impl RoutingDaemon + Send + Sync {
        Bird::new(&daemon.socket, daemon.settle)
    }

    /// The node's DNS servers, which no host route may take over: `/etc/resolv.conf`'s.
    fn nameservers(&self) -> Vec<std::net::IpAddr> {
        routetable::nameservers(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default())
    }

    /// Where the node agent keeps the journal of its warm reserve on `node` ([`crate::warm::journal`]), for the
    /// binary to read: `None`, nowhere.
    fn warm_journal(&self, _node: &str) -> Option<PathBuf> {
        None
    }

    /// The addresses of a slot of the node's warm reserve ([`crate::warm`]) for the attachment `req` of `cfg`:
    /// a new one for its `first` ADD on this node, the one it took already for a retry. `None`: the ADD claims
    /// its own. Only the node agent keeps a reserve; the binary only answers a retry the agent took a slot for
    /// (and did not answer) from the agent's journal.
    fn take_warm(
        &self,
        cfg: &IpamConfig,
        _mode: &crate::config::Slices,
        req: &Request,
        first: bool,
    ) -> impl Future<Output = Option<Vec<Assigned>>> {
        let taken = (!first).then(|| self.warm_journal(&req.node)).flatten().and_then(|dir| {
            crate::warm::read_take(&dir, &crate::warm::take_id(&cfg.name, &req.container_id, &req.ifname))
        });
        async move { taken.map(|t| t.slot.assigned()) }
    }

    /// Before a DEL or CHECK (`why`) of the attachment `req` of network `network`: ends what a warm take of it
    /// still has pending ([`WarmSettled`]). The binary, whose agent is away, hands the take over itself (every
    /// write of a hand-over may be sent twice) and leaves the journal to the agent.
    fn settle_warm(&self, network: &str, req: &Request, why: Settling) -> impl Future<Output = WarmSettled> {
        let _ = why; // the binary never gives a take back: it only hands over
        let taken = self.warm_journal(&req.node).and_then(|dir| {
            crate::warm::read_take(&dir, &crate::warm::take_id(network, &req.container_id, &req.ifname))
        });
        hand_over_alone(self, taken.into_iter().collect())
    }

    /// Before an ADD of the attachment `req` of `cfg` that no warm take answered looks for its entry in the API
    /// server: hands over what the node's journal holds pending of the attachment in any sandbox (see
    /// [`crate::warm::Reserves::settle_attachment`]). [`WarmSettled::Pending`]: the ADD must not claim an address.
    fn settle_attachment_warm(
        &self,
        cfg: &IpamConfig,
        _mode: &crate::config::Slices,
        req: &Request,
    ) -> impl Future<Output = WarmSettled> {
        let takes = self
            .warm_journal(&req.node)
            .map(|dir| crate::warm::read_attachment_takes(&dir, &cfg.name, &cfg.pod.to_string(), &req.ifname));
        hand_over_alone(self, takes.unwrap_or_default())
    }
}

/// The binary's hand-over of `takes` its agent, away, left pending: every write of a hand-over may be sent twice,
/// and the journal is left to the agent.
async fn hand_over_alone(host: &(impl Host + ?Sized), takes: Vec<crate::warm::Take>) -> WarmSettled {
    if takes.is_empty() {
        return WarmSettled::Nothing;
    }
    let budget = Budget::new(crate::config::DEFAULT_TIMEOUT);
    for take in takes {
        let Ok(store) = host.connect(&take.kubeconfig).await else { return WarmSettled::Pending };
        match crate::warm::hand_over(&store, std::slice::from_ref(&take), &budget).await.pop() {
            Some(Err(crate::warm::HandOverError::Later(_) | crate::warm::HandOverError::Unsent(_))) | None => {
                return WarmSettled::Pending;
            }
            Some(_) => {}
        }
    }
    WarmSettled::HandedOver
}

/// Why a pending warm take is settled: what may be done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settling {
    /// The attachment is going away: a take nothing of whose hand-over was sent may go back to the reserve.
    Del,
    /// The runtime asks whether the attachment still holds its address, at any time of a running container's life:
    /// its take is handed over or stays pending, never given back.
    Check,
}

/// What [`Host::settle_warm`] did with the attachment's warm take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmSettled {
    /// It has none pending: the verb goes on as always.
    Nothing,
    /// Its slot is the pod's in the API server now: the verb goes on as always.
    HandedOver,
    /// Its slot went back to the reserve before anything of it was written: nothing of the pod's is in the API
    /// server, so a DEL has nothing left to release.
    GivenBack,
    /// The hand-over could not finish (the API server away): it stays pending and ends later.
    Pending,
}

/// The machine itself: the API server a kubeconfig names, the kernel's routing table, the lock files under
/// [`lock::DEFAULT_DIR`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LiveHost;

impl Host for LiveHost {
    type Store = KubeStore;
    type Table = KernelTable;

    async fn connect(&self, kubeconfig: &Path) -> Result<KubeStore, ConnectError> {
        let (client, namespace) = store::connect(kubeconfig).await?;
        Ok(KubeStore::new(client, &namespace))
    }

    fn table(&self) -> Result<KernelTable, TableError> {
        KernelTable::connect()
    }

    fn lock_dir(&self) -> Option<PathBuf> {
        Some(PathBuf::from(lock::DEFAULT_DIR))
    }

    fn marks_dir(&self) -> Option<PathBuf> {
        Some(PathBuf::from(crate::marks::DEFAULT_DIR))
    }

    fn warm_journal(&self, _node: &str) -> Option<PathBuf> {
        Some(PathBuf::from(crate::warm::DEFAULT_DIR))
    }
}

/// A verb that failed: its CNI code and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{details}")]
pub struct VerbError {
    /// The CNI error code.
    pub code: Code,
    /// What went wrong, naming the object or key.
    pub details: String,
}

impl VerbError {
    /// An error of `code` with `details`.
    pub fn new(code: Code, details: impl Into<String>) -> Self {
        Self { code, details: details.into() }
    }
}

impl From<ConfigError> for VerbError {
    fn from(e: ConfigError) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

impl From<IpamError> for VerbError {
    fn from(e: IpamError) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

impl From<RouteTableError> for VerbError {
    fn from(e: RouteTableError) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

impl From<TableError> for VerbError {
    fn from(e: TableError) -> Self {
        RouteTableError::from(e).into()
    }
}

/// Which verb connects: STATUS says "not available" where the others say what is wrong with the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Add,
    Check,
    Status,
}

/// ADD: one address from each range of `cfg` for the attachment `req` (or, in provider mode, one per IP family of
/// the candidates). What the attachment holds already it gets back; a failure takes back what was written.
pub async fn add(host: &impl Host, cfg: &IpamConfig, req: &Request) -> Result<Vec<Assigned>, VerbError> {
    cfg.require_pod()?;
    let budget = Budget::new(cfg.timeout);
    let assigned = match &cfg.mode {
        Mode::RouteTable(mode) => {
            // fail closed: without every other node's claims, a free-looking address may be a live pod's
            host.routing_daemon(&mode.daemon).ready().await.map_err(RouteTableError::from)?;
            let nameservers = host.nameservers();
            let claimed = routetable::assign(&host.table()?, cfg, mode, req, &budget, &nameservers).await?;
            tracing::info!(
                ips = ?claimed.assigned.iter().map(|a| a.ip).collect::<Vec<_>>(),
                collisions = claimed.collisions,
                rounds = claimed.rounds,
                "ADD done"
            );
            return Ok(claimed.assigned);
        }
        Mode::Pools(mode) => {
            let store = connect(host, &mode.kube, Verb::Add).await?;
            let pod = claim::PodOnce::default();
            let chosen = claim::choose_ranges(&store, cfg, &mode.selection, &req.node, &pod, &budget).await?;
            let (cfg, mode) = match chosen {
                Some((keep, owner)) => mode.narrowed(cfg, &keep, owner),
                None => (cfg.clone(), mode.clone()),
            };
            let claim =
                claim::resolve_ipamclaim(&store, &cfg, &mode.persistent_ips, &req.ifname, &pod, &budget).await?;
            let cfg = match &claim {
                Some(claim) => claim.asking(&cfg)?,
                None => cfg,
            };
            let preferred = claim::preferred_ip(&store, &cfg, mode.preferred_ip, &pod, &budget).await?;
            let _lock = host_lock(host, &store, pools::locked(&cfg), &req.node, &budget).await;
            let assigned = pools::add(&store, &cfg, &mode, req, &budget, claim.as_ref(), preferred).await;
            announced(host, &store, &cfg, &mode.kube, &OnePool, req, &budget, assigned?).await?
        }
        Mode::Slices(mode) => {
            let first = match (host.marks_dir(), host.boot_id()) {
                (Some(dir), Some(boot)) => {
                    crate::marks::first_add(&dir, &boot, &cfg.name, &cfg.pod.to_string(), &req.ifname)
                }
                _ => false,
            };
            // an address of its own asked for, or ranges chosen per pod or node: not what a reserve holds
            if mode.warm > 0
                && cfg.requested.is_empty()
                && !mode.selection.is_active()
                && let Some(assigned) = host.take_warm(cfg, mode, req, first).await
            {
                tracing::info!(container_id = %req.container_id, ips = ?assigned.iter().map(|a| a.ip).collect::<Vec<_>>(), "ADD done from the warm reserve");
                return Ok(assigned);
            }
            if !first && host.settle_attachment_warm(cfg, mode, req).await == WarmSettled::Pending {
                return Err(VerbError::new(
                    Code::TryAgainLater,
                    format!(
                        "{} {}: a warm address an earlier sandbox of this attachment took is not handed over to the \
                         pod yet (the agent's log says why); no second address is claimed",
                        cfg.pod, req.ifname
                    ),
                ));
            }
            let store = connect(host, &mode.kube, Verb::Add).await?;
            let pod = claim::PodOnce::default();
            let chosen = claim::choose_ranges(&store, cfg, &mode.selection, &req.node, &pod, &budget).await?;
            let (cfg, mode) = match chosen {
                Some((keep, _)) => mode.narrowed(cfg, &keep),
                None => (cfg.clone(), mode.clone()),
            };
            let _lock = host_lock(host, &store, slices::locked(&cfg), &req.node, &budget).await;
            let assigned = slices::add(&store, &cfg, &mode, req, &budget, first).await;
            announced(host, &store, &cfg, &mode.kube, &Sliced, req, &budget, assigned?).await?
        }
        Mode::Provider(mode) => {
            let store = connect(host, &mode.kube, Verb::Add).await?;
            let _lock = host_lock(host, &store, pools::locked(cfg), &req.node, &budget).await;
            let assigned = provider::add(&store, cfg, mode, req, &budget).await;
            announced(host, &store, cfg, &mode.kube, &OnePool, req, &budget, assigned?).await?
        }
    };
    Ok(assigned)
}

/// Claims ahead, for the node agent when it sees a network of slice mode: `node`'s slice of each range with its
/// pool, claimed and created when the node holds none while at least half of the range is free, so that its first
/// ADDs only write their entries. Configs of other modes, and those whose ranges are chosen per pod or node, hold
/// nothing ahead. The slices `node` holds (empty: none held ahead); nothing is written for a pod.
pub async fn hold_slices(host: &impl Host, cfg: &IpamConfig, node: &str) -> Result<Vec<ipnet::IpNet>, VerbError> {
    let Mode::Slices(mode) = &cfg.mode else { return Ok(Vec::new()) };
    if mode.selection.is_active() || mode.kube.announce.is_some() {
        return Ok(Vec::new());
    }
    let budget = Budget::new(cfg.timeout);
    let store = connect(host, &mode.kube, Verb::Add).await?;
    let _lock = host_lock(host, &store, slices::locked(cfg), node, &budget).await;
    Ok(slices::hold(&store, cfg, mode, node, &budget).await?)
}

/// CHECK: the attachment `req` still holds what ADD gave it.
pub async fn check(host: &impl Host, cfg: &IpamConfig, req: &Request) -> Result<(), VerbError> {
    let budget = Budget::new(cfg.timeout);
    match &cfg.mode {
        Mode::RouteTable(mode) => routetable::check(&host.table()?, cfg, &mode.routes, req).await?,
        Mode::Pools(mode) => {
            let store = connect(host, &mode.kube, Verb::Check).await?;
            let pod = claim::PodOnce::default();
            let chosen = claim::choose_ranges(&store, cfg, &mode.selection, &req.node, &pod, &budget).await?;
            let (cfg, mode) = match chosen {
                Some((keep, owner)) => mode.narrowed(cfg, &keep, owner),
                None => (cfg.clone(), mode.clone()),
            };
            pools::check(&store, &Scope::of(&cfg, &mode.kube), req, &budget).await?;
        }
        Mode::Slices(mode) => {
            if host.settle_warm(&cfg.name, req, Settling::Check).await == WarmSettled::Pending {
                // the journal holds it for the pod, and the API server cannot be asked
                return Ok(());
            }
            let store = connect(host, &mode.kube, Verb::Check).await?;
            let pod = claim::PodOnce::default();
            let chosen = claim::choose_ranges(&store, cfg, &mode.selection, &req.node, &pod, &budget).await?;
            let (cfg, mode) = match chosen {
                Some((keep, _)) => mode.narrowed(cfg, &keep),
                None => (cfg.clone(), mode.clone()),
            };
            claim::check(&store, &Sliced, &Scope::of(&cfg, &mode.kube), req, &budget).await?;
        }
        Mode::Provider(mode) => {
            let store = connect(host, &mode.kube, Verb::Check).await?;
            provider::check(&store, cfg, mode, req, &budget).await?;
        }
    }
    Ok(())
}

/// STATUS: whether an ADD could work now — the API server answers and lets us read pools, or the routing table
/// and the node's records can be used.
pub async fn status(host: &impl Host, cfg: &IpamConfig) -> Result<(), VerbError> {
    let budget = Budget::new(cfg.timeout);
    let kube = match &cfg.mode {
        Mode::RouteTable(mode) => {
            routetable::status(&host.table()?, &mode.routes, &cfg.name).await?;
            // what an ADD would answer 11 to, STATUS answers "not available", as the spec has it
            return host
                .routing_daemon(&mode.daemon)
                .ready()
                .await
                .map_err(|e| VerbError::new(Code::NotAvailable, e.to_string()));
        }
        Mode::Pools(mode) => &mode.kube,
        Mode::Slices(mode) => &mode.kube,
        Mode::Provider(mode) => &mode.kube,
    };
    let store = connect(host, kube, Verb::Status).await?;
    match budget.run(store.probe()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(VerbError::new(Code::NotAvailable, e.to_string())),
        Err(e) => Err(VerbError::new(Code::NotAvailable, e.to_string())),
    }
}

/// DEL: releases what the attachment `req` holds. Whatever cannot be read or reached is logged and left to the
/// reconciler; only a failure that a retry can mend (the API server unreachable) is an error, so the runtime
/// tries again — a DEL that fails leaves a pod stuck terminating. Returns how many addresses were released.
pub async fn del(host: &impl Host, cfg: &ReleaseConfig, req: &Request) -> Result<usize, VerbError> {
    release(host, cfg, req, None).await
}

/// GC: releases what this network's attachments on this node hold that `valid` (the runtime's list) does not
/// name. As lenient as [`del`].
pub async fn gc(
    host: &impl Host,
    cfg: &ReleaseConfig,
    req: &Request,
    valid: &[Attachment],
) -> Result<usize, VerbError> {
    release(host, cfg, req, Some(valid)).await
}

async fn release(
    host: &impl Host,
    cfg: &ReleaseConfig,
    req: &Request,
    valid: Option<&[Attachment]>,
) -> Result<usize, VerbError> {
    for warning in &cfg.warnings {
        tracing::warn!(%warning, "config problem passed over");
    }
    let kube = match &cfg.mode {
        ReleaseMode::RouteTable(routes) => return remove_routes(host, cfg, routes, req, valid).await,
        ReleaseMode::Pools(kube) | ReleaseMode::Slices(kube) => kube,
    };
    // host routes first: a route left behind would advertise an address that is free again (one that cannot be
    // removed keeps its record, and the reconciler's claim checker removes it once its pod is gone)
    if let Some(routes) = &kube.announce {
        let removed = remove_routes(host, cfg, routes, req, valid).await?;
        tracing::info!(removed, "host routes removed");
    }
    let released = match &cfg.mode {
        ReleaseMode::Slices(kube) => {
            let settled = match valid {
                None => host.settle_warm(&cfg.name, req, Settling::Del).await,
                Some(_) => WarmSettled::Nothing,
            };
            match settled {
                WarmSettled::GivenBack => return Ok(0),
                // released now, the address would be handed over to the gone sandbox later, and a pod of the same
                // name would find it as its own: the runtime tries again once the API server answers
                WarmSettled::Pending => {
                    return Err(VerbError::new(
                        Code::TryAgainLater,
                        format!(
                            "container {}: the hand-over of its warm address to the pod could not finish yet (the \
                             agent's log says why)",
                            req.container_id
                        ),
                    ));
                }
                WarmSettled::Nothing | WarmSettled::HandedOver => {}
            }
            release_in(host, cfg, kube, &Sliced, req, valid).await?
        }
        ReleaseMode::Pools(kube) => release_in(host, cfg, kube, &OnePool, req, valid).await?,
        ReleaseMode::RouteTable(_) => 0,
    };
    Ok(released)
}

/// DEL or GC of the routing-table records and host routes of `routes`. Never fails: what cannot be removed is
/// logged and left to the next GC and the reconciler's claim checker, since a DEL that fails leaves its pod
/// Terminating and a retry would meet the same table and directory.
async fn remove_routes(
    host: &impl Host,
    cfg: &ReleaseConfig,
    routes: &crate::config::HostRoutes,
    req: &Request,
    valid: Option<&[Attachment]>,
) -> Result<usize, VerbError> {
    let table = match host.table() {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "the routing table cannot be used: host routes left to GC and the reconciler");
            return Ok(0);
        }
    };
    let removed = match valid {
        // an ADD under way has its record before the runtime lists its attachment; none runs longer than its budget
        Some(valid) => routetable::gc(&table, routes, &cfg.name, valid, cfg.timeout).await,
        None => routetable::release(&table, routes, &cfg.name, &req.container_id, &req.ifname).await,
    };
    Ok(removed.unwrap_or_else(|e| {
        tracing::error!(state_dir = %routes.state_dir.display(), error = %e,
            "host routes not removed: left to GC and the reconciler");
        0
    }))
}

/// DEL or GC on the API server, with the entries where `layout` says.
async fn release_in<H: Host>(
    host: &H,
    cfg: &ReleaseConfig,
    kube: &ReleaseKube,
    layout: &impl Layout<H::Store>,
    req: &Request,
    valid: Option<&[Attachment]>,
) -> Result<usize, VerbError> {
    if cfg.ranges.is_empty() {
        tracing::warn!("no range could be read from the config: nothing to release here; the reconciler will");
        return Ok(0);
    }
    let Some(kubeconfig) = &kube.kubeconfig else {
        tracing::warn!("no kubeconfig in the config: nothing released here; the reconciler will");
        return Ok(0);
    };
    let store = match host.connect(kubeconfig).await {
        Ok(store) => store,
        Err(e) => {
            tracing::warn!(error = %e, "cannot connect: nothing released here; the reconciler will");
            return Ok(0);
        }
    };
    let budget = Budget::new(cfg.timeout);
    let scope = Scope::of_release(cfg, kube);
    let objects = layout_objects(layout, &scope);
    let _lock = host_lock(host, &store, objects, &req.node, &budget).await;
    let outcome = match valid {
        Some(valid) => claim::gc(&store, layout, &scope, &req.node, valid, &budget).await,
        None => claim::release(&store, layout, &scope, req, &budget).await,
    };
    match outcome {
        Ok(released) => Ok(released),
        Err(e) if e.code() == Code::TryAgainLater => {
            tracing::error!(details = %e, "failed; the runtime will try again");
            Err(e.into())
        }
        Err(e) => {
            tracing::error!(code = e.code().number(), details = %e, "failed; left to the reconciler");
            Ok(0)
        }
    }
}

/// The objects a DEL or GC of `scope` writes, for the host lock.
fn layout_objects<S>(layout: &impl Layout<S>, scope: &Scope<'_>) -> Vec<String> {
    scope.ranges.iter().map(|r| layout.missing_in(scope, r)).collect()
}

/// The store of `kube`'s kubeconfig. A name the resolver cannot answer for now may answer later; a bad kubeconfig
/// will not; STATUS says only that the plugin is not available.
async fn connect<H: Host>(host: &H, kube: &Kube, verb: Verb) -> Result<H::Store, VerbError> {
    let Some(kubeconfig) = &kube.kubeconfig else {
        return Err(VerbError::new(
            Code::InvalidConfig,
            "ipam.kubernetes.kubeconfig is required (inline or in the flat file)",
        ));
    };
    host.connect(kubeconfig).await.map_err(|e| {
        let code = match e {
            _ if verb == Verb::Status => Code::NotAvailable,
            ConnectError::Resolve { .. } => Code::TryAgainLater,
            ConnectError::Proxy { .. } => Code::InvalidEnvironment,
            _ => Code::InvalidConfig,
        };
        VerbError::new(code, e.to_string())
    })
}

/// The host lock of `objects` ([`lock`]), waited for at most a third of what is left of the budget: past that,
/// the holder is likely stuck on an API server that does not answer, and going on without the lock is safe.
async fn host_lock(
    host: &impl Host,
    store: &impl PoolStore,
    objects: Vec<String>,
    node: &str,
    budget: &Budget,
) -> Option<HostLock> {
    let dir = host.lock_dir()?;
    let paths = objects.iter().map(|o| lock::key_path(&dir, store.namespace(), o, node)).collect();
    lock::acquire(paths, budget.remaining() / 3).await
}

/// `assigned`, once announced as host routes when the config asks (`announce_routes`): an address a routing daemon
/// cannot advertise is of no use to the pod, so a failure releases the allocation and fails the ADD.
#[allow(clippy::too_many_arguments)]
async fn announced<H: Host>(
    host: &H,
    store: &H::Store,
    cfg: &IpamConfig,
    kube: &Kube,
    layout: &impl Layout<H::Store>,
    req: &Request,
    budget: &Budget,
    assigned: Vec<Assigned>,
) -> Result<Vec<Assigned>, VerbError> {
    let Some(routes) = &kube.announce else { return Ok(assigned) };
    let outcome = match host.table() {
        Ok(table) => {
            routetable::announce(&table, routes, &cfg.name, req, &cfg.pod, &assigned, &host.nameservers()).await
        }
        Err(e) => Err(e.into()),
    };
    let Err(e) = outcome else { return Ok(assigned) };
    if let Err(back) = claim::release(store, layout, &Scope::of(cfg, kube), req, budget).await {
        tracing::error!(error = %back, "roll-back of the allocation failed; the reconciler will release it");
    }
    Err(e.into())
}

#[cfg(test)]
#[path = "verbs_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "verbs_warm_tests.rs"]
mod warm_tests;
