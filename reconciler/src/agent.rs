//! The node agent: serves the CNI binary's invocations on a unix socket (`hereabouts_cni::agent` is the wire), with
//! one long-lived client per kubeconfig instead of a process, a TLS handshake and a config read per ADD. It runs the
//! very verbs the binary runs (`hereabouts_cni::dispatch`), with the same guarded writes and the same host lock, so
//! its state is a cache, never the truth, and the binary can always do the work itself instead.
//!
//! Its invocations share one [`Shared`] store per kubeconfig: a first ADD plans on the pools it saw last, writes of
//! one pool that meet go as one patch, and concurrent claims plan around each other's offsets. That replaces the
//! host lock among its own invocations (it takes none: the binary's fallback still does, and the guards make the
//! two safe side by side); invocations of one attachment still take turns.
//!
//! It serves the modes that need only the API server (one pool per range, node slices). A config that uses the
//! host's routing table (the routing-table datastore, `announce_routes`) or an IaaS provider is declined: the
//! agent runs in its pod's network, not the host's, and the binary does those itself.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Context as _;
use hereabouts_cni::agent::{Accepted, Answer, Handed, MAX_REQUEST_BYTES};
use hereabouts_cni::env::Command;
use hereabouts_cni::{CniEnv, dispatch, output};
use hereabouts_ipam::config::{self, Mode, ReleaseMode};
use hereabouts_ipam::routetable::{KernelTable, TableError};
use hereabouts_ipam::store::{ConnectError, KubeStore, PoolStore as _, Shared, connect};
use hereabouts_ipam::verbs::Host;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::metrics::InvocationLabels;

/// How many invocations the agent does at once; more are declined, and their binaries do them.
pub const DEFAULT_CONCURRENCY: usize = 128;

/// The kubeconfig install-cni writes for the CNI binary, on the host and in the agent's container alike.
pub const DEFAULT_FOLLOW: &str = "/etc/cni/net.d/hereabouts.d/hereabouts.kubeconfig";

/// How long the agent waits for its watches to list the pools before it serves the socket anyway (its ADDs read
/// meanwhile, as the binary's do).
const FOLLOW_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a connection may take to send its request: the binary writes it at once, so a peer that does not is
/// not one, and is dropped rather than kept.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `agent` flags (and `run --agent-socket`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The unix socket to serve (made 0600; a stale one is replaced).
    #[arg(long, default_value = hereabouts_cni::agent::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// The node this agent runs on: the name ADDs key slices and reservations by when the runtime passes none.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// How many invocations are served at once.
    #[arg(long, default_value_t = DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Where the warm reserve's journal is kept (on the host's disk: it must outlive the agent's container).
    #[arg(long, default_value = crate::warm::DEFAULT_DIR)]
    pub warm_dir: PathBuf,
    /// Kubeconfigs whose pools the agent follows from its start (a watch of the node's slice pools and the
    /// NodeSlicePools; the chart names the one install-cni writes): it serves the socket once they are listed, or
    /// after 10 s. One that does not exist yet, and any other an invocation names, is followed from the first
    /// invocation that names it.
    #[arg(long = "follow")]
    pub follow: Vec<PathBuf>,
    /// Claim this node's slice of each hereabouts network of slice mode as its NetworkAttachmentDefinition appears
    /// (while at least half of the range is free), so that the node's first ADDs only write their entries. Needs
    /// the agent's own identity, allowed to list and watch NetworkAttachmentDefinitions.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub claim_ahead: bool,
    /// `agent` alone: where /healthz, /readyz (ready once the socket is served) and /metrics
    /// (`hereabouts_agent_invocations_total`) are served, without authentication; unset, nowhere.
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
}

/// The agent's view of the host: the API servers of the kubeconfigs it was handed, one client and one shared
/// store each, the client made again when the file changes (install-cni rotates the token in it); the attachment
/// marks; never the routing table, and no host lock ([`Shared`] coordinates the agent's own invocations).
#[derive(Debug, Clone, Default)]
pub struct AgentHost {
    clients: Arc<Mutex<HashMap<PathBuf, Connected>>>,
    attachments: Arc<Mutex<HashMap<String, std::sync::Weak<tokio::sync::Mutex<()>>>>>,
    /// The warm reserves (`warm_addresses`); `None`: none are kept.
    warm: Option<hereabouts_ipam::warm::Reserves<Shared<KubeStore>>>,
    /// The node whose pools each kubeconfig's store follows with a watch ([`crate::copies`]); `None`: none are
    /// followed, the store knows only what its invocations read and wrote.
    node: Option<Arc<str>>,
    /// Whether each followed kubeconfig's watches have listed everything.
    following: Arc<Mutex<HashMap<PathBuf, tokio::sync::watch::Receiver<bool>>>>,
    /// Objects the watches copied.
    pub(crate) copied: Counter,
}

/// A kubeconfig's store, and the file's modification time and length when it was read.
#[derive(Debug, Clone)]
struct Connected {
    modified: Option<SystemTime>,
    len: u64,
    store: Shared<KubeStore>,
}

impl AgentHost {
    /// What the agent's invocations of one kubeconfig's API server have written so far, summed over kubeconfigs.
    pub fn stats(&self) -> hereabouts_ipam::store::SharedStats {
        let clients = self.clients.lock().expect("not poisoned");
        clients.values().map(|c| c.store.stats()).fold(Default::default(), |a, s| hereabouts_ipam::store::SharedStats {
            writes: a.writes + s.writes,
            requests: a.requests + s.requests,
            split: a.split + s.split,
        })
    }

    /// Connects to `kubeconfig` (which starts following its pools) and waits up to `wait` for the watches to list
    /// them; whether they did.
    pub async fn follow(&self, kubeconfig: &Path, wait: std::time::Duration) -> bool {
        if let Err(e) = self.connect(kubeconfig).await {
            tracing::warn!(kubeconfig = %kubeconfig.display(), error = %e, "agent: cannot connect to follow the pools");
            return false;
        }
        let Some(mut synced) = self.following.lock().expect("not poisoned").get(kubeconfig).cloned() else {
            return false;
        };
        tokio::time::timeout(wait, synced.wait_for(|listed| *listed)).await.is_ok_and(|r| r.is_ok())
    }

    /// Starts following `kubeconfig`'s pools unless they are followed already.
    fn follow_in_background(&self, kubeconfig: &Path) {
        let Some(node) = self.node.clone() else { return };
        let mut following = self.following.lock().expect("not poisoned");
        if following.contains_key(kubeconfig) {
            return;
        }
        let (synced, listed) = tokio::sync::watch::channel(false);
        following.insert(kubeconfig.to_path_buf(), listed);
        tokio::spawn(crate::copies::follow(self.clone(), kubeconfig.to_path_buf(), node, synced));
    }

    /// Waits until no other invocation of the attachment `key` (container and interface) runs here: the runtime
    /// sends one at a time, but a binary that gave up on the agent and a retry may overlap.
    async fn attachment_turn(&self, key: String) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = {
            let mut known = self.attachments.lock().expect("not poisoned");
            known.retain(|_, t| t.strong_count() > 0);
            match known.get(&key).and_then(std::sync::Weak::upgrade) {
                Some(turn) => turn,
                None => {
                    let turn = Arc::new(tokio::sync::Mutex::new(()));
                    known.insert(key, Arc::downgrade(&turn));
                    turn
                }
            }
        };
        turn.lock_owned().await
    }
}

impl Host for AgentHost {
    type Store = Shared<KubeStore>;
    type Table = KernelTable;

    async fn connect(&self, kubeconfig: &Path) -> Result<Shared<KubeStore>, ConnectError> {
        let stamp = std::fs::metadata(kubeconfig).ok().map(|m| (m.modified().ok(), m.len()));
        let known = self.clients.lock().expect("not poisoned").get(kubeconfig).cloned();
        if let (Some((modified, len)), Some(known)) = (stamp, &known)
            && (known.modified, known.len) == (modified, len)
        {
            return Ok(known.store.for_invocation());
        }
        let (client, namespace) = connect(kubeconfig).await?;
        let inner = KubeStore::new(client, &namespace);
        // a new client for a rotated token keeps what the old one learnt
        let store = match known {
            Some(known) if known.store.namespace() == namespace => known.store.with_inner(inner),
            _ => Shared::new(inner),
        };
        if let Some((modified, len)) = stamp {
            let known = Connected { modified, len, store: store.clone() };
            self.clients.lock().expect("not poisoned").insert(kubeconfig.to_path_buf(), known);
            self.follow_in_background(kubeconfig);
        }
        Ok(store.for_invocation())
    }

    fn table(&self) -> Result<KernelTable, TableError> {
        Err(TableError::Netlink {
            op: "use the host's routing table",
            detail: "the agent declines such configs".into(),
        })
    }

    fn lock_dir(&self) -> Option<PathBuf> {
        None
    }

    fn marks_dir(&self) -> Option<PathBuf> {
        Some(PathBuf::from(hereabouts_ipam::marks::DEFAULT_DIR))
    }

    async fn take_warm(
        &self,
        cfg: &hereabouts_ipam::config::IpamConfig,
        mode: &hereabouts_ipam::config::Slices,
        req: &hereabouts_ipam::request::Request,
        first: bool,
    ) -> Option<Vec<hereabouts_ipam::request::Assigned>> {
        let (warm, kubeconfig) = (self.warm.as_ref()?, mode.kube.kubeconfig.as_ref()?);
        let store = self.connect(kubeconfig).await.ok()?;
        warm.take(cfg, mode, req, first, kubeconfig, store)
    }

    async fn settle_attachment_warm(
        &self,
        cfg: &hereabouts_ipam::config::IpamConfig,
        mode: &hereabouts_ipam::config::Slices,
        req: &hereabouts_ipam::request::Request,
    ) -> hereabouts_ipam::verbs::WarmSettled {
        let (Some(warm), Some(kubeconfig)) = (self.warm.as_ref(), mode.kube.kubeconfig.as_ref()) else {
            return hereabouts_ipam::verbs::WarmSettled::Nothing;
        };
        let store = self.connect(kubeconfig).await.ok();
        warm.settle_attachment(&cfg.name, &cfg.pod.to_string(), &req.ifname, kubeconfig, store).await
    }

    async fn settle_warm(
        &self,
        network: &str,
        req: &hereabouts_ipam::request::Request,
        why: hereabouts_ipam::verbs::Settling,
    ) -> hereabouts_ipam::verbs::WarmSettled {
        match &self.warm {
            Some(warm) => warm.settle(network, req, why).await,
            None => hereabouts_ipam::verbs::WarmSettled::Nothing,
        }
    }
}

/// Why the agent leaves an invocation to the binary, if it does.
fn declined(handed: &Handed, env: &CniEnv) -> Option<&'static str> {
    if env.command == Command::Version {
        return Some("VERSION is answered by the binary");
    }
    let input = config::Input { stdin: handed.stdin.as_bytes(), cni_args: &env.args };
    let (host_bound, kubeconfig) = match config::load(&input) {
        Ok(cfg) => match &cfg.mode {
            Mode::Pools(p) => (p.kube.announce.is_some(), Some(p.kube.kubeconfig.clone())),
            Mode::Slices(s) => (s.kube.announce.is_some(), Some(s.kube.kubeconfig.clone())),
            Mode::Provider(_) | Mode::RouteTable(_) => (true, None),
        },
        // a config the strict loader refuses: the agent says so as the binary would, unless DEL or GC would
        // still need the host for it
        Err(_) => match config::load_for_release(&input).mode {
            ReleaseMode::Pools(k) | ReleaseMode::Slices(k) => (k.announce.is_some(), None),
            ReleaseMode::RouteTable(_) => (true, None),
        },
    };
    if host_bound {
        return Some("the config uses the host's routing table or an IaaS provider");
    }
    // what the agent cannot see of the host's files (a flat file or kubeconfig outside the directories mounted into
    // its container) would make its answer differ from the binary's
    match kubeconfig {
        Some(Some(path)) if !path.exists() => Some("the config's kubeconfig is not where the agent can read it"),
        Some(None) => Some("the config names no kubeconfig the agent can read (its flat file may lie elsewhere)"),
        _ => None,
    }
}

/// `agent`: serves until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
        tokio::select! { _ = term.recv() => {}, _ = tokio::signal::ctrl_c() => {} }
        stop.cancel();
    });
    let health = Arc::new(crate::http::Health { ready: false.into(), metrics: crate::metrics::Metrics::new() });
    if let Some(addr) = args.listen {
        let server = crate::http::serve(addr, health.clone(), shutdown.clone()).await?;
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "agent: the HTTP endpoint stopped");
            }
        });
    }
    let metrics = AgentMetrics::of(&health.metrics);
    // the agent's own identity, when it has one, tells whether Whereabouts' reconciler runs (the CNI's token may
    // not list DaemonSets)
    let fleet = kube::Client::try_default().await.ok();
    serve(&args, metrics, Some(&health.ready), fleet, shutdown).await
}

/// The metrics the agent keeps.
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    pub invocations: Family<InvocationLabels, Counter>,
    pub warm_addresses: Family<crate::metrics::NetworkLabels, prometheus_client::metrics::gauge::Gauge>,
    pub warm_pending: prometheus_client::metrics::gauge::Gauge,
    pub warm_refused: prometheus_client::metrics::gauge::Gauge,
    pub copies: Counter,
}

impl AgentMetrics {
    /// The agent's metrics of `metrics`.
    pub fn of(metrics: &crate::metrics::Metrics) -> Self {
        Self {
            invocations: metrics.agent_invocations.clone(),
            warm_addresses: metrics.agent_warm_addresses.clone(),
            warm_pending: metrics.agent_warm_pending.clone(),
            warm_refused: metrics.agent_warm_refused.clone(),
            copies: metrics.agent_copies.clone(),
        }
    }

    /// Sets the warm reserve's gauges from what `warm` holds now.
    fn warm(&self, warm: &hereabouts_ipam::warm::Reserves<Shared<KubeStore>>) {
        for (network, held) in warm.held() {
            let labels = crate::metrics::NetworkLabels { network };
            self.warm_addresses.get_or_create(&labels).set(i64::try_from(held).unwrap_or(i64::MAX));
        }
        self.warm_pending.set(i64::try_from(warm.pending()).unwrap_or(i64::MAX));
        self.warm_refused.set(i64::from(warm.refused().is_some()));
    }
}

/// Serves `args.socket` until `shutdown`.
pub async fn serve(
    args: &Args,
    metrics: AgentMetrics,
    ready: Option<&std::sync::atomic::AtomicBool>,
    fleet: Option<kube::Client>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let ahead = fleet.clone().filter(|_| args.claim_ahead);
    let host = AgentHost {
        warm: Some(crate::warm::open(&args.node_name, &args.warm_dir, fleet)),
        node: Some(args.node_name.as_str().into()),
        copied: metrics.copies.clone(),
        ..Default::default()
    };
    // the socket is served once the copies its first ADDs plan on are there; until then the binary does them
    for kubeconfig in args.follow.iter().filter(|k| k.exists()) {
        let listed = host.follow(kubeconfig, FOLLOW_WAIT).await;
        tracing::info!(kubeconfig = %kubeconfig.display(), listed, "agent: following the node's pools");
    }
    if let Some(client) = ahead {
        tokio::spawn(crate::ahead::run(host.clone(), client, args.node_name.as_str().into()));
    }
    let listener = bind(&args.socket)?;
    if let Some(warm) = host.warm.clone() {
        let (metrics, stop) = (metrics.clone(), shutdown.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                metrics.warm(&warm);
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        });
    }
    let invocations = metrics.invocations;
    if let Some(ready) = ready {
        ready.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    tracing::info!(socket = %args.socket.display(), node = %args.node_name, "agent serving the CNI");
    let slots = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let node: Arc<str> = args.node_name.clone().into();
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "agent: accept failed");
                    continue;
                }
            },
        };
        let (host, slots, node, invocations) = (host.clone(), slots.clone(), node.clone(), invocations.clone());
        tokio::spawn(async move {
            if let Err(e) = handle(stream, &host, &slots, &node, &invocations).await {
                tracing::debug!(error = %e, "agent: connection ended");
            }
        });
    }
    // invocations under way finish on their own tasks until the process exits; new ones go to the binary
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}

fn bind(socket: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    // a socket left by an agent that died answers nobody: replace it
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("remove the stale {}", socket.display())),
    }
    let listener = UnixListener::bind(socket).with_context(|| format!("bind {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", socket.display()))?;
    Ok(listener)
}

async fn handle(
    stream: UnixStream,
    host: &AgentHost,
    slots: &Semaphore,
    node: &str,
    invocations: &Family<InvocationLabels, Counter>,
) -> anyhow::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    tokio::time::timeout(REQUEST_TIMEOUT, BufReader::new(read.take(MAX_REQUEST_BYTES)).read_line(&mut line))
        .await
        .context("no request within 5 s")??;
    let handed: Handed = serde_json::from_str(&line).context("the request does not parse")?;
    let mut vars: BTreeMap<String, String> = handed.env.clone();
    // the binary's fallback reads the host name; the agent's pod has its own, so the agent names its node
    vars.entry("NODENAME".into()).or_insert_with(|| node.to_string());
    let env = match CniEnv::from_lookup(|name| vars.get(name).cloned()) {
        Ok(env) => env,
        Err(e) => {
            // the binary finds the same mistake and says it in its own words
            return decline(&mut write, e.details, "invalid", invocations).await;
        }
    };
    let command = format!("{:?}", env.command).to_uppercase();
    if let Some(why) = declined(&handed, &env) {
        return decline(&mut write, why.into(), &command, invocations).await;
    }
    let Ok(_slot) = slots.try_acquire() else {
        return decline(&mut write, "the agent is at its concurrency limit".into(), &command, invocations).await;
    };
    send(&mut write, &Accepted { accepted: true, reason: None }).await?;
    let stdin = handed.stdin.as_bytes();
    let started = std::time::Instant::now();
    // the binary waits for the turn, the budget and a roll-back (answer_within): the turn is bounded so that it
    // never gives up and does the same attachment itself while this one is still at it
    let turn = host.attachment_turn(format!("{}\n{}", env.container_id, env.ifname));
    let outcome = match tokio::time::timeout(hereabouts_cni::agent::TURN_AT_MOST, turn).await {
        Ok(_turn) => dispatch(&env, stdin, host, |_, _| {}).await,
        Err(_) => Err(hereabouts_cni::CniError::new(
            hereabouts_ipam::codes::Code::TryAgainLater,
            format!(
                "container {}, interface {}: an invocation of the same attachment is still under way in the node agent",
                env.container_id, env.ifname
            ),
        )),
    };
    let answer = match outcome {
        Ok(stdout) => Answer { stdout, ok: true },
        Err(e) => Answer { stdout: Some(e.to_json(&output::requested_version(stdin))), ok: false },
    };
    let shared = host.stats();
    tracing::info!(command = %command, container_id = %env.container_id, ok = answer.ok,
        ms = started.elapsed().as_millis() as u64, pool_writes = shared.writes, pool_requests = shared.requests,
        "served");
    let labels = InvocationLabels { command, outcome: if answer.ok { "ok" } else { "failed" }.into() };
    invocations.get_or_create(&labels).inc();
    send(&mut write, &answer).await
}

async fn decline(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    reason: String,
    command: &str,
    invocations: &Family<InvocationLabels, Counter>,
) -> anyhow::Result<()> {
    invocations.get_or_create(&InvocationLabels { command: command.into(), outcome: "declined".into() }).inc();
    send(write, &Accepted { accepted: false, reason: Some(reason) }).await
}

async fn send(write: &mut tokio::net::unix::OwnedWriteHalf, line: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut bytes = serde_json::to_vec(line)?;
    bytes.push(b'\n');
    write.write_all(&bytes).await?;
    write.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(command: &str) -> CniEnv {
        let vars: BTreeMap<&str, &str> = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "net1"),
            ("CNI_ARGS", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"),
        ]
        .into();
        CniEnv::from_lookup(|name| vars.get(name).map(|v| v.to_string())).unwrap()
    }

    fn handed(ipam: serde_json::Value) -> Handed {
        let mut ipam = ipam;
        ipam["type"] = "hereabouts".into();
        let stdin = serde_json::json!({"cniVersion": "1.0.0", "name": "net", "type": "macvlan", "ipam": ipam});
        Handed { env: BTreeMap::new(), stdin: stdin.to_string() }
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_sends_no_request_is_dropped_and_an_unreadable_one_refused() {
        let invocations = Family::default();
        let slots = Semaphore::new(1);
        let (server, _client) = UnixStream::pair().unwrap();
        let silent = handle(server, &AgentHost::default(), &slots, "node-a", &invocations).await;
        assert!(silent.unwrap_err().to_string().contains("no request"), "dropped after the timeout");

        let (server, mut client) = UnixStream::pair().unwrap();
        client.write_all(b"not json\n").await.unwrap();
        let garbled = handle(server, &AgentHost::default(), &slots, "node-a", &invocations).await;
        assert!(garbled.unwrap_err().to_string().contains("does not parse"));
    }

    #[test]
    fn it_serves_what_needs_only_the_api_server_and_the_files_it_can_read() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, "").unwrap();
        let kube = serde_json::json!({"kubeconfig": kubeconfig});
        let plain = handed(serde_json::json!({"range": "198.18.0.0/24", "kubernetes": kube}));
        assert_eq!(declined(&plain, &env("ADD")), None);
        assert_eq!(declined(&plain, &env("DEL")), None);
        let sliced =
            handed(serde_json::json!({"range": "198.18.0.0/24", "node_slice_size": "/28", "kubernetes": kube}));
        assert_eq!(declined(&sliced, &env("ADD")), None);
        // a mistake in the config is answered as the binary would answer it
        let bad = handed(serde_json::json!({"range": "198.18.0.0/33", "kubernetes": kube}));
        assert_eq!(declined(&bad, &env("ADD")), None);

        let unseen = serde_json::json!({"kubeconfig": dir.path().join("absent")});
        let elsewhere = handed(serde_json::json!({"range": "198.18.0.0/24", "kubernetes": unseen}));
        assert!(declined(&elsewhere, &env("ADD")).is_some(), "a kubeconfig it cannot see");
        let table = handed(serde_json::json!({"range": "198.18.0.0/24", "datastore": "routetable"}));
        assert!(declined(&table, &env("ADD")).is_some(), "the host's routing table");
        assert!(declined(&table, &env("DEL")).is_some());
        assert!(declined(&plain, &env("VERSION")).is_some());
    }
}
