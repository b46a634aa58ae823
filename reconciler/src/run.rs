//! `run`: wires the caches, the node loop, the leader election, the cluster loop and the HTTP endpoints together,
//! and shuts them down in order on SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_ipam::provider::ProviderClient;
use hereabouts_ipam::store::{KubeStore, NODE_LABEL, node_label_value};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::http::{self, Health};
use crate::metrics::Metrics;
use crate::node_slices::{self, SliceKeeper};
use crate::pods::NodeLoop;
use crate::schedule::ScheduleSource;
use crate::sub_interfaces::{self, SubInterfaceKeeper};
use crate::{gauges, leader, sweep};
use hereabouts_ipam::reconcile::{KubeCluster, Releaser, parse_duration};

/// `run` flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What this instance does: `node` (the default) gives back what its node's pods held, takes part in the
    /// leader election for the cluster-wide work and, with `--agent-socket`, serves the node agent — one instance
    /// per node, as a DaemonSet; `cluster` does only the cluster-wide work, leader-elected, for every node's pods —
    /// the chart's controller Deployment, whose credentials then need not be on every node.
    #[arg(long, value_enum, default_value = "node")]
    scope: Scope,
    /// The node this instance serves (the DaemonSet passes spec.nodeName); `--scope node` only.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// The namespace of the pools and reservations (the DaemonSet's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    namespace: String,
    /// A kubeconfig; without it, the in-cluster service account (or the usual inference) is used.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The mounted ConfigMap: files `cron_expression` and `grace_period_seconds`.
    #[arg(long, default_value = "/etc/hereabouts")]
    config_dir: PathBuf,
    /// The CNI flat file, whose `reconciler_cron_expression` is used when the ConfigMap sets none.
    #[arg(long, default_value = "/host/etc/cni/net.d/hereabouts.d/hereabouts.conf")]
    flat_file: PathBuf,
    /// A schedule that overrides the ConfigMap and the flat file.
    #[arg(long)]
    cron_expression: Option<String>,
    /// Entries younger than this are never released on suspicion alone (an ADD may be in flight).
    #[arg(long, value_parser = parse_duration)]
    grace_period: Option<Duration>,
    /// A reservation no pool entry accounts for is released once its last claim is this old. It must be longer
    /// than any ADD can run: the longest `timeout_seconds`, the roll-back grace, and the API server's own request
    /// timeout for a write still in flight. A pool that replaced others (a changed range) must be this old before
    /// the leader moves their entries into it and retires them: no ADD under the old config is left then.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    orphan_age: Duration,
    /// How often the node loop looks at this node's entries and reservations without an event.
    #[arg(long, value_parser = parse_duration, default_value = "1m")]
    node_resync: Duration,
    /// How often the schedule source is re-read.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    reload_interval: Duration,
    /// Where /healthz, /readyz and /metrics are served, without authentication. Loopback by default: the pod
    /// shares the host's network, so any other address would be open to whatever reaches the node; the kubelet
    /// runs on the node and reaches it (the DaemonSet's probes name host 127.0.0.1). To scrape from elsewhere,
    /// choose an address deliberately and restrict who reaches it.
    #[arg(long, default_value = "127.0.0.1:9300")]
    listen: SocketAddr,
    /// The Lease that elects the instance running the cluster reconcile.
    #[arg(long, default_value = "hereabouts-reconciler")]
    lease_name: String,
    /// This instance's identity in the Lease (the DaemonSet passes the pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How often the leader reads the pools for the pool gauges (only the leader exports them).
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    gauge_interval: Duration,
    /// How often the leader gives Nodes without a slice one, and frees the slices of gone Nodes (slice mode).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    slice_interval: Duration,
    /// How long a gone Node's slice pool must stay empty before its slice is freed: longer than any ADD that may
    /// still be borrowing from it.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    slice_grace: Duration,
    /// Slice mode, mixed fleets: the label selector of the Nodes the leader gives a slice of each NodeSlicePool
    /// without their asking, as soon as they appear (Whereabouts' CNI in fast IPAM never claims one). Unset, no
    /// node is given one: a node running hereabouts claims its own on its first ADD. An empty selector selects
    /// every Node.
    #[arg(long)]
    assign_slices_to: Option<String>,
    /// The routing-table datastore's claim checker: `auto` runs it when the flat file (`--flat-file`) makes the
    /// routing-table datastore or `announce_routes` the node's default; `on` always, with the flat file's settings.
    #[arg(long, env = "HEREABOUTS_ROUTETABLE_CHECKER", value_enum, default_value = "auto")]
    routetable_checker: crate::route_checker::Switch,
    /// How often the claim checker judges this node's claims again.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    routetable_check_interval: Duration,
    /// How often the claim checker looks up the pods of this node's claims, to remove those of gone attachments.
    #[arg(long, value_parser = parse_duration, default_value = "1m")]
    routetable_tidy_interval: Duration,
    /// IaaS provider mode: a JSON file with the networks' `iaas_provider` section (url, ca_file, …). With it, the
    /// leader has the provider release the sub-interfaces cached on Nodes that are gone (every `slice_interval`).
    #[arg(long)]
    iaas_provider_config: Option<PathBuf>,
    /// The node agent: serve the CNI binary's invocations on this unix socket (on the host, under /run/hereabouts:
    /// the binary asks /run/hereabouts/agent.sock). Unset, the binary does every invocation itself.
    #[arg(long)]
    agent_socket: Option<PathBuf>,
    /// How many invocations the agent serves at once; more are left to the binary.
    #[arg(long, default_value_t = crate::agent::DEFAULT_CONCURRENCY)]
    agent_concurrency: usize,
    /// Where the agent keeps its warm reserve's journal (`warm_addresses`), on the host's disk.
    #[arg(long, default_value = crate::warm::DEFAULT_DIR)]
    agent_warm_dir: PathBuf,
}

/// What an instance of `run` does ([`Args::scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scope {
    /// One node's pods, the agent when asked, and a part in the leader election.
    Node,
    /// The cluster-wide work only, for every node's pods, leader-elected.
    Cluster,
}

/// The provider client of `--iaas-provider-config`, and one call's budget (its `http_request_timeout`).
fn provider_from(path: &std::path::Path) -> anyhow::Result<(ProviderClient, Duration)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let section =
        value.as_object().ok_or_else(|| anyhow::anyhow!("{}: expected the iaas_provider object", path.display()))?;
    // no invocation budget here: the section's own bounds (< 2m) are the limit
    let config = hereabouts_ipam::config::provider::parse(section, MAX_PROVIDER_CALL)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let client = ProviderClient::new(&config).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok((client, config.http_request_timeout.value))
}

const MAX_PROVIDER_CALL: Duration = Duration::from_secs(121);

const DEFAULT_GRACE: Duration = Duration::from_secs(60);

fn grace_from(args: &Args) -> anyhow::Result<Duration> {
    if let Some(grace) = args.grace_period {
        return Ok(grace);
    }
    let path = args.config_dir.join("grace_period_seconds");
    if !path.exists() {
        return Ok(DEFAULT_GRACE);
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    parse_duration(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

async fn client(args: &Args) -> anyhow::Result<Client> {
    // checked before kube reads the same variables, so that a bad one is reported as what it is
    let proxies = hereabouts_ipam::store::Proxies::from_env()?;
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await.context("no kubeconfig and no in-cluster service account")?,
    };
    let mut config = config;
    proxies.route(&mut config).await?;
    Ok(Client::try_from(config)?)
}

/// How often the reconciler takes the API server's time again ([`follow_server_clock`]).
const SERVER_CLOCK_EVERY: Duration = Duration::from_secs(300);

/// A skew the log warns of: NTP keeps machines far closer.
const SKEW_WARNED: k8s_openapi::jiff::SignedDuration = k8s_openapi::jiff::SignedDuration::from_secs(5);

/// Judges ages (a pod's grace, a reservation's orphan age, how long a Node has been missing) on the API server's
/// clock, as `kubectl hereabouts` does: a leader whose clock ran minutes fast would take an ADD's fresh
/// reservation for an orphan and delete it before the ADD's entry lands. Taken before the first pass, and every
/// [`SERVER_CLOCK_EVERY`] after; one that cannot be taken leaves the last one.
async fn follow_server_clock(client: &Client) {
    match hereabouts_ipam::clock::server_skew(client).await {
        Ok(skew) => {
            if skew.abs() > SKEW_WARNED {
                tracing::warn!(
                    skew_seconds = skew.as_secs_f64(),
                    "this node's clock is off the API server's: ages are judged by the API server's clock"
                );
            }
            hereabouts_ipam::clock::set_offset(skew);
        }
        Err(e) => {
            tracing::warn!(error = %e, "the API server's time cannot be told: ages are judged by this node's clock")
        }
    }
}

async fn keep_server_clock(client: Client) {
    loop {
        tokio::time::sleep(SERVER_CLOCK_EVERY).await;
        follow_server_clock(&client).await;
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let source = ScheduleSource {
        fixed: args.cron_expression.clone(),
        config_file: Some(args.config_dir.join("cron_expression")),
        flat_file: Some(args.flat_file.clone()),
    };
    // an invalid schedule or grace period is a start-up error, not a silent default
    let schedule = source.read()?;
    let grace = grace_from(&args)?;
    let provider = args.iaas_provider_config.as_deref().map(provider_from).transpose()?;
    let (node, identity) = scope_of(&args)?;
    // the kernel's routes are a node's: the claim checker runs where its node's routes are
    let route_claims = match node {
        Some(_) => crate::route_checker::settings(&args.flat_file, args.routetable_checker)?,
        None => None,
    };
    tracing::info!(scope = ?args.scope, node = node.as_deref().unwrap_or("every node"), namespace = %args.namespace,
        schedule = %schedule.expression, grace = ?grace, %identity, "starting");

    let client = client(&args).await?;
    follow_server_clock(&client).await;
    tokio::spawn(keep_server_clock(client.clone()));
    let shutdown = CancellationToken::new();
    let health = Arc::new(Health { ready: AtomicBool::new(false), metrics: Metrics::new() });
    let server = http::serve(args.listen, health.clone(), shutdown.clone()).await?;

    let reporter = Reporter { controller: "hereabouts-reconciler".into(), instance: Some(identity.clone()) };
    let releaser = Arc::new(Releaser {
        store: KubeStore::new(client.clone(), &args.namespace),
        cluster: KubeCluster::new(client.clone(), Recorder::new(client.clone(), reporter)),
        tally: health.clone(),
        grace,
        orphan_age: args.orphan_age,
        missing_nodes: Default::default(),
    });

    let (pool_cache, pool_writer) = reflector::store::<IpPool>();
    let pool_api = Api::<IpPool>::namespaced(client.clone(), &args.namespace);
    // Only this node's entries are kept (and those that name no node: Whereabouts writes none), so a node's
    // memory follows its own pods, not every pool of the cluster; the leader's sweep lists pools afresh. The
    // cluster scope keeps every entry: it gives back every node's.
    let kept = node.clone();
    // Small list pages: a page of whole pools is decoded at once before thinning, and that peak stays resident.
    let config = watcher::Config::default().page_size(POOL_PAGE);
    let thinned = watcher::watcher(pool_api, config).modify(move |pool| thin(pool, kept.as_deref()));
    let pool_stream = reflector::reflector(pool_writer, thinned).default_backoff().for_each(|event| async move {
        if let Err(e) = event {
            tracing::warn!(error = %e, "pool watch failed; retrying");
        }
    });
    // Only this node's reservations (the label the CNI sets): the node loop releases its node's orphans; the
    // cluster scope's loop every node's.
    let (reservation_cache, reservation_writer) = reflector::store::<OverlappingRangeIpReservation>();
    let reservation_api = Api::<OverlappingRangeIpReservation>::namespaced(client.clone(), &args.namespace);
    let reservations_watched = match node.as_deref() {
        None => watcher::Config::default(),
        Some(name) => match node_label_value(name) {
            Some(label) => watcher::Config::default().labels(&format!("{NODE_LABEL}={label}")),
            None => {
                tracing::warn!(node = %name, "the node name is not a label value: this node's orphaned \
                    reservations are left to the cluster reconcile");
                watcher::Config::default().labels(&format!("{NODE_LABEL}=-"))
            }
        },
    };
    let reservation_stream =
        reflector::reflector(reservation_writer, watcher::watcher(reservation_api, reservations_watched))
            .default_backoff()
            .for_each(|event| async move {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "reservation watch failed; retrying");
                }
            });

    let leadership = leader::Leadership::default();
    let (schedule_tx, schedule_rx) = watch::channel(schedule);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(server_task(server));
    let stop = shutdown.clone();
    tasks.spawn(async move {
        tokio::select! { () = stop.cancelled() => {}, () = pool_stream => {} }
    });
    let stop = shutdown.clone();
    tasks.spawn(async move {
        tokio::select! { () = stop.cancelled() => {}, () = reservation_stream => {} }
    });
    let node_loop = NodeLoop {
        releaser: releaser.clone(),
        pools: pool_cache,
        reservations: reservation_cache,
        node: node.clone(),
        resync_every: args.node_resync,
        leadership: node.is_none().then(|| leadership.clone()),
    };
    tasks.spawn(node_loop.run(Api::all(client.clone()), shutdown.clone()));
    let leases = Api::<Lease>::namespaced(client.clone(), &args.namespace);
    let lease_failures = health.metrics.lease_failures.clone();
    tasks.spawn(leader::run(
        leases,
        args.lease_name.clone(),
        identity.clone(),
        leadership.clone(),
        lease_failures,
        shutdown.clone(),
    ));
    let keeper = SliceKeeper::new(
        KubeStore::new(client.clone(), &args.namespace),
        Api::all(client.clone()),
        args.slice_grace,
        args.assign_slices_to.clone(),
    );
    let passes = health.metrics.node_slice_passes.clone();
    tasks.spawn(node_slices::run(keeper, leadership.clone(), args.slice_interval, passes, shutdown.clone()));
    if let Some((provider, call_budget)) = provider {
        let keeper =
            SubInterfaceKeeper { store: KubeStore::new(client.clone(), &args.namespace), provider, call_budget };
        let nodes = Api::all(client.clone());
        tasks.spawn(sub_interfaces::run(keeper, nodes, leadership.clone(), args.slice_interval, shutdown.clone()));
    }
    if let Some(routes) = route_claims {
        let reporter = Reporter { controller: "hereabouts-reconciler".into(), instance: Some(identity.clone()) };
        let checker = crate::route_checker::Checker {
            table: hereabouts_ipam::routetable::KernelTable::connect()?,
            routes,
            cluster: KubeCluster::new(client.clone(), Recorder::new(client.clone(), reporter)),
            health: health.clone(),
            grace,
            every: args.routetable_check_interval,
            tidy_every: args.routetable_tidy_interval,
        };
        tasks.spawn(checker.run(shutdown.clone()));
    }
    let pools = Api::<IpPool>::namespaced(client.clone(), &args.namespace);
    tasks.spawn(gauges::run(pools, health.clone(), leadership.clone(), args.gauge_interval, shutdown.clone()));
    let reporter = Reporter { controller: "hereabouts-reconciler".into(), instance: args.identity.clone() };
    tasks.spawn(crate::schema::run(
        client.clone(),
        Recorder::new(client.clone(), reporter),
        health.metrics.crd_schema_drift.clone(),
        leadership.clone(),
        shutdown.clone(),
    ));
    if let (Some(socket), Some(node)) = (&args.agent_socket, &node) {
        let agent = crate::agent::Args {
            socket: socket.clone(),
            node_name: node.clone(),
            concurrency: args.agent_concurrency,
            warm_dir: args.agent_warm_dir.clone(),
            follow: vec![crate::agent::DEFAULT_FOLLOW.into()],
            claim_ahead: true,
            listen: None,
        };
        let metrics = crate::agent::AgentMetrics::of(&health.metrics);
        let (stop, fleet) = (shutdown.clone(), client.clone());
        tasks.spawn(async move {
            if let Err(e) = crate::agent::serve(&agent, metrics, None, Some(fleet), stop).await {
                // the binary does the work itself: the node keeps working, only slower
                tracing::error!(error = format!("{e:#}"), "the agent cannot serve");
            }
        });
    }
    tasks.spawn(sweep::run(releaser, schedule_rx, leadership, shutdown.clone()));
    tasks.spawn(crate::schedule::watch_source(source, schedule_tx, args.reload_interval, shutdown.clone()));

    wait_for_signal().await?;
    tracing::info!("shutting down");
    shutdown.cancel();
    let drained = tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} });
    if drained.await.is_err() {
        tracing::warn!("tasks did not stop within 10 s");
    }
    Ok(())
}

/// Pools per page of the pool cache's list.
const POOL_PAGE: u32 = 4;

/// Drops the entries of `pool` that an ADD on another node than `node` wrote (`None`: keeps every entry).
fn thin(pool: &mut IpPool, node: Option<&str>) {
    if let Some(node) = node {
        pool.spec.allocations.retain(|_, a| a.node.as_deref().is_none_or(|n| n == node));
    }
    pool.metadata.managed_fields = None;
}

/// The node `args` serve (`None`: every node, the cluster scope) and the instance's identity in the Lease; what
/// the scope needs and lacks is a start-up error.
fn scope_of(args: &Args) -> anyhow::Result<(Option<String>, String)> {
    match args.scope {
        Scope::Node => {
            let node = args.node_name.clone().context("--scope node needs --node-name (NODE_NAME)")?;
            let identity = args.identity.clone().unwrap_or_else(|| node.clone());
            Ok((Some(node), identity))
        }
        Scope::Cluster => {
            if args.agent_socket.is_some() {
                anyhow::bail!("--agent-socket serves one node's invocations: it needs --scope node");
            }
            let identity = args.identity.clone().context(
                "--scope cluster needs --identity (POD_NAME): its replicas tell each other apart in the Lease by it",
            )?;
            Ok((None, identity))
        }
    }
}

async fn server_task(server: impl Future<Output = std::io::Result<()>>) {
    if let Err(e) = server.await {
        tracing::error!(error = %e, "HTTP server failed");
    }
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, thin};
    use hereabouts_ipam::crd::{IpAllocation, IpPool, IpPoolSpec};
    use std::time::Duration;

    #[test]
    fn a_node_keeps_its_own_entries_and_those_that_name_no_node() {
        let entry = |node: Option<&str>| IpAllocation { node: node.map(str::to_string), ..Default::default() };
        let allocations = [("1", Some("a")), ("2", Some("b")), ("3", None)]
            .into_iter()
            .map(|(k, n)| (k.to_string(), entry(n)))
            .collect();
        let mut pool =
            IpPool::new("p", IpPoolSpec { range: "198.18.0.0/24".into(), allocations, ..Default::default() });
        thin(&mut pool, Some("a"));
        assert_eq!(pool.spec.allocations.keys().collect::<Vec<_>>(), ["1", "3"]);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5d").is_err());
    }
}
