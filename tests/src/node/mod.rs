//! One real Kubernetes node for the tests: containerd with CRI and runc, the kubelet, and the kube-scheduler and
//! kube-controller-manager a DaemonSet and a Deployment need, against the real-node control plane of the test binary
//! ([`TestCluster::get_for_node`], apart from the one its other tests share). Multus is the runtime's only CNI
//! config (the thin plugin, delegating the pod's default network to a `bridge` without a host address); the node's
//! CNI directories, like everything else it writes, live under a directory of its own, so the host's `/opt/cni/bin`
//! and `/etc/cni/net.d` are never touched.
//!
//! What cannot be private (docs/development.md, "The real node"): the kubelet's `kubepods` cgroups, containerd's
//! `/run/containerd/{s,fifo,runc}`, the `cni-*` network namespaces and the bridges. So there is
//! one node at a time on a machine ([`Node::start`] holds a lock for the node's life), and a node left by a killed
//! run is cleaned up by the next one. Needs root, and containerd and runc (`make testenv` installs them).

pub mod workload;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::containerd::Containerd;
use crate::{Identity, TestCluster, image, plugin, process, testenv, wait};

/// The node's name, as the kubelet registers it.
pub const NAME: &str = "hab-node";
/// The pod sandbox image ([`image::write_pause`]); test pods run it as their container too.
pub const PAUSE_IMAGE: &str = "hereabouts-pause:1";
/// The tag of the hereabouts image the node starts with.
pub const IMAGE: &str = "hereabouts:0.1.0-node";
/// The bridge that test NADs put their pods on (the bridge plugin creates it; the node deletes it).
pub const BRIDGE: &str = "hab-node0";
/// The default network's bridge: no address on the host side, so pods' default traffic goes nowhere.
const DEFAULT_BRIDGE: &str = "hab-node-dflt";
/// The containerd namespace the kubelet's images and containers live in.
pub const K8S_NAMESPACE: &str = "k8s.io";

const DIR_PREFIX: &str = "hereabouts-node-";
/// Where the default network's `host-local` hands out pod addresses (on a bridge with no host address: never
/// routed anywhere).
const DEFAULT_NETWORK: &str = "198.19.255.0/24";
/// What the kubelet sets on start and a test must give back.
const SYSCTLS: [&str; 3] = ["vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"];

/// Where the kubelet's pod cgroups are: the `pids` hierarchy of cgroups v1 (hybrid here), or the unified one.
const KUBEPODS: [&str; 2] = ["/sys/fs/cgroup/pids/kubepods", "/sys/fs/cgroup/kubepods"];

/// Where client-go's in-cluster config reads its credentials: the only ones Multus' daemon takes.
const IN_CLUSTER_SECRETS: &str = "/run/secrets/kubernetes.io/serviceaccount";

/// How Multus runs on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Multus {
    /// The thin plugin: the runtime executes `multus`, which executes its delegates.
    Thin,
    /// The thick plugin, as Multus' quick start installs it: the runtime executes `multus-shim`, which hands the
    /// invocation over a unix socket to `multus-daemon`, which executes the delegates through its chroot
    /// executor (`chrootDir`).
    Thick,
}

static ONE_NODE: Mutex<()> = Mutex::new(());

/// The chart's host paths outside the node's directory: the agent's socket and the host lock, and the warm
/// reserve's journal. The kubelet makes them (`DirectoryOrCreate`); the node removes the ones it made.
const CHART_HOST_PATHS: [&str; 2] = ["/run/hereabouts", "/var/lib/hereabouts"];

/// The chart's agent socket on the host.
const AGENT_SOCKET: &str = "/run/hereabouts/agent.sock";

/// The right to run the machine's one node, and to change what the control plane holds for it; see
/// [`exclusive`].
#[derive(Debug)]
pub struct NodeLock {
    _held: MutexGuard<'static, ()>,
}

/// Waits until no other test of this binary runs a node, and keeps it so until the lock is given to
/// [`Node::start_holding`] and that node is dropped.
pub fn exclusive() -> NodeLock {
    NodeLock { _held: ONE_NODE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) }
}

/// A running node. Dropping it stops everything it started and undoes what the kubelet and runtime did to the
/// host.
#[derive(Debug)]
pub struct Node {
    dir: PathBuf,
    containerd: Option<Containerd>,
    kubelet: Option<u32>,
    controllers: Vec<u32>,
    sysctls: Vec<(String, String)>,
    netns_before: BTreeSet<String>,
    /// Which of [`CHART_HOST_PATHS`] were there before the node started.
    host_paths_before: Vec<PathBuf>,
    cleaned: bool,
    multus: Multus,
    /// When the node started: from launching containerd to the Node being Ready and untainted.
    pub ready_after: Duration,
    _one_node: NodeLock,
}

impl Node {
    /// Starts the node: containerd (with the hereabouts image of this build and the pause image imported), the
    /// controllers and the kubelet; waits until the Node is Ready with no taint. Panics with the failing part's
    /// log.
    pub async fn start(cluster: &TestCluster) -> Node {
        Self::start_holding(cluster, exclusive()).await
    }

    /// [`Node::start`] with the lock already taken (to prepare the control plane first).
    pub async fn start_holding(cluster: &TestCluster, one_node: NodeLock) -> Node {
        Self::start_with(cluster, one_node, Multus::Thin).await
    }

    /// [`Node::start_holding`] with Multus run as `multus`.
    pub async fn start_with(cluster: &TestCluster, one_node: NodeLock, multus: Multus) -> Node {
        assert!(
            is_root(),
            "a real node needs root (the kubelet manages cgroups, containerd mounts): run the tests as root"
        );
        let base = Path::new("/var/tmp");
        sweep_stale(base);
        let dir = tempfile::Builder::new().prefix(DIR_PREFIX).tempdir_in(base).unwrap().keep();
        std::fs::write(dir.join("owner.pid"), std::process::id().to_string()).unwrap();
        let sysctls = SYSCTLS.iter().map(|k| (k.to_string(), read_sysctl(k))).collect();
        let mut node = Node {
            dir,
            containerd: None,
            kubelet: None,
            controllers: Vec::new(),
            sysctls,
            netns_before: cni_netns(),
            host_paths_before: chart_host_paths(),
            cleaned: false,
            multus,
            ready_after: Duration::ZERO,
            _one_node: one_node,
        };
        if let Err(e) = node.boot(cluster).await {
            panic!("start the node: {e:#}\n{}", node.logs());
        }
        node
    }

    /// The directory the container runtime takes CNI plugins from (the chart's `cni.binDir`).
    pub fn cni_bin_dir(&self) -> PathBuf {
        self.dir.join("opt/cni/bin")
    }

    /// The directory the container runtime takes CNI configs from (the chart's `cni.confDir`).
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("etc/cni/net.d")
    }

    /// The node's own directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node's containerd.
    pub fn containerd(&self) -> &Containerd {
        self.containerd.as_ref().expect("containerd runs while the node does")
    }

    async fn boot(&mut self, cluster: &TestCluster) -> anyhow::Result<()> {
        let t0 = Instant::now();
        let (bin, conf) = (self.cni_bin_dir(), self.cni_conf_dir());
        std::fs::create_dir_all(&bin)?;
        std::fs::create_dir_all(&conf)?;
        for plugin in ["multus", "multus-shim", "bridge", "loopback", "host-local"] {
            std::fs::copy(testenv::tool(plugin), bin.join(plugin)).with_context(|| format!("copy {plugin}"))?;
        }
        install_nad_crd(cluster).await?;
        let default_network = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "hab-default",
            "plugins": [{
                "type": "bridge",
                "bridge": DEFAULT_BRIDGE,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": DEFAULT_NETWORK}]],
                         "dataDir": self.dir.join("host-local")},
            }],
        });
        // Written before containerd starts: its config watcher once missed a file moved in.
        let multus = match self.multus {
            Multus::Thin => serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "multus-cni-network",
                "type": "multus",
                "kubeconfig": cluster.kubeconfig(Identity::Admin, "default"),
                "cniDir": self.dir.join("multus"),
                "binDir": bin,
                "logFile": self.dir.join("multus.log"),
                "logLevel": "verbose",
                "delegates": [default_network],
            }),
            Multus::Thick => {
                self.start_multus_daemon(cluster, &default_network).await?;
                serde_json::json!({
                    "cniVersion": "1.0.0",
                    "name": "multus-cni-network",
                    "type": "multus-shim",
                    "daemonSocketDir": self.dir.join("multus-run"),
                    "logFile": self.dir.join("multus-shim.log"),
                    "logLevel": "verbose",
                    "delegates": [default_network],
                })
            }
        };
        std::fs::write(conf.join("00-multus.conf"), serde_json::to_vec_pretty(&multus)?)?;

        let images = self.dir.join("images");
        std::fs::create_dir_all(&images)?;
        image::write_pause(&images.join("pause.tar"), PAUSE_IMAGE, &plugin::workspace_bin("pause"))?;
        image::write(&images.join("hereabouts.tar"), IMAGE, &plugin::target_dir())?;

        let cri = format!(
            r#"[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
"#,
            pause = image::containerd_name(PAUSE_IMAGE),
            bin = bin.display(),
            conf = conf.display(),
        );
        self.containerd = Some(Containerd::start_with(&cri));
        self.import(&images.join("pause.tar"))?;
        self.import(&images.join("hereabouts.tar"))?;

        let admin = cluster.kubeconfig(Identity::Admin, "default");
        let ca = cluster.dir().join("ca.crt");
        let mut cm = Command::new(testenv::tool("kube-controller-manager"));
        cm.arg(format!("--kubeconfig={}", admin.display()))
            .arg(
                "--controllers=daemonset-controller,deployment-controller,replicaset-controller,\
                 garbage-collector-controller,node-lifecycle-controller,serviceaccount-controller,\
                 root-ca-certificate-publisher-controller",
            )
            .arg(format!("--root-ca-file={}", ca.display()))
            .args(["--leader-elect=false", "--secure-port=0", "--bind-address=127.0.0.1", "-v=1"]);
        self.controllers.push(self.launch("kube-controller-manager", cm)?);
        let mut scheduler = Command::new(testenv::tool("kube-scheduler"));
        scheduler.arg(format!("--kubeconfig={}", admin.display())).args([
            "--leader-elect=false",
            "--secure-port=0",
            "--bind-address=127.0.0.1",
            "-v=1",
        ]);
        self.controllers.push(self.launch("kube-scheduler", scheduler)?);

        forget_earlier_node(cluster).await?;
        let (port, healthz) = (free_port()?, free_port()?);
        let kubelet_config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
# hybrid cgroups v1 here; systemd does not manage them
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
podLogsDir: {dir}/pod-logs
# the machine's disk may be fuller than the default thresholds: never evict or collect the tests' images
evictionHard: {{memory.available: 50Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%, imagefs.inodesFree: 1%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
makeIPTablesUtilChains: false
nodeStatusUpdateFrequency: 2s
",
            socket = self.containerd().socket.display(),
            dir = self.dir.display(),
        );
        std::fs::write(self.dir.join("kubelet.yaml"), kubelet_config)?;
        let mut kubelet = Command::new(testenv::tool("kubelet"));
        kubelet
            .arg(format!("--config={}", self.dir.join("kubelet.yaml").display()))
            .arg(format!("--kubeconfig={}", admin.display()))
            .arg(format!("--root-dir={}", self.dir.join("kubelet").display()))
            .arg(format!("--cert-dir={}", self.dir.join("kubelet-pki").display()))
            .arg(format!("--hostname-override={NAME}"))
            .arg("-v=2")
            // no iptables on its PATH: it would add KUBE-FIREWALL rules to the host's chains
            .env("PATH", "/usr/bin:/bin");
        self.kubelet = Some(self.launch("kubelet", kubelet)?);

        let nodes = Api::<NodeObject>::all(cluster.admin().await);
        wait::until(Duration::from_secs(120), "the node to be Ready with no taint", || async {
            let node = nodes.get_opt(NAME).await.ok().flatten()?;
            let ready = node.status?.conditions?.iter().any(|c| c.type_ == "Ready" && c.status == "True");
            let tainted = node.spec.and_then(|s| s.taints).is_some_and(|t| !t.is_empty());
            (ready && !tainted).then_some(())
        })
        .await?;
        self.ready_after = t0.elapsed();
        eprintln!("node: {NAME} ready in {:.1} s (state in {})", self.ready_after.as_secs_f64(), self.dir.display());
        Ok(())
    }

    /// Multus' daemon as a process of the host, as its DaemonSet would run it, and ready: the in-cluster
    /// credentials it insists on (client-go's fixed path; the daemon reads no kubeconfig) are the admin's, written
    /// for the node's life; it executes delegates through its chroot executor with the host's root as the root
    /// (its DaemonSet mounts the host's root at /hostroot). Its config keys win over the shim's on every request,
    /// so the binaries, the cache and the log are set here. In its `auto` mode it insists on writing a Multus
    /// config of its own: into a directory the runtime does not read, from a copy of the default network.
    async fn start_multus_daemon(
        &mut self,
        cluster: &TestCluster,
        default_network: &serde_json::Value,
    ) -> anyhow::Result<()> {
        let secrets = Path::new(IN_CLUSTER_SECRETS);
        if let Ok(owner) = std::fs::read_to_string(secrets.join("owner")) {
            anyhow::ensure!(
                !Path::new(owner.trim()).exists(),
                "{IN_CLUSTER_SECRETS} belongs to the node under {}, which is still there",
                owner.trim()
            );
        } else {
            anyhow::ensure!(
                !secrets.exists(),
                "{IN_CLUSTER_SECRETS} exists on this host and is not a test node's: Multus' daemon would read it"
            );
        }
        std::fs::create_dir_all(secrets)?;
        std::fs::write(secrets.join("owner"), self.dir.display().to_string())?;
        std::fs::write(secrets.join("token"), cluster.token(Identity::Admin))?;
        std::fs::write(secrets.join("ca.crt"), cluster.ca_pem())?;

        let primary = self.dir.join("multus-primary");
        std::fs::create_dir_all(&primary)?;
        std::fs::write(primary.join("10-default.conflist"), serde_json::to_vec_pretty(default_network)?)?;
        let generated = self.dir.join("multus-generated");
        std::fs::create_dir_all(&generated)?;
        let config = serde_json::json!({
            "cniVersion": "1.0.0",
            "multusConfigFile": "auto",
            "multusAutoconfigDir": primary,
            "multusMasterCNI": "10-default.conflist",
            "cniConfigDir": generated,
            "socketDir": self.dir.join("multus-run"),
            "binDir": self.cni_bin_dir(),
            "cniDir": self.dir.join("multus"),
            "logFile": self.dir.join("multus.log"),
            "logLevel": "verbose",
            "chrootDir": "/",
        });
        let config_path = self.dir.join("multus-daemon.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(&config)?)?;
        let (host, port) = workload::url_parts(cluster.server());
        let mut daemon = Command::new(testenv::tool("multus-daemon"));
        daemon
            .arg("-config")
            .arg(&config_path)
            .env("KUBERNETES_SERVICE_HOST", host)
            .env("KUBERNETES_SERVICE_PORT", port)
            .env("MULTUS_NODE_NAME", NAME);
        self.controllers.push(self.launch("multus-daemon", daemon)?);
        // it writes its own config once its caches are synced and it serves
        let written = generated.join("00-multus.conf");
        wait::until(Duration::from_secs(90), "Multus' daemon to serve", || async { written.exists().then_some(()) })
            .await?;
        Ok(())
    }

    /// How Multus runs on this node.
    pub fn multus(&self) -> Multus {
        self.multus
    }

    /// Imports an OCI layout tar into the kubelet's containerd namespace.
    pub fn import(&self, tar: &Path) -> anyhow::Result<()> {
        let out = self.containerd().ctr_in(K8S_NAMESPACE, &["images", "import", &tar.to_string_lossy()]);
        anyhow::ensure!(
            out.status.success(),
            "ctr images import {}: {}{}",
            tar.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// Writes the hereabouts image of this build under another tag and imports it (a rolling update's "new
    /// version").
    pub fn import_hereabouts_as(&self, reference: &str) -> anyhow::Result<()> {
        let tar = self.dir.join("images").join(format!("{}.tar", reference.replace([':', '/'], "_")));
        image::write(&tar, reference, &plugin::target_dir())?;
        self.import(&tar)
    }

    fn launch(&self, name: &str, mut cmd: Command) -> anyhow::Result<u32> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("{name}.log")))?;
        cmd.stdin(std::process::Stdio::null()).stdout(log.try_clone()?).stderr(log);
        let pid = process::spawn(cmd).with_context(|| format!("start {name}"))?;
        process::record_pid(&self.dir, name, pid)?;
        Ok(pid)
    }

    /// Stops the kubelet (its pods keep running, as on a node whose kubelet restarts).
    pub fn stop_kubelet(&mut self) {
        if let Some(pid) = self.kubelet.take() {
            let _ = process::kill(pid);
        }
    }

    /// What the containers named `container` of the pods of namespace `ns` whose names start with `pod_prefix`
    /// wrote, as the kubelet keeps it (CRI log lines, every restart and every pod of the prefix).
    pub fn container_logs(&self, ns: &str, pod_prefix: &str, container: &str) -> String {
        let mut out = String::new();
        let prefix = format!("{ns}_{pod_prefix}");
        for pod in std::fs::read_dir(self.dir.join("pod-logs")).into_iter().flatten().flatten() {
            if !pod.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let mut files: Vec<PathBuf> = std::fs::read_dir(pod.path().join(container))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect();
            files.sort();
            for file in files {
                out += &std::fs::read_to_string(file).unwrap_or_default();
            }
        }
        out
    }

    /// The tail of each part's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["kubelet", "kube-controller-manager", "kube-scheduler", "multus", "multus-daemon"] {
            let text = std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out += &format!("--- {name}.log (tail) ---\n{}\n", lines[lines.len().saturating_sub(25)..].join("\n"));
        }
        if let Some(containerd) = &self.containerd {
            let text = containerd.log();
            let lines: Vec<&str> = text.lines().collect();
            out += &format!("--- containerd.log (tail) ---\n{}\n", lines[lines.len().saturating_sub(25)..].join("\n"));
        }
        out
    }

    /// The pid of a process of the pod with UID `uid` (its sandbox's or a container's), from the kubelet's
    /// cgroups: to enter the pod's network namespace.
    pub fn pod_pid(&self, uid: &str) -> Option<u32> {
        let wanted = format!("pod{uid}");
        let mut stack: Vec<PathBuf> = KUBEPODS.iter().map(PathBuf::from).collect();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if !path.is_dir() {
                    continue;
                }
                if entry.file_name().to_string_lossy() == wanted {
                    return procs_under(&path).into_iter().next();
                }
                stack.push(path);
            }
        }
        None
    }

    /// Stops the node and undoes its changes to the host, as dropping it does, and says which of the chart's host
    /// paths the node made are still there afterwards (none, when the teardown is right); the machine's one node
    /// is still this one's until it is dropped.
    pub fn shut_down(&mut self) -> Vec<PathBuf> {
        self.clean_up();
        let made = chart_host_paths().into_iter().filter(|p| !self.host_paths_before.contains(p));
        made.chain(Path::new(AGENT_SOCKET).exists().then(|| PathBuf::from(AGENT_SOCKET))).collect()
    }

    fn clean_up(&mut self) {
        if std::mem::replace(&mut self.cleaned, true) {
            return;
        }
        self.stop_kubelet();
        for pid in self.controllers.drain(..) {
            let _ = process::kill(pid);
        }
        kill_pod_processes();
        // containerd's Drop kills it and its shims and undoes the mounts under its directory
        self.containerd = None;
        undo_host_changes(&self.dir, &self.netns_before);
        for (key, value) in &self.sysctls {
            let _ = std::fs::write(Path::new("/proc/sys").join(key), value);
        }
        for path in chart_host_paths() {
            if !self.host_paths_before.contains(&path) {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
        // the agent that served it is gone with the node, also where the directory was there before (a killed run
        // left it): a socket left behind sends every later CNI call on the machine to a dead agent first
        let _ = std::fs::remove_file(AGENT_SOCKET);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn chart_host_paths() -> Vec<PathBuf> {
    CHART_HOST_PATHS.iter().map(PathBuf::from).filter(|p| p.exists()).collect()
}

impl Drop for Node {
    fn drop(&mut self) {
        self.clean_up();
    }
}

/// A pod's processes outlive their shims and hold network namespaces: kill every process in the kubelet's
/// cgroups, until none is left.
fn kill_pod_processes() {
    let t0 = Instant::now();
    loop {
        let pids: Vec<u32> = KUBEPODS.iter().flat_map(|root| procs_under(Path::new(root))).collect();
        if pids.is_empty() || t0.elapsed() > Duration::from_secs(10) {
            return;
        }
        for pid in pids {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn procs_under(root: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                stack.push(entry.path());
            }
        }
    }
    pids
}

/// Undoes what the kubelet and the runtime did outside `dir`: mounts under it (pod volumes), the network
/// namespaces made since `netns_before`, the `kubepods` cgroups, the test bridge and the log symlinks.
fn undo_host_changes(dir: &Path, netns_before: &BTreeSet<String>) {
    let secrets = Path::new(IN_CLUSTER_SECRETS);
    if std::fs::read_to_string(secrets.join("owner")).is_ok_and(|owner| Path::new(owner.trim()) == dir) {
        let _ = std::fs::remove_dir_all(secrets);
        let _ = std::fs::remove_dir(secrets.parent().unwrap());
        let _ = std::fs::remove_dir(Path::new("/run/secrets"));
    }
    let table = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = dir.display().to_string();
    let mut mounts: Vec<&str> =
        table.lines().filter_map(|l| l.split(' ').nth(1)).filter(|m| m.starts_with(&prefix)).collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mount in mounts {
        let _ = Command::new("umount").args(["-l", mount]).status();
    }
    for ns in cni_netns().difference(netns_before) {
        let _ = Command::new("ip").args(["netns", "delete", ns]).status();
    }
    remove_cgroup_tree(Path::new("/sys/fs/cgroup/kubepods"));
    for controller in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        remove_cgroup_tree(&controller.path().join("kubepods"));
    }
    for bridge in [BRIDGE, DEFAULT_BRIDGE] {
        let _ = Command::new("ip").args(["link", "delete", bridge]).stderr(std::process::Stdio::null()).status();
    }
    for entry in std::fs::read_dir("/var/log/containers").into_iter().flatten().flatten() {
        if std::fs::read_link(entry.path()).is_ok_and(|target| target.starts_with(dir)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn remove_cgroup_tree(root: &Path) {
    if !root.is_dir() {
        return;
    }
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        if entry.path().is_dir() {
            remove_cgroup_tree(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(root);
}

/// The network namespaces named as containerd's CNI names them.
fn cni_netns() -> BTreeSet<String> {
    std::fs::read_dir("/var/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cni-"))
        .collect()
}

/// Cleans up after nodes whose test binary was killed: their processes, pods, mounts and directories.
fn sweep_stale(base: &Path) {
    for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
        let dir = entry.path();
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let owner = std::fs::read_to_string(dir.join("owner.pid")).ok().and_then(|p| p.trim().parse::<u32>().ok());
        if owner.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
            continue;
        }
        for file in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.ends_with(".pid")
                && name != "owner.pid"
                && let Ok(pid) = std::fs::read_to_string(file.path())
            {
                let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
            }
        }
        kill_pod_processes();
        let _ = Command::new("pkill").args(["-KILL", "-f"]).arg(&dir).status();
        undo_host_changes(&dir, &BTreeSet::new());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// An earlier node of this control plane (an earlier test of the binary) had the same name: its Node object and
/// the pods bound to it go, so the new kubelet starts none of them.
async fn forget_earlier_node(cluster: &TestCluster) -> anyhow::Result<()> {
    let client = cluster.admin().await;
    let pods = Api::<Pod>::all(client.clone());
    let bound = ListParams::default().fields(&format!("spec.nodeName={NAME}"));
    for pod in pods.list(&bound).await?.items {
        let (Some(name), Some(ns)) = (pod.metadata.name, pod.metadata.namespace) else { continue };
        let _ =
            Api::<Pod>::namespaced(client.clone(), &ns).delete(&name, &DeleteParams::default().grace_period(0)).await;
    }
    let nodes = Api::<NodeObject>::all(client);
    if nodes.get_opt(NAME).await?.is_some() {
        nodes.delete(NAME, &DeleteParams::default()).await?;
    }
    Ok(())
}

async fn install_nad_crd(cluster: &TestCluster) -> anyhow::Result<()> {
    let api = Api::<CustomResourceDefinition>::all(cluster.admin().await);
    let text = std::fs::read_to_string(testenv::tool("networks-crd.yaml"))?;
    let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).context("parse networks-crd.yaml")?;
    let name = crd.metadata.name.clone().unwrap_or_default();
    if api.get_opt(&name).await?.is_none() {
        api.create(&PostParams::default(), &crd).await.with_context(|| format!("create CRD {name}"))?;
    }
    wait::crd_established(&api, &name).await
}

/// Waits until the controller-manager made namespace `ns`'s `default` ServiceAccount, without which the
/// admission plugin refuses the namespace's pods.
pub async fn default_service_account(cluster: &TestCluster, ns: &str) {
    let api = Api::<ServiceAccount>::namespaced(cluster.admin().await, ns);
    wait::until(Duration::from_secs(60), "the default ServiceAccount", || async {
        api.get_opt("default").await.ok().flatten().map(|_| ())
    })
    .await
    .unwrap_or_else(|e| panic!("namespace {ns}: {e:#}"));
}

fn read_sysctl(key: &str) -> String {
    std::fs::read_to_string(Path::new("/proc/sys").join(key)).unwrap_or_default().trim().to_string()
}

/// Why a node cannot run on this machine, if it cannot: not root, or containerd or runc missing.
pub fn cannot_run() -> Option<String> {
    if !is_root() {
        return Some("not root".into());
    }
    let on_path = |tool: &str| {
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|dir| dir.join(tool).is_file()))
    };
    ["containerd", "ctr", "runc"]
        .into_iter()
        .find(|tool| !on_path(tool))
        .map(|tool| format!("{tool} is not on PATH (as root, `make testenv` installs Debian's containerd and runc)"))
}

fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2)) == Some("0")
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
