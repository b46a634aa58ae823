//! One module per CNI verb; [`dispatch`] reads the config, starts logging and connects, in that order, so a bad
//! config never costs a client. ADD, CHECK and STATUS read the config strictly; DEL and GC leniently, since the
//! runtime replays to them the config it cached at ADD and a DEL that fails leaves a pod stuck terminating.

mod add;
mod check;
mod del;
mod gc;
mod routetable;
mod status;

use std::future::Future;
use std::path::Path;

use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::codes::Code;
use hereabouts_ipam::config::{self, LogLevel};
use hereabouts_ipam::ipam::{self, Request, Scope};
use hereabouts_ipam::names;
use hereabouts_ipam::store::{self, ConnectError, KubeStore, Store};

use crate::env::{CniEnv, Command};
use crate::error::CniError;
use crate::lock::{self, HostLock};
use crate::output;

/// What the plugin needs from the machine it runs on: a store from a kubeconfig, and logging. Tests provide
/// their own (an in-memory store, no log files).
pub trait Connector {
    /// The store it connects to.
    type Store: Store;

    /// Starts logging to `log_file` (else stderr) at `level`.
    fn init_logging(&self, log_file: Option<&Path>, level: LogLevel);

    /// A store from the kubeconfig at `path`, in the namespace its current context names.
    fn connect(&self, kubeconfig: &Path) -> impl Future<Output = Result<Self::Store, ConnectError>>;
}

/// The real thing: the API server the kubeconfig names.
#[derive(Debug, Clone, Copy)]
pub struct LiveConnector;

impl Connector for LiveConnector {
    type Store = KubeStore;

    fn init_logging(&self, log_file: Option<&Path>, level: LogLevel) {
        crate::logging::init(log_file, level);
    }

    async fn connect(&self, kubeconfig: &Path) -> Result<KubeStore, ConnectError> {
        let (client, namespace) = store::connect(kubeconfig).await?;
        Ok(KubeStore::new(client, &namespace))
    }
}

/// Runs the verb of `env` on the config in `stdin`; returns what goes to stdout on success.
pub async fn dispatch<C: Connector>(env: &CniEnv, stdin: &[u8], host: &C) -> Result<Option<String>, CniError> {
    match env.command {
        Command::Version => Ok(Some(output::version_result(stdin))),
        Command::Del | Command::Gc => release(env, stdin, host).await,
        Command::Add | Command::Check | Command::Status => strict(env, stdin, host).await,
    }
}

fn span(env: &CniEnv, pod: &str) -> tracing::Span {
    tracing::info_span!(
        "cni",
        command = ?env.command,
        container_id = %env.container_id,
        ifname = %env.ifname,
        pod = %pod,
    )
}

fn request(env: &CniEnv, flat_file: Option<&Path>) -> Request {
    let node = crate::node::node_name(env.node.as_deref(), flat_file);
    Request { container_id: env.container_id.clone(), ifname: env.ifname.clone(), node }
}

/// ADD, CHECK and STATUS: a mistake in the config is an error that names it, and nothing is written.
async fn strict<C: Connector>(env: &CniEnv, stdin: &[u8], host: &C) -> Result<Option<String>, CniError> {
    let cfg = config::load(&config::Input { stdin, cni_args: &env.args })?;
    host.init_logging(cfg.log_file.as_deref(), cfg.log_level);
    let _entered = span(env, &cfg.pod.to_string()).entered();
    if env.command == Command::Add {
        cfg.require_pod()?;
    }
    let budget = Budget::new(cfg.timeout);
    if cfg.datastore == config::Datastore::RouteTable {
        let req = request(env, cfg.flat_file.as_deref());
        let outcome = routetable::strict(env, &cfg, &req, &budget).await;
        if let Err(e) = &outcome {
            tracing::error!(code = e.code.number(), msg = e.msg(), details = %e.details, "failed");
        }
        return outcome;
    }
    let Some(kubeconfig) = &cfg.kubeconfig else {
        return Err(CniError::new(
            Code::InvalidConfig,
            "ipam.kubernetes.kubeconfig is required (inline or in the flat file)",
        ));
    };
    let store = host.connect(kubeconfig).await.map_err(|e| {
        // A name the resolver cannot answer for now may answer later; a bad kubeconfig will not.
        let code = match e {
            _ if env.command == Command::Status => Code::NotAvailable,
            ConnectError::Resolve { .. } => Code::TryAgainLater,
            _ => Code::InvalidConfig,
        };
        CniError::new(code, e.to_string())
    })?;
    let req = request(env, cfg.flat_file.as_deref());
    let outcome = async {
        // ranges chosen per pod or node: ADD and CHECK use only those (a config that chooses nothing reads nothing)
        let chosen = match env.command {
            Command::Add | Command::Check => ipam::choose_ranges(&store, &cfg, &req.node, &budget).await?,
            _ => None,
        };
        let cfg = chosen.as_ref().unwrap_or(&cfg);
        let _lock = match env.command {
            Command::Add => host_lock(&store, &Scope::from(cfg), &req.node, &budget).await,
            _ => None,
        };
        match env.command {
            Command::Add => add::run(&store, cfg, &req, &budget).await.map(Some),
            Command::Check => check::run(&store, cfg, &req, &budget).await.map(|()| None),
            _ => status::run(&store, &budget).await.map(|()| None),
        }
    }
    .await;
    if let Err(e) = &outcome {
        tracing::error!(code = e.code.number(), msg = e.msg(), details = %e.details, "failed");
    }
    outcome
}

/// DEL and GC: whatever they cannot read or reach is logged and left to the reconciler; only a failure that a
/// retry can mend (the API server unreachable) is an error, so the runtime tries again.
async fn release<C: Connector>(env: &CniEnv, stdin: &[u8], host: &C) -> Result<Option<String>, CniError> {
    let cfg = config::load_for_release(&config::Input { stdin, cni_args: &env.args });
    host.init_logging(cfg.log_file.as_deref(), cfg.log_level);
    let _entered = span(env, &cfg.pod.to_string()).entered();
    for warning in &cfg.warnings {
        tracing::warn!(%warning, "config problem passed over");
    }
    let valid = match env.command {
        Command::Gc => Some(gc::valid_attachments(stdin)?),
        _ => None,
    };
    let req = request(env, cfg.flat_file.as_deref());
    if cfg.host_routes.is_some() {
        // host routes first: with the routing-table datastore they are all there is; in the Kubernetes mode a
        // route left behind would advertise an address that is free again
        match routetable::release(&cfg, &req, valid.as_deref()).await {
            Ok(n) => tracing::info!(released = n, "host routes removed"),
            Err(e) => {
                tracing::error!(code = e.code.number(), details = %e.details, "host routes not removed");
                return Err(e);
            }
        }
        if cfg.datastore == config::Datastore::RouteTable {
            return Ok(None);
        }
    }
    if cfg.ranges.is_empty() {
        tracing::warn!("no range could be read from the config: nothing to release here; the reconciler will");
        return Ok(None);
    }
    let Some(kubeconfig) = &cfg.kubeconfig else {
        tracing::warn!("no kubeconfig in the config: nothing released here; the reconciler will");
        return Ok(None);
    };
    let store = match host.connect(kubeconfig).await {
        Ok(store) => store,
        Err(e) => {
            tracing::warn!(error = %e, "cannot connect: nothing released here; the reconciler will");
            return Ok(None);
        }
    };
    let budget = Budget::new(cfg.timeout);
    let _lock = host_lock(&store, &Scope::from(&cfg), &req.node, &budget).await;
    let outcome = match valid {
        Some(valid) => gc::run(&store, &cfg, &req.node, &valid, &budget).await,
        None => del::run(&store, &cfg, &req, &budget).await,
    };
    match outcome {
        Ok(()) => Ok(None),
        Err(e) if e.code == Code::TryAgainLater => {
            tracing::error!(details = %e.details, "failed; the runtime will try again");
            Err(e)
        }
        Err(e) => {
            tracing::error!(code = e.code.number(), details = %e.details, "failed; left to the reconciler");
            Ok(None)
        }
    }
}

/// The host lock of the pools an invocation writes ([`lock`]), waited for at most a third of what is left of
/// the budget: past that, the holder is likely stuck on an API server that does not answer, and going on
/// without the lock is safe.
async fn host_lock<S: Store>(store: &S, scope: &Scope<'_>, node: &str, budget: &Budget) -> Option<HostLock> {
    let dir = std::path::Path::new(lock::DEFAULT_DIR);
    // in slice mode, the node's slices of the network: one lock for them all
    let objects: Vec<String> = match scope.sliced {
        true => vec![names::node_slice_pool_name(scope.network_name, scope.network)],
        false => scope.ranges.iter().map(|r| names::pool_name(scope.network_name, r.cidr())).collect(),
    };
    let paths = objects.iter().map(|o| lock::key_path(dir, store.namespace(), o, node)).collect();
    lock::acquire(paths, budget.remaining() / 3).await
}
