//! `hereabouts-reconciler install-cni`, run as a process into a temp dir standing for the host's CNI directories,
//! with service-account files standing for the pod's projected volume, against the test API server: it mints the
//! CNI plugin's token (ServiceAccount `hereabouts-cni`) with the TokenRequest API, bound to the test's Node,
//! authenticated as the DaemonSet pod (ServiceAccount `hereabouts`), each with the manifest's Role in the test's
//! namespace.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hereabouts_ipam::config::{Input, LogLevel, load_with_paths};
use hereabouts_tests::faultproxy::{FaultProxy, Verb};
use hereabouts_tests::objects::{mk_node, mk_pod};
use hereabouts_tests::plugin::{Invocation, netconf, workspace_bin};
use hereabouts_tests::{TestCluster, deploy, wait};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams};
use kube::config::Kubeconfig;
use serde_json::{Value, json};

/// Where the flat file names the kubeconfig: the host's view of `--cni-conf-dir` (the default
/// `--host-cni-conf-dir`).
const HOST_KUBECONFIG: &str = "/etc/cni/net.d/hereabouts.d/hereabouts.kubeconfig";

/// The user info extra holding the node of a token bound to a Node (or to a pod on one).
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The API server side of one test: a namespace holding ServiceAccounts `hereabouts` and `hereabouts-cni` and the
/// manifest's two Roles, bound to them there, and the Node of the test's host (named after the namespace).
struct Cluster {
    cluster: &'static TestCluster,
    admin: Client,
    ns: String,
    node: String,
}

impl Cluster {
    async fn new(prefix: &str) -> Self {
        let cluster = TestCluster::get();
        let admin = cluster.admin().await;
        let ns = cluster.namespace(prefix).await;
        deploy::create_service_accounts(&admin, &ns).await;
        deploy::apply_roles(&admin, &ns, &ns).await;
        let node = format!("node-{ns}");
        mk_node(&node).create(&admin).await;
        Self { cluster, admin, ns, node }
    }

    /// A Pod object standing for the DaemonSet pod (nothing runs it).
    async fn pod(&self, name: &str) -> Pod {
        mk_pod(&self.ns, name).service_account(deploy::NODE_ACCOUNT).create(&self.admin).await
    }

    async fn delete_pod(&self, name: &str) {
        let params = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        Api::<Pod>::namespaced(self.admin.clone(), &self.ns).delete(name, &params).await.unwrap();
    }

    /// A token of ServiceAccount `hereabouts-node` (the DaemonSet pod's), as the kubelet projects it: bound to `pod` when given.
    async fn pod_token(&self, pod: Option<&Pod>) -> String {
        deploy::token_for(&self.admin, &self.ns, deploy::NODE_ACCOUNT, pod).await
    }

    async fn whoami(&self, token: &str) -> Result<UserInfo, kube::Error> {
        deploy::whoami(token).await
    }

    /// Asserts that `token` is a token of `hereabouts-cni` of this namespace, bound to the test's Node (which the
    /// API server names as the user's node), not to a pod.
    async fn assert_cni_token(&self, token: &str) {
        let me = self.whoami(token).await.expect("the written token authenticates");
        assert_eq!(me.username.as_deref(), Some(deploy::sa_user(&self.ns, deploy::CNI_NAME).as_str()));
        let extra = me.extra.unwrap_or_default();
        assert!(!extra.keys().any(|k| k.contains("pod-")), "bound to no pod: {extra:?}");
        assert_eq!(extra.get(NODE_NAME_EXTRA), Some(&vec![self.node.clone()]), "the user's node: {extra:?}");
        let k8s = &deploy::claims(token)["kubernetes.io"];
        assert_eq!(k8s["serviceaccount"]["name"], deploy::CNI_NAME, "{k8s}");
        assert!(k8s.get("pod").is_none(), "no pod claim: {k8s}");
        let uid = Api::<Node>::all(self.admin.clone()).get(&self.node).await.unwrap().metadata.uid;
        assert_eq!(k8s["node"]["name"], self.node.as_str(), "bound to the Node: {k8s}");
        assert_eq!(k8s["node"]["uid"].as_str(), uid.as_deref(), "this Node, not a later one of its name: {k8s}");
    }

    /// A network config whose kubeconfig is `path` (the host's, as install-cni wrote it).
    fn netconf(&self, path: &Path, range: &str) -> Value {
        netconf("1.0.0", "install-cni-net", path, json!({"range": range}))
    }
}

/// A self-signed CA certificate (PEM), for a bundle the API server's certificate is not signed by.
fn other_ca_pem(name: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

/// How the service-account files are laid out and replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Plain files, each replaced by writing a new file and renaming it over the old one.
    Plain,
    /// The kubelet's projected volume (`AtomicWriter`): `token -> ..data/token`, `..data -> ..<timestamp>/`, and
    /// an update writes a new timestamped directory and renames a new `..data` symlink over the old one.
    Projected,
}

/// A temp dir with the fake service-account volume (`sa/`) and the host's CNI directories (`bin/`, `net.d/`).
struct Host {
    dir: tempfile::TempDir,
    layout: Layout,
    generation: u32,
    namespace: String,
    server: String,
    /// `NODE_NAME`, as the downward API gives it.
    node: String,
}

impl Host {
    fn new(layout: Layout, token: &str, ca: &str, cluster: &Cluster) -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sa")).unwrap();
        let server = cluster.cluster.server().to_string();
        let (namespace, node) = (cluster.ns.clone(), cluster.node.clone());
        let mut host = Self { dir, layout, generation: 0, namespace, server, node };
        host.write_sa(token, ca);
        if layout == Layout::Projected {
            for name in ["token", "ca.crt", "namespace"] {
                std::os::unix::fs::symlink(format!("..data/{name}"), host.sa(name)).unwrap();
            }
        }
        host
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn sa(&self, name: &str) -> PathBuf {
        self.path("sa").join(name)
    }

    fn kubeconfig(&self) -> PathBuf {
        self.path("net.d/hereabouts.d/hereabouts.kubeconfig")
    }

    fn flat_file(&self) -> PathBuf {
        self.path("net.d/hereabouts.d/hereabouts.conf")
    }

    fn binary(&self) -> PathBuf {
        self.path("bin/hereabouts")
    }

    /// Replaces the token and CA (and writes the namespace) the way `layout` says, never leaving a partial file.
    fn write_sa(&mut self, token: &str, ca: &str) {
        self.generation += 1;
        let namespace = self.namespace.clone();
        let files = [("token", token), ("ca.crt", ca), ("namespace", namespace.as_str())];
        match self.layout {
            Layout::Plain => {
                for (name, content) in files {
                    let tmp = self.sa(&format!(".{name}.new"));
                    fs::write(&tmp, content).unwrap();
                    fs::rename(&tmp, self.sa(name)).unwrap();
                }
            }
            Layout::Projected => {
                let data = format!("..gen_{}", self.generation);
                fs::create_dir(self.sa(&data)).unwrap();
                for (name, content) in files {
                    fs::write(self.sa(&data).join(name), content).unwrap();
                }
                std::os::unix::fs::symlink(&data, self.sa("..data_tmp")).unwrap();
                fs::rename(self.sa("..data_tmp"), self.sa("..data")).unwrap();
                if self.generation > 1 {
                    fs::remove_dir_all(self.sa(&format!("..gen_{}", self.generation - 1))).unwrap();
                }
            }
        }
    }

    /// `hereabouts-reconciler install-cni` with every path in the temp dir, a clean environment but `NODE_NAME`,
    /// and `extra`.
    fn command(&self, extra: &[&str]) -> Command {
        let mut cmd = Command::new(workspace_bin("hereabouts-reconciler"));
        cmd.env_clear().env("NODE_NAME", &self.node).arg("install-cni");
        let paths = [
            ("--source-binary", workspace_bin("hereabouts")),
            ("--cni-bin-dir", self.path("bin")),
            ("--cni-conf-dir", self.path("net.d")),
            ("--token-file", self.sa("token")),
            ("--ca-file", self.sa("ca.crt")),
            ("--namespace-file", self.sa("namespace")),
        ];
        for (flag, path) in paths {
            cmd.arg(flag).arg(path);
        }
        cmd.args(extra);
        cmd
    }

    /// `--once`, with `env` (no `--server` in `extra`: the server then comes from the kubelet's variables).
    fn run_once(&self, extra: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = self.command(extra);
        cmd.arg("--once").envs(env.iter().copied());
        cmd.output().expect("run hereabouts-reconciler install-cni")
    }

    /// Starts the watcher against the test API server, its stderr going to `install-cni.log` (see [`Host::log`]).
    fn spawn(&self, extra: &[&str]) -> Running {
        let log = fs::File::create(self.path("install-cni.log")).unwrap();
        let child = self
            .command(&[&["--server", &self.server], extra].concat())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start hereabouts-reconciler install-cni");
        Running(Some(child))
    }

    fn log(&self) -> String {
        fs::read_to_string(self.path("install-cni.log")).unwrap_or_default()
    }

    /// What the kubeconfig says now, if it exists.
    fn seen(&self) -> Option<Seen> {
        read_kubeconfig(&self.kubeconfig())
    }

    /// Waits until the kubeconfig exists and `pred` holds for it; panics with the log after `timeout`.
    async fn wait_kubeconfig(&self, timeout: Duration, what: &str, pred: impl Fn(&Seen) -> bool) -> Seen {
        let found = wait::until(timeout, what, || async { self.seen().filter(|s| pred(s)) }).await;
        found.unwrap_or_else(|e| panic!("{e}; install-cni log:\n{}", self.log()))
    }
}

/// A running `install-cni`, killed (SIGKILL) and reaped on drop unless it already exited.
struct Running(Option<Child>);

impl Running {
    fn pid(&self) -> libc::pid_t {
        libc::pid_t::try_from(self.0.as_ref().unwrap().id()).unwrap()
    }

    /// Its exit status, if it ends within `timeout`.
    fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.0.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.0 = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn is_running(&mut self) -> bool {
        self.0.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// SIGTERM, then its exit status (within 5 s).
    fn stop(&mut self, host: &Host) -> ExitStatus {
        #[allow(unsafe_code)]
        // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped, so it is still ours.
        let rc = unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM): {}", std::io::Error::last_os_error());
        self.wait_timeout(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("install-cni still running 5s after SIGTERM; log:\n{}", host.log()))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn assert_success(out: &Output) {
    assert!(out.status.success(), "install-cni failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
}

/// What the kubeconfig at `path` says. Panics if it does not parse: a reader must never see a partial file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    server: String,
    token: String,
    ca: String,
    namespace: String,
}

fn read_kubeconfig(path: &Path) -> Option<Seen> {
    let text = fs::read_to_string(path).ok()?;
    let kc = Kubeconfig::from_yaml(&text).unwrap_or_else(|e| panic!("kubeconfig {}: {e}\n{text}", path.display()));
    let current = kc.current_context.as_deref().expect("current-context set");
    let context = kc.contexts.iter().find(|c| c.name == current).expect("the current context exists");
    let context = context.context.as_ref().unwrap();
    let cluster = kc.clusters.iter().find(|c| c.name == context.cluster).expect("the context's cluster exists");
    let cluster = cluster.cluster.as_ref().unwrap();
    assert!(cluster.certificate_authority.is_none(), "the CA is embedded, not a path");
    let ca_b64 = cluster.certificate_authority_data.as_deref().expect("certificate-authority-data");
    let ca = base64::engine::general_purpose::STANDARD.decode(ca_b64).expect("certificate-authority-data is base64");
    let user = context.user.as_deref().expect("the context names a user");
    let user = kc.auth_infos.iter().find(|u| u.name == user).expect("the context's user exists");
    // `token` is a SecretString; serialising exposes it.
    let user = serde_json::to_value(user.auth_info.as_ref().unwrap()).unwrap();
    Some(Seen {
        server: cluster.server.clone().expect("server"),
        token: user["token"].as_str().expect("token").to_string(),
        ca: String::from_utf8(ca).unwrap(),
        namespace: context.namespace.clone().expect("the context's namespace"),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_mints_a_cni_token_and_installs_the_binary_kubeconfig_and_flat_file() {
    let cl = Cluster::new("install-once").await;
    let pod_token = cl.pod_token(None).await;
    let host = Host::new(Layout::Projected, &format!("{pod_token}\n"), cl.cluster.ca_pem(), &cl);
    let extra = ["--log-level", "verbose", "--reconciler-cron-expression", "30 4 * * *"];
    // No --server: it comes from the kubelet's service variables.
    let port = cl.cluster.server().rsplit(':').next().unwrap().to_string();
    let service = [("KUBERNETES_SERVICE_HOST", "127.0.0.1"), ("KUBERNETES_SERVICE_PORT", port.as_str())];
    let out = host.run_once(&extra, &service);
    assert_success(&out);

    let source = workspace_bin("hereabouts");
    assert!(fs::read(&source).unwrap() == fs::read(host.binary()).unwrap(), "differs from {}", source.display());
    assert_eq!(mode(&host.binary()), 0o755);

    assert_eq!(mode(&host.kubeconfig()), 0o600);
    let seen = host.seen().expect("the kubeconfig exists");
    assert_eq!(seen.server, format!("https://127.0.0.1:{port}"));
    assert_eq!((seen.ca.as_str(), seen.namespace.as_str()), (cl.cluster.ca_pem(), cl.ns.as_str()));
    assert_ne!(seen.token, pod_token, "the pod's own token never reaches the host");
    cl.assert_cni_token(&seen.token).await;
    // The CNI plugin builds its client from it.
    let (_client, namespace) =
        hereabouts_ipam::store::connect(&host.kubeconfig()).await.expect("a client from the kubeconfig");
    assert_eq!(namespace, cl.ns);

    let flat: Value = serde_json::from_slice(&fs::read(host.flat_file()).unwrap()).expect("the flat file is JSON");
    assert_eq!(flat["kubernetes"]["kubeconfig"], HOST_KUBECONFIG, "the host's path of the kubeconfig: {flat}");
    assert_eq!(flat["log_level"], "verbose");
    assert_eq!(flat["reconciler_cron_expression"], "30 4 * * *");
    let stdin = json!({"cniVersion": "1.0.0", "name": "net1", "type": "macvlan",
        "ipam": {"type": "hereabouts", "range": "10.20.0.0/24", "configuration_path": host.flat_file()}});
    let stdin = serde_json::to_vec(&stdin).unwrap();
    let cfg = load_with_paths(&Input { stdin: &stdin, cni_args: "" }, &[]).expect("the flat file loads");
    assert_eq!(cfg.mode.kube().and_then(|k| k.kubeconfig.as_deref()), Some(Path::new(HOST_KUBECONFIG)));
    assert_eq!(cfg.log_level, LogLevel::Verbose);
    assert_eq!(cfg.reconciler_cron_expression.as_deref(), Some("30 4 * * *"));

    let names: Vec<String> = fs::read_dir(host.path("net.d/hereabouts.d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "only the kubeconfig, the flat file and the node's name, no temp file: {names:?}");

    // A restart mints a new token but leaves the binary alone (neither copied nor renamed over).
    let before = fs::metadata(host.binary()).unwrap();
    // past the next second, so a rewrite of the binary would show in its mtime even on a coarse file system
    std::thread::sleep(Duration::from_millis(1100));
    let out = host.run_once(&extra, &service);
    assert_success(&out);
    let after = fs::metadata(host.binary()).unwrap();
    assert_eq!((after.ino(), after.mtime(), after.mtime_nsec()), (before.ino(), before.mtime(), before.mtime_nsec()));
    assert!(String::from_utf8_lossy(&out.stderr).contains("up to date"), "{}", String::from_utf8_lossy(&out.stderr));
    let again = host.seen().unwrap();
    assert_ne!(again.token, seen.token, "a new token");
    cl.assert_cni_token(&again.token).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_fails_without_writing_when_no_token_can_be_minted() {
    let cl = Cluster::new("install-nomint").await;
    let host = Host::new(Layout::Plain, &cl.pod_token(None).await, cl.cluster.ca_pem(), &cl);
    // the Role lets the pod mint for hereabouts-cni only
    let out = host.run_once(&["--server", cl.cluster.server(), "--cni-service-account", "hereabouts"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "install-cni succeeded:\n{stderr}");
    let named = format!("TokenRequest for serviceaccount {}/hereabouts", cl.ns);
    assert!(stderr.contains(&named) && stderr.contains("forbidden"), "the message names the request:\n{stderr}");
    assert!(!host.binary().exists() && !host.kubeconfig().exists() && !host.flat_file().exists(), "nothing written");
}

/// Starts the watcher with a pod token bound to pod `p1`, rotates that token (to one bound to `p2`), kills the
/// first (deletes `p1`), then changes the CA to a bundle: each time the kubeconfig follows with a new CNI token,
/// the last minted with the rotated token (the first is dead by then). Then stops it with SIGTERM.
async fn watch_follows_rotation(layout: Layout) {
    let cl = Cluster::new(if layout == Layout::Plain { "install-plain" } else { "install-projected" }).await;
    let (p1, p2) = (cl.pod("ds-pod-1").await, cl.pod("ds-pod-2").await);
    let first = cl.pod_token(Some(&p1)).await;
    let ca = cl.cluster.ca_pem().to_string();
    let mut host = Host::new(layout, &first, &ca, &cl);
    let mut running = host.spawn(&["--watch-interval", "200ms"]);
    let timeout = Duration::from_secs(20);

    wait::until(timeout, "the flat file", || async { host.flat_file().is_file().then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}; log:\n{}", host.log()));
    let t1 = host.seen().expect("the kubeconfig is written before the flat file");
    assert_eq!((t1.ca.as_str(), t1.server.as_str()), (ca.as_str(), cl.cluster.server()));
    cl.assert_cni_token(&t1.token).await;
    assert!(running.is_running(), "install-cni exited instead of watching; log:\n{}", host.log());

    let second = cl.pod_token(Some(&p2)).await;
    host.write_sa(&format!("{second}\n"), &ca);
    let t2 = host.wait_kubeconfig(timeout, "a token minted after the rotation", |s| s.token != t1.token).await;
    cl.assert_cni_token(&t2.token).await;
    assert_eq!(mode(&host.kubeconfig()), 0o600, "still 0600 after the rewrite");

    cl.delete_pod("ds-pod-1").await;
    wait::until(Duration::from_secs(60), "the first pod token to be rejected", || async {
        matches!(cl.whoami(&first).await, Err(kube::Error::Api(s)) if s.code == 401).then_some(())
    })
    .await
    .unwrap();
    let bundle = format!("{ca}{}", other_ca_pem("another-ca"));
    host.write_sa(&second, &bundle);
    let t3 =
        host.wait_kubeconfig(timeout, "the new CA and a new token", |s| s.ca == bundle && s.token != t2.token).await;
    cl.assert_cni_token(&t3.token).await;
    assert_eq!(mode(&host.kubeconfig()), 0o600);

    let status = running.stop(&host);
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM; log:\n{}", host.log());
    let log = host.log();
    assert!(log.contains("token_rotated=true") && log.contains("ca_changed=true") && log.contains("SIGTERM"), "{log}");
    assert!(!log.contains("cannot mint"), "every mint succeeded: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_token_and_ca_files_renamed_over_and_exits_0_on_sigterm() {
    watch_follows_rotation(Layout::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_the_kubelet_swapping_the_data_symlink() {
    watch_follows_rotation(Layout::Projected).await;
}

/// The DaemonSet pod goes away (a rolling update, an uninstall): its own token, which it authenticated with, is
/// rejected seconds later, but the host's kubeconfig holds a `hereabouts-cni` token bound to no pod, and the CNI
/// plugin's ADD, CHECK and DEL keep working with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_token_outlives_the_daemonset_pod() {
    let cl = Cluster::new("install-podgone").await;
    let pod = cl.pod("hereabouts-x7k2p").await;
    let pod_token = cl.pod_token(Some(&pod)).await;
    let me = cl.whoami(&pod_token).await.expect("the pod-bound token works while the pod exists");
    let extra = me.extra.unwrap_or_default();
    assert_eq!(extra.get("authentication.kubernetes.io/pod-name"), Some(&vec!["hereabouts-x7k2p".to_string()]));

    let host = Host::new(Layout::Projected, &pod_token, cl.cluster.ca_pem(), &cl);
    let mut running = host.spawn(&[]);
    let seen = host.wait_kubeconfig(Duration::from_secs(20), "the kubeconfig", |_| true).await;
    // the pod's containers stop with it
    assert_eq!(running.stop(&host).code(), Some(0), "{}", host.log());
    cl.assert_cni_token(&seen.token).await;
    let exp =
        deploy::claims(&seen.token)["exp"].as_i64().unwrap() - deploy::claims(&seen.token)["iat"].as_i64().unwrap();
    assert_eq!(exp, 24 * 3600, "the default lifetime is 24h");

    let t0 = Instant::now();
    cl.delete_pod("hereabouts-x7k2p").await;
    wait::until(Duration::from_secs(60), "the pod-bound token to be rejected", || async {
        matches!(cl.whoami(&pod_token).await, Err(kube::Error::Api(s)) if s.code == 401).then_some(())
    })
    .await
    .unwrap();
    eprintln!("install-cni: the pod-bound token got 401 {:.1} s after its pod was deleted", t0.elapsed().as_secs_f64());

    let config = cl.netconf(&host.kubeconfig(), "198.18.60.0/24");
    let add = Invocation::new("ADD", &config, &cl.ns, "web", "c1").run().await;
    assert_eq!(add.ips(), ["198.18.60.1".parse::<std::net::IpAddr>().unwrap()], "{}", add.stderr);
    let check = Invocation::new("CHECK", &config, &cl.ns, "web", "c1").run().await;
    assert!(check.success, "CHECK: {}\n{}", check.stdout, check.stderr);
    let del = Invocation::new("DEL", &config, &cl.ns, "web", "c1").run().await;
    assert!(del.success, "DEL: {}\n{}", del.stdout, del.stderr);
    // a DEL succeeds even when it cannot release: look at what is left
    let pools: Vec<hereabouts_ipam::crd::IpPool> =
        Api::namespaced(cl.admin.clone(), &cl.ns).list(&Default::default()).await.unwrap().items;
    assert_eq!(pools.iter().map(|p| p.spec.allocations.len()).sum::<usize>(), 0, "DEL released: {}", del.stderr);
    let reservations: Vec<hereabouts_ipam::crd::OverlappingRangeIpReservation> =
        Api::namespaced(cl.admin.clone(), &cl.ns).list(&Default::default()).await.unwrap().items;
    assert!(reservations.is_empty(), "DEL released the reservation: {}", del.stderr);
}

/// With a 10-minute token renewed after 0.5 % of its life (3 s), the kubeconfig gets a new token long before the
/// old one expires. When minting then fails (the right to mint taken away), the kubeconfig keeps its last token,
/// which keeps working; the failure is logged once; once the right is back, a new token is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_renewed_before_expiry_and_a_failed_mint_keeps_the_last_one() {
    let cl = Cluster::new("install-refresh").await;
    // through a proxy that counts its TokenRequests
    let proxy = FaultProxy::start(cl.cluster).await;
    let mut host = Host::new(Layout::Plain, &cl.pod_token(None).await, cl.cluster.ca_pem(), &cl);
    host.server = proxy.server();
    let mut running = host.spawn(&[
        "--watch-interval",
        "200ms",
        "--cni-token-lifetime",
        "10m",
        "--cni-token-refresh-fraction",
        "0.005",
    ]);
    let t1 = host.wait_kubeconfig(Duration::from_secs(20), "the kubeconfig", |_| true).await;
    let c1 = deploy::claims(&t1.token);
    assert_eq!(c1["exp"].as_i64().unwrap() - c1["iat"].as_i64().unwrap(), 600, "the lifetime asked for");
    let t2 = host.wait_kubeconfig(Duration::from_secs(20), "a renewed token", |s| s.token != t1.token).await;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    assert!(c1["exp"].as_i64().unwrap() > now + 500, "renewed with most of the old token's life left");
    cl.assert_cni_token(&t2.token).await;

    // no more minting: the pod's Role without create on serviceaccounts/token
    let rules = deploy::role(deploy::NODE_ACCOUNT).rules.unwrap();
    deploy::apply_role(
        &cl.admin,
        &cl.ns,
        deploy::NODE_ACCOUNT,
        deploy::without(&rules, "serviceaccounts/token", "create"),
        &cl.ns,
    )
    .await;
    // a mint already under way may still land: take what the kubeconfig holds once a failure is logged
    wait::until(Duration::from_secs(20), "a failed mint", || async {
        host.log().contains("cannot mint").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; log:\n{}", host.log()));
    let kept = host.seen().unwrap();
    let bytes = fs::read(host.kubeconfig()).unwrap();
    // the retries counted at the proxy, not a sleep
    let refused =
        || proxy.seen().iter().filter(|r| r.is(Verb::Create, "serviceaccounts/token") && r.status == Some(403)).count();
    let before = refused();
    wait::until(Duration::from_secs(60), "3 more refused mints", || async { (refused() >= before + 3).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}; log:\n{}", host.log()));
    assert_eq!(fs::read(host.kubeconfig()).unwrap(), bytes, "the kubeconfig is kept as it was");
    let log = host.log();
    assert_eq!(log.matches("cannot mint").count(), 1, "one failure, logged once:\n{log}");
    assert!(log.contains("forbidden"), "{log}");
    let config = cl.netconf(&host.kubeconfig(), "198.18.61.0/24");
    let add = Invocation::new("ADD", &config, &cl.ns, "web", "c1").run().await;
    assert_eq!(add.ips().len(), 1, "the kept token works: {}", add.stderr);

    deploy::apply_role(&cl.admin, &cl.ns, deploy::NODE_ACCOUNT, rules, &cl.ns).await;
    let t3 = host
        .wait_kubeconfig(Duration::from_secs(90), "a token after the right is back", |s| s.token != kept.token)
        .await;
    cl.assert_cni_token(&t3.token).await;
    let log = host.log();
    let again =
        log.lines().find(|l| l.contains("minted the CNI plugin's token again")).unwrap_or_else(|| panic!("{log}"));
    let attempts: u32 =
        again.split("failed_attempts=").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(attempts >= 3, "it kept trying, with backoff: {again}");
    assert!(running.is_running());
}

#[test]
fn a_missing_token_file_fails_naming_it_and_writes_no_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let host = Host {
        dir,
        layout: Layout::Plain,
        generation: 0,
        namespace: "pools".into(),
        server: "https://192.0.2.10:6443".into(),
        node: "worker-1".into(),
    };
    fs::create_dir(host.path("sa")).unwrap();
    fs::write(host.sa("ca.crt"), other_ca_pem("ca")).unwrap();
    fs::write(host.sa("namespace"), "pools").unwrap();
    let token = host.sa("token");

    let out = host.run_once(&["--server", "https://192.0.2.10:6443"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "install-cni succeeded without a token:\n{stderr}");
    assert!(stderr.contains(&format!("read token file {}", token.display())), "the message names the file:\n{stderr}");
    assert!(!host.kubeconfig().exists() && !host.flat_file().exists() && !host.binary().exists(), "nothing written");

    // Watch mode fails the same way, at once, instead of waiting for the token to appear.
    let mut running = host.spawn(&[]);
    let status = running.wait_timeout(Duration::from_secs(5)).expect("install-cni exits without a token");
    assert!(!status.success());
    assert!(host.log().contains(token.to_str().unwrap()), "{}", host.log());
    assert!(!host.kubeconfig().exists());
}

#[test]
fn help_names_every_flag_and_its_environment_variable() {
    let out = Command::new(workspace_bin("hereabouts-reconciler")).args(["install-cni", "--help"]).output().unwrap();
    assert_success(&out);
    let help = String::from_utf8_lossy(&out.stdout);
    let flags = BTreeMap::from([
        ("--source-binary", "HEREABOUTS_SOURCE_BINARY"),
        ("--cni-bin-dir", "HEREABOUTS_CNI_BIN_DIR"),
        ("--cni-conf-dir", "HEREABOUTS_CNI_CONF_DIR"),
        ("--host-cni-conf-dir", "HEREABOUTS_HOST_CNI_CONF_DIR"),
        ("--token-file", "HEREABOUTS_TOKEN_FILE"),
        ("--ca-file", "HEREABOUTS_CA_FILE"),
        ("--namespace-file", "HEREABOUTS_NAMESPACE_FILE"),
        ("--namespace ", "HEREABOUTS_NAMESPACE="),
        ("--server", "HEREABOUTS_SERVER"),
        ("--log-level", "HEREABOUTS_CNI_LOG_LEVEL"),
        ("--log-file", "HEREABOUTS_CNI_LOG_FILE"),
        ("--reconciler-cron-expression", "HEREABOUTS_RECONCILER_CRON_EXPRESSION"),
        ("--watch-interval", "HEREABOUTS_WATCH_INTERVAL"),
        ("--cni-service-account", "HEREABOUTS_CNI_SERVICE_ACCOUNT"),
        ("--cni-token-lifetime", "HEREABOUTS_CNI_TOKEN_LIFETIME"),
        ("--cni-token-refresh-fraction", "HEREABOUTS_CNI_TOKEN_REFRESH_FRACTION"),
        ("--once", "HEREABOUTS_INSTALL_ONCE"),
        ("--node-name", "NODE_NAME"),
    ]);
    for (flag, env) in flags {
        assert!(help.contains(flag) && help.contains(env), "{flag} / {env} missing from:\n{help}");
    }
}

/// A namespace and a host for `--once` runs against the test API server (`--server`, the returned URL).
async fn once_host(prefix: &str) -> (Cluster, Host, String) {
    let cl = Cluster::new(prefix).await;
    let pod_token = cl.pod_token(None).await;
    let host = Host::new(Layout::Projected, &pod_token, cl.cluster.ca_pem(), &cl);
    let server = cl.cluster.server().to_string();
    (cl, host, server)
}

/// The node's name the downward API gives install-cni is the plugin's node, though the runtime passes no
/// `NODENAME` and the host's name differs: an ADD in slice mode claims its slice for that node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_name_install_cni_writes_is_the_node_the_plugin_allocates_for() {
    let (cl, host, server) = once_host("install-node").await;
    let downward = format!("downward-{}", cl.ns);
    mk_node(&downward).create(&cl.admin).await;
    let out = host.run_once(&["--server", &server], &[("NODE_NAME", &downward)]);
    assert_success(&out);
    let written = host.path("net.d/hereabouts.d/nodename");
    assert_eq!(fs::read_to_string(&written).unwrap(), format!("{downward}\n"));
    assert_eq!(mode(&written), 0o644);

    let mut config = cl.netconf(&host.kubeconfig(), "198.18.61.0/24");
    config["ipam"]["node_slice_size"] = json!("/28");
    config["ipam"]["configuration_path"] = json!(host.flat_file());
    let add = Invocation::new("ADD", &config, &cl.ns, "web", "c1").run().await;
    assert_eq!(add.ips().len(), 1, "{}", add.stderr);
    let slices: Vec<hereabouts_ipam::crd::NodeSlicePool> =
        Api::namespaced(cl.admin.clone(), &cl.ns).list(&Default::default()).await.unwrap().items;
    let owners: Vec<String> = slices
        .iter()
        .flat_map(|p| p.status.iter().flat_map(|s| s.allocations.iter()))
        .map(|a| a.node_name.clone())
        .filter(|n| !n.is_empty())
        .collect();
    assert_eq!(owners, [downward.as_str()], "{}", add.stderr);
}

/// The DaemonSet binary honours `RUST_LOG`: info by default, only warnings and errors with `RUST_LOG=warn`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_sets_what_the_daemonset_binary_logs() {
    let (_cl, host, server) = once_host("install-rust-log").await;
    let levels = |out: &Output| -> Vec<String> {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        stderr.lines().filter_map(|l| l.split_whitespace().nth(1)).map(str::to_string).collect()
    };
    let default = host.run_once(&["--server", &server], &[]);
    assert_success(&default);
    assert!(levels(&default).iter().any(|l| l == "INFO"), "{}", String::from_utf8_lossy(&default.stderr));
    let quiet = host.run_once(&["--server", &server], &[("RUST_LOG", "warn")]);
    assert_success(&quiet);
    let seen = levels(&quiet);
    assert!(seen.iter().all(|l| l == "WARN" || l == "ERROR"), "{}", String::from_utf8_lossy(&quiet.stderr));
    let debug = host.run_once(&["--server", &server], &[("RUST_LOG", "debug")]);
    assert_success(&debug);
    assert!(levels(&debug).iter().any(|l| l == "DEBUG"), "{}", String::from_utf8_lossy(&debug.stderr));
}

/// Installed as `whereabouts` too, the plugin serves a NetworkAttachmentDefinition that names Whereabouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_as_whereabouts_it_serves_a_whereabouts_netconf() {
    let (cl, host, server) = once_host("install-alias").await;
    assert_success(&host.run_once(&["--server", &server, "--install-as-whereabouts"], &[]));
    let alias = host.path("bin/whereabouts");
    assert!(fs::read(&alias).unwrap() == fs::read(host.binary()).unwrap(), "the same binary");

    let mut config = cl.netconf(&host.kubeconfig(), "198.18.62.0/24");
    config["ipam"]["type"] = json!("whereabouts");
    let run = |command| {
        let mut invocation = Invocation::new(command, &config, &cl.ns, "web", "c1");
        invocation.program = Some(alias.clone());
        invocation
    };
    let add = run("ADD").run().await;
    assert_eq!(add.ips(), ["198.18.62.1".parse::<std::net::IpAddr>().unwrap()], "{}", add.stderr);
    let del = run("DEL").run().await;
    assert!(del.success, "{}\n{}", del.stdout, del.stderr);
    let pools: Vec<hereabouts_ipam::crd::IpPool> =
        Api::namespaced(cl.admin.clone(), &cl.ns).list(&Default::default()).await.unwrap().items;
    assert_eq!(pools.iter().map(|p| p.spec.allocations.len()).sum::<usize>(), 0, "{}", del.stderr);
}

/// The host's token is bound to the node's Node: the API server takes it for that node, stops taking it as soon as
/// the Node is deleted (a node's token is worth nothing once its node is gone, long before its 24h), and refuses
/// to mint another for a Node that does not exist, naming it, and leaves the kubeconfig as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_token_is_bound_to_the_node_and_dies_with_it() {
    let (cl, host, server) = once_host("install-bound").await;
    assert_success(&host.run_once(&["--server", &server], &[]));
    let seen = host.seen().unwrap();
    cl.assert_cni_token(&seen.token).await;

    let t0 = Instant::now();
    Api::<Node>::all(cl.admin.clone()).delete(&cl.node, &DeleteParams::default()).await.unwrap();
    wait::until(Duration::from_secs(60), "the host token to be rejected", || async {
        matches!(cl.whoami(&seen.token).await, Err(kube::Error::Api(s)) if s.code == 401).then_some(())
    })
    .await
    .unwrap();
    eprintln!("install-cni: the host token got 401 {:.1} s after its Node was deleted", t0.elapsed().as_secs_f64());

    let bytes = fs::read(host.kubeconfig()).unwrap();
    let out = host.run_once(&["--server", &server], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "minted for a Node that is gone:\n{stderr}");
    assert!(stderr.contains(&format!("Node {} does not exist", cl.node)), "the message names the Node:\n{stderr}");
    assert_eq!(fs::read(host.kubeconfig()).unwrap(), bytes, "the kubeconfig is left as it was");
}

/// Without the node's name there is no Node to bind the token to: install-cni refuses to start, though it could
/// mint a token bound to nothing, says which variable to set, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_node_name_install_cni_refuses_to_start_and_writes_nothing() {
    let (_cl, mut host, server) = once_host("install-nonode").await;
    host.node = String::new();
    let out = host.run_once(&["--server", &server], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "install-cni started without a node name:\n{stderr}");
    assert!(
        stderr.contains("--node-name (NODE_NAME") && stderr.contains("bound to this node's Node"),
        "the message names the setting and why:\n{stderr}"
    );
    assert!(!host.kubeconfig().exists() && !host.flat_file().exists() && !host.binary().exists(), "nothing written");
}
