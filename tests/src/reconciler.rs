//! Running `hereabouts-reconciler run` as a process against the test control plane, as the DaemonSet would.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::objects::mk_pod;
use crate::plugin::{Invocation, netconf, workspace_bin};
use crate::{Identity, TestCluster, deploy, wait};

/// A running reconciler; killed when dropped.
#[derive(Debug)]
pub struct Reconciler {
    child: Option<Child>,
    pub listen: String,
    pub log: PathBuf,
    netns: Option<String>,
}

/// How to start one.
#[derive(Debug, Clone)]
pub struct ReconcilerOptions {
    /// `--node-name`, unless `cluster`.
    pub node: String,
    /// `--scope cluster` (the controller Deployment's): every node's pods, no `--node-name`.
    pub cluster: bool,
    pub namespace: String,
    pub identity: String,
    pub cron: String,
    pub grace: String,
    /// `--orphan-age`: tests' ADDs take milliseconds, so a claim a couple of seconds old is abandoned.
    pub orphan_age: String,
    pub lease: String,
    /// A kubeconfig to use instead of the restricted identity's (e.g. one through a fault proxy).
    pub kubeconfig: Option<PathBuf>,
    /// `--node-resync`: how often the node loop looks again without an event.
    pub node_resync: String,
    /// `--slice-interval` and `--slice-grace`: the leader's node-slice passes.
    pub slice_interval: String,
    /// `--gauge-interval`: how often the leader reads the pools for the gauges.
    pub gauge_interval: String,
    pub slice_grace: String,
    /// More arguments of `run` (e.g. `--iaas-provider-config`).
    pub extra_args: Vec<String>,
    /// A simulated node's network namespace to run in (`ip netns exec`): its routing table, its own `/etc`
    /// entries, and its relay to the API server. Its HTTP endpoint is then that namespace's loopback.
    pub netns: Option<String>,
    /// `--flat-file`; by default one that does not exist.
    pub flat_file: Option<PathBuf>,
    /// More environment (e.g. a clock set wrong: `hereabouts_ipam::clock::SKEW_FOR_TESTS`).
    pub env: Vec<(String, String)>,
}

impl ReconcilerOptions {
    /// Node `node`, pools in `namespace`, cron every 2 s, grace 1 s.
    pub fn new(node: &str, namespace: &str) -> Self {
        Self {
            node: node.into(),
            cluster: false,
            namespace: namespace.into(),
            identity: format!("reconciler-{node}"),
            cron: "*/2 * * * * *".into(),
            grace: "1s".into(),
            orphan_age: "2s".into(),
            kubeconfig: None,
            node_resync: "2s".into(),
            slice_interval: "1s".into(),
            gauge_interval: "1s".into(),
            slice_grace: "2s".into(),
            extra_args: Vec::new(),
            netns: None,
            flat_file: None,
            env: Vec::new(),
            // the Role allows the reconciler this one Lease; Leases are per namespace, so tests do not collide
            lease: deploy::LEASE_NAME.into(),
        }
    }
}

impl Reconciler {
    /// Starts a reconciler as [`Identity::Restricted`] and waits until `/readyz` answers ok.
    pub async fn start(cluster: &TestCluster, opts: &ReconcilerOptions) -> Self {
        let me = Self::launch(cluster, opts);
        me.wait_ready().await;
        me
    }

    /// Starts a reconciler as [`Identity::Restricted`] without waiting for it.
    pub fn launch(cluster: &TestCluster, opts: &ReconcilerOptions) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let listen = format!("127.0.0.1:{port}");
        let kubeconfig =
            opts.kubeconfig.clone().unwrap_or_else(|| cluster.kubeconfig(Identity::Restricted, &opts.namespace));
        let config_dir = cluster.dir().join(format!("reconciler-config-{}-{}", opts.namespace, opts.identity));
        std::fs::create_dir_all(&config_dir).unwrap();
        let log = cluster.dir().join(format!("reconciler-{}-{}.log", opts.namespace, opts.identity));
        let file = std::fs::File::create(&log).unwrap();
        let mut command = match &opts.netns {
            Some(ns) => {
                let mut c = Command::new(crate::netns::ip_bin());
                c.args(["netns", "exec", ns]).arg(workspace_bin("hereabouts-reconciler"));
                c
            }
            None => Command::new(workspace_bin("hereabouts-reconciler")),
        };
        let flat_file = opts.flat_file.clone().unwrap_or_else(|| config_dir.join("absent.conf"));
        let scope = match opts.cluster {
            true => ["--scope", "cluster"],
            false => ["--node-name", opts.node.as_str()],
        };
        let child = command
            .arg("run")
            .args(scope)
            .args(["--namespace", &opts.namespace, "--identity", &opts.identity])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--config-dir")
            .arg(&config_dir)
            .arg("--flat-file")
            .arg(flat_file)
            .args(["--cron-expression", &opts.cron, "--grace-period", &opts.grace, "--lease-name", &opts.lease])
            .args(["--orphan-age", &opts.orphan_age, "--node-resync", &opts.node_resync])
            .args(["--slice-interval", &opts.slice_interval, "--slice-grace", &opts.slice_grace])
            .args(["--gauge-interval", &opts.gauge_interval])
            .args(["--listen", &listen])
            .args(&opts.extra_args)
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start hereabouts-reconciler");
        Self { child: Some(child), listen, log, netns: opts.netns.clone() }
    }

    /// Waits until `/readyz` answers ok; panics with the log after 30 s.
    pub async fn wait_ready(&self) {
        let ready = wait::until(Duration::from_secs(30), "the reconciler's /readyz", || async {
            (self.get("/readyz").await.as_deref() == Some("ok")).then_some(())
        })
        .await;
        if let Err(e) = ready {
            panic!("{e}\n--- reconciler log ---\n{}", self.logs());
        }
    }

    /// GET `path` on the reconciler's HTTP endpoint; `None` unless it answers 200.
    pub async fn get(&self, path: &str) -> Option<String> {
        let addr = self.listen.clone();
        let path = path.to_string();
        match self.netns.clone() {
            Some(ns) => {
                tokio::task::spawn_blocking(move || crate::netns::in_netns(&ns, move || http_get(&addr, &path)))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .flatten()
            }
            None => tokio::task::spawn_blocking(move || http_get(&addr, &path)).await.ok().flatten(),
        }
    }

    /// The value of a metric line (name with labels, as printed), summed if it appears more than once.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until the counter `name` has grown by `more` from what it is now: a number of the reconciler's own
    /// runs, rather than a sleep, before a test asserts that nothing happened. Panics with the log after 60 s.
    pub async fn wait_for_more(&self, name: &str, more: f64) {
        let start = self.metric(name).await;
        let grown = wait::until(Duration::from_secs(60), &format!("{name} to grow by {more}"), || async {
            (self.metric(name).await >= start + more).then_some(())
        })
        .await;
        if let Err(e) = grown {
            panic!("{e}\n--- reconciler log ---\n{}", self.logs());
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// What it logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait (up to 15 s) for it to exit; returns whether it exited successfully.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else { return true };
        #[allow(unsafe_code)]
        // SAFETY: kill has no memory effects.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM)
        };
        for _ in 0..150 {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A minimal HTTP/1.0 GET over loopback (the endpoint is plain HTTP on 127.0.0.1).
fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}

static RBAC: OnceCell<()> = OnceCell::const_new();

/// A namespace, an admin client, pods, and a network config whose CNI identity is admin (so the restricted
/// identity, the reconciler's, holds only what the manifest grants it).
pub struct PodFixture {
    pub cluster: &'static TestCluster,
    pub ns: String,
    pub admin: Client,
    pub config: Value,
}

impl std::fmt::Debug for PodFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodFixture").field("ns", &self.ns).finish_non_exhaustive()
    }
}

impl PodFixture {
    /// A fresh namespace named after `prefix`, with a network config for `range`.
    pub async fn new(prefix: &str, range: &str) -> Self {
        let cluster = TestCluster::get();
        let admin = cluster.admin().await;
        RBAC.get_or_init(|| async { deploy::apply_rbac(admin.clone()).await }).await;
        let ns = cluster.namespace(prefix).await;
        deploy::create_lease(&admin, &ns).await;
        let kubeconfig = cluster.kubeconfig(Identity::Admin, &ns);
        let config = netconf("1.0.0", prefix, &kubeconfig, json!({"range": range}));
        Self { cluster, ns, admin, config }
    }

    /// A pod named `name` on `node`, created.
    pub async fn pod(&self, name: &str, node: &str) -> Pod {
        mk_pod(&self.ns, name).node(node).create(&self.admin).await
    }

    /// CNI ADD for `pod` as the runtime on `node` would run it (with the pod's UID in CNI_ARGS).
    pub async fn add(&self, pod: &Pod, node: &str, container_id: &str) -> std::net::IpAddr {
        let name = pod.metadata.name.as_deref().unwrap();
        self.add_as(name, pod.metadata.uid.as_deref().unwrap(), node, container_id).await
    }

    /// CNI ADD for pod `name` with `uid` in CNI_ARGS (a static pod's is the kubelet's, not the API server's).
    pub async fn add_as(&self, name: &str, uid: &str, node: &str, container_id: &str) -> std::net::IpAddr {
        let mut inv = Invocation::new("ADD", &self.config, &self.ns, name, container_id).with_env("NODENAME", node);
        inv.args.push_str(&format!(";K8S_POD_UID={uid}"));
        inv.run().await.ips()[0]
    }

    /// Deletes `name` at once (no kubelet would ever confirm a graceful delete here): a force delete, no CNI DEL.
    pub async fn delete(&self, name: &str) {
        let params = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        Api::<Pod>::namespaced(self.admin.clone(), &self.ns).delete(name, &params).await.unwrap();
    }

    pub async fn set_phase(&self, name: &str, phase: &str) {
        let patch = Patch::Merge(json!({"status": {"phase": phase}}));
        Api::<Pod>::namespaced(self.admin.clone(), &self.ns)
            .patch_status(name, &PatchParams::default(), &patch)
            .await
            .unwrap();
    }

    /// Pool `name`, read as admin; panics when it cannot be read.
    pub async fn pool(&self, name: &str) -> hereabouts_ipam::crd::IpPool {
        Api::<hereabouts_ipam::crd::IpPool>::namespaced(self.admin.clone(), &self.ns)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("pool {name} in {}: {e}", self.ns))
    }

    pub async fn holders(&self, pool: &str) -> BTreeSet<String> {
        crate::objects::pool_holders(&self.admin, &self.ns, pool).await
    }

    pub async fn reservations(&self) -> BTreeSet<String> {
        crate::objects::reservation_holders(&self.admin, &self.ns).await
    }

    pub fn podref(&self, name: &str) -> String {
        format!("{}/{name}", self.ns)
    }

    /// Waits until `podref` holds nothing in `pool`; returns how long that took.
    pub async fn wait_released(&self, pool: &str, podref: &str, within: Duration) -> Duration {
        let t0 = Instant::now();
        wait::until(within, &format!("{podref} to be released from {pool}"), || async {
            (!self.holders(pool).await.contains(podref) && !self.reservations().await.contains(podref)).then_some(())
        })
        .await
        .unwrap();
        t0.elapsed()
    }
}
