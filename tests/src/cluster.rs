//! [`TestCluster`]: a real etcd and kube-apiserver on loopback, with TLS, static tokens for five identities and
//! RBAC, and the CRDs from `crds/` installed.
//!
//! A test binary holds the tests of several topics' modules, run on parallel threads. They share one control
//! plane ([`TestCluster::get`]) and keep out of each other's way with a namespace each. A module whose tests change
//! what *every* test of a control plane sees — restart the API server, replace the CRDs, count every request the
//! server answers, apply or take away cluster-wide rights others rely on — uses a control plane of its own
//! ([`TestCluster::own`]); the real-node tests have theirs too ([`TestCluster::get_for_node`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hereabouts_ipam::crd::{IpPool, NodeSlicePool, OverlappingRangeIpReservation};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::{kubeconfig, pki, process, testenv};

/// How long the control plane may take to answer `/readyz`: a cold 2-core machine that is also compiling needs
/// far more than the ~10 s an idle one does.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Who a client or kubeconfig authenticates as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// `system:masters`: everything.
    Admin,
    /// A service-account-like user with only the rights a test (or `deploy/`) binds to it: the reconciler's
    /// identity, ServiceAccount `hereabouts` in `kube-system`.
    Restricted,
    /// The CNI plugin's identity on the host, ServiceAccount `hereabouts-cni` in `kube-system`, with only the
    /// rights a test (or `deploy/`) binds to it.
    Cni,
    /// A user with no rights at all.
    Nobody,
    /// The DaemonSet pod's identity on every node (install-cni, the node agent's reads), ServiceAccount
    /// `hereabouts-node` in `kube-system`, with only the rights a test (or `deploy/`) binds to it.
    Node,
}

impl Identity {
    /// Every identity, in a fixed order.
    pub const ALL: [Identity; 5] =
        [Identity::Admin, Identity::Restricted, Identity::Cni, Identity::Nobody, Identity::Node];

    /// The user name the API server sees.
    pub fn user(self) -> &'static str {
        match self {
            Identity::Admin => "hereabouts-test-admin",
            // The name a ServiceAccount `hereabouts` in `kube-system` authenticates as, so RBAC bindings written
            // for the DaemonSet's ServiceAccount apply to it unchanged.
            Identity::Restricted => "system:serviceaccount:kube-system:hereabouts",
            Identity::Cni => "system:serviceaccount:kube-system:hereabouts-cni",
            Identity::Nobody => "hereabouts-test-nobody",
            Identity::Node => "system:serviceaccount:kube-system:hereabouts-node",
        }
    }

    fn groups(self) -> &'static str {
        match self {
            Identity::Admin => "system:masters",
            Identity::Restricted | Identity::Cni | Identity::Node => {
                "system:serviceaccounts,system:serviceaccounts:kube-system"
            }
            Identity::Nobody => "",
        }
    }

    pub(crate) fn slug(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::Restricted => "restricted",
            Identity::Cni => "cni",
            Identity::Nobody => "nobody",
            Identity::Node => "node",
        }
    }
}

/// A running control plane: the one shared by the tests of a test binary ([`TestCluster::get`]), the real node's
/// ([`TestCluster::get_for_node`]) or a module's own ([`TestCluster::own`]).
#[derive(Debug)]
pub struct TestCluster {
    dir: PathBuf,
    server: String,
    ca_pem: String,
    tokens: [String; 5],
    apiserver: Apiserver,
    /// Time from starting etcd to the API server answering `/readyz`.
    pub ready_after: Duration,
}

/// How to start kube-apiserver again, and the pid of the running one (`None` while it is stopped).
#[derive(Debug)]
struct Apiserver {
    program: OsString,
    args: Vec<OsString>,
    pid: Mutex<Option<u32>>,
}

impl Apiserver {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        cmd
    }
}

static CLUSTER: OnceLock<TestCluster> = OnceLock::new();
static NODE_CLUSTER: OnceLock<TestCluster> = OnceLock::new();
/// The control planes of [`TestCluster::own`], by owner; each is started at most once, outside the map's lock.
static OWN: Mutex<BTreeMap<&'static str, &'static OnceLock<TestCluster>>> = Mutex::new(BTreeMap::new());
static NAMESPACES: AtomicUsize = AtomicUsize::new(0);

impl TestCluster {
    /// The control plane shared by the tests of this test binary, started on first use. Panics, with the reason and
    /// the tail of the failing process's log, when it cannot be started (and the next caller tries again).
    pub fn get() -> &'static TestCluster {
        CLUSTER.get_or_init(|| start_blocking(false))
    }

    /// The control plane of the real-node tests ([`crate::node::Node`]): like [`TestCluster::get`], but with the
    /// ServiceAccount admission plugin on, so that pods get projected tokens (which a controller-manager's
    /// `serviceaccount` and `root-ca-certificate-publisher` controllers make usable). A control plane apart from
    /// the shared one: there, pods are created in namespaces no controller gives a `default` ServiceAccount.
    pub fn get_for_node() -> &'static TestCluster {
        NODE_CLUSTER.get_or_init(|| start_blocking(true))
    }

    /// A control plane of `owner`'s own (name it after the module: `module_path!()`), started when the first test
    /// of that owner asks and shared by the tests naming the same owner. For tests that change what every test of
    /// a control plane sees, which on the shared one would break or be broken by the tests running beside them:
    /// stopping or restarting the API server, replacing the CRDs, counting every request the server answers,
    /// taking cluster-wide rights away or asserting what kube-system does not hold.
    pub fn own(owner: &'static str) -> &'static TestCluster {
        let cell: &'static OnceLock<TestCluster> = {
            let mut owned = OWN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            owned.entry(owner).or_insert_with(|| Box::leak(Box::new(OnceLock::new())))
        };
        cell.get_or_init(|| {
            eprintln!("testenv: a control plane of its own for {owner}");
            start_blocking(false)
        })
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The PEM of the CA that signed the API server's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The bearer token of `id`.
    pub fn token(&self, id: Identity) -> &str {
        &self.tokens[id as usize]
    }

    /// The control plane's state directory (certificates, tokens, logs, kubeconfigs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A kubeconfig for `id` whose current context uses `namespace`, written under the state directory.
    pub fn kubeconfig(&self, id: Identity, namespace: &str) -> PathBuf {
        let path = self.dir.join(format!("kubeconfig-{}-{namespace}", id.slug()));
        let text = kubeconfig::render(&self.server, &self.ca_pem, id.user(), self.token(id), namespace);
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// A client for `id`, with kube's own retries off so tests see each response as the server gave it.
    pub async fn client(&self, id: Identity) -> Client {
        client_for(&self.server, &self.ca_pem, id, self.token(id)).await.expect("build a kube client")
    }

    /// A client that authenticates with `token` (a ServiceAccount's, from the TokenRequest API), kube's retries off.
    pub async fn client_with_token(&self, token: &str) -> Client {
        client_for(&self.server, &self.ca_pem, Identity::Nobody, token).await.expect("build a kube client")
    }

    /// A client for [`Identity::Admin`].
    pub async fn admin(&self) -> Client {
        self.client(Identity::Admin).await
    }

    /// Creates a fresh namespace named after `prefix` and returns its name. Namespaces are never deleted: a bare
    /// API server has no namespace controller to finish the deletion.
    pub async fn namespace(&self, prefix: &str) -> String {
        let n = NAMESPACES.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        let ns =
            Namespace { metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() }, ..Default::default() };
        Api::<Namespace>::all(self.admin().await)
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        name
    }

    /// Replaces the installed CRDs with the manifests in `dir` (e.g. Whereabouts' own), for the control plane's
    /// remaining life (so on one of the caller's own, [`TestCluster::own`]), and waits until they are established.
    pub async fn replace_crds(&self, dir: &Path) -> anyhow::Result<()> {
        let api = Api::<CustomResourceDefinition>::all(self.admin().await);
        for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
            let path = entry?.path();
            if path.extension().is_none_or(|x| x != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            let mut crd: CustomResourceDefinition =
                serde_yaml_ng::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
            let name = crd.metadata.name.clone().unwrap_or_default();
            let current = api.get(&name).await.with_context(|| format!("get CRD {name}"))?;
            crd.metadata.resource_version = current.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &crd).await.with_context(|| format!("replace CRD {name}"))?;
            crate::wait::crd_established(&api, &name).await?;
            crate::wait::crd_served(&self.admin().await, &crd).await?;
        }
        Ok(())
    }

    /// The paths of the API server's serving certificate and key (PEM; SAN 127.0.0.1, signed by the CA of
    /// [`TestCluster::ca_pem`]), for a stand-in such as [`crate::faultproxy::FaultProxy`] to serve with.
    pub fn serving_cert_paths(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("apiserver.crt"), self.dir.join("apiserver.key"))
    }

    /// The pid of the running kube-apiserver, `None` while it is stopped.
    pub fn apiserver_pid(&self) -> Option<u32> {
        *self.apiserver.pid.lock().unwrap()
    }

    /// Kills kube-apiserver with SIGKILL and waits until the process is gone; does nothing when it is stopped.
    /// etcd and everything stored in it stay.
    ///
    /// This stops the control plane of *every* test that uses it: call it on a control plane of the test's own
    /// ([`TestCluster::own`]), never on the shared one.
    pub fn kill_apiserver(&self) {
        let mut pid = self.apiserver.pid.lock().unwrap();
        if let Some(running) = pid.take() {
            process::kill(running).unwrap_or_else(|e| panic!("kill kube-apiserver (pid {running}): {e}"));
        }
    }

    /// Starts kube-apiserver again with the same command line (same port, certificates, tokens and etcd) and
    /// waits until it answers `/readyz` and serves the CRDs. Panics when it is already running or not ready in
    /// time. Like the first, it is killed when the test binary ends and named by `kube-apiserver.pid`.
    ///
    /// This affects *every* test that uses the control plane: call it on one of the test's own
    /// ([`TestCluster::own`]).
    pub async fn start_apiserver(&self) {
        self.try_start_apiserver().await.unwrap_or_else(|e| panic!("restart kube-apiserver: {e:#}"))
    }

    async fn try_start_apiserver(&self) -> anyhow::Result<()> {
        {
            let mut pid = self.apiserver.pid.lock().unwrap();
            if let Some(running) = *pid {
                bail!("kube-apiserver is already running (pid {running})");
            }
            *pid = Some(launch(&self.dir, "kube-apiserver", self.apiserver.command())?);
        }
        let admin = self.admin().await;
        wait_ready(&admin, &self.dir).await?;
        crds_servable(&admin).await
    }

    /// [`TestCluster::kill_apiserver`] then [`TestCluster::start_apiserver`]; returns the time from the kill to
    /// the API server being ready again.
    ///
    /// This affects *every* test that uses the control plane: call it on one of the test's own
    /// ([`TestCluster::own`]).
    pub async fn restart_apiserver(&self) -> Duration {
        let t0 = Instant::now();
        self.kill_apiserver();
        self.start_apiserver().await;
        t0.elapsed()
    }

    /// The API server's Prometheus metrics, as text.
    pub async fn metrics(&self) -> String {
        let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
        self.admin().await.request_text(req).await.expect("GET /metrics")
    }
}

/// A client for `id` of `server` (the API server or a stand-in that serves its certificate), kube's retries off.
pub(crate) async fn client_for(server: &str, ca_pem: &str, id: Identity, token: &str) -> anyhow::Result<Client> {
    let text = kubeconfig::render(server, ca_pem, id.user(), token, "default");
    let kc = Kubeconfig::from_yaml(&text).context("parse kubeconfig")?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.default_retry = false;
    Ok(Client::try_from(config)?)
}

fn state_base() -> PathBuf {
    // tmpfs keeps etcd's fsyncs off the disk
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn random_token(prefix: &str) -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(format!("{prefix}-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

/// Starts a control plane on a thread of its own, and waits for it: the caller is usually inside a test's tokio
/// runtime, and start-up needs one of its own. Panics with the reason when it cannot be started.
fn start_blocking(service_accounts: bool) -> TestCluster {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
        rt.block_on(start(service_accounts))
    })
    .join()
    .expect("control plane start-up thread")
    .unwrap_or_else(|e| panic!("test control plane: {e:#}"))
}

/// Starts etcd and kube-apiserver, with the ServiceAccount admission plugin on when `service_accounts`.
async fn start(service_accounts: bool) -> anyhow::Result<TestCluster> {
    let etcd_bin = testenv::tool("etcd");
    let apiserver_bin = testenv::tool("kube-apiserver");
    let base = state_base();
    process::sweep_stale(&base);
    let dir = tempfile::Builder::new()
        .prefix(process::DIR_PREFIX)
        .tempdir_in(&base)
        .context("create the state directory")?
        .keep();
    process::own_dir(&dir)?;

    let pki = pki::generate().context("generate certificates")?;
    for (file, pem) in [
        ("ca.crt", &pki.ca_pem),
        ("apiserver.crt", &pki.serving_cert_pem),
        ("apiserver.key", &pki.serving_key_pem),
        ("sa.pub", &pki.sa_public_pem),
        ("sa.key", &pki.sa_private_pem),
    ] {
        std::fs::write(dir.join(file), pem)?;
    }
    let tokens = [
        random_token("admin")?,
        random_token("restricted")?,
        random_token("cni")?,
        random_token("nobody")?,
        random_token("node")?,
    ];
    let csv: String = Identity::ALL
        .iter()
        .map(|id| format!("{},{},{},\"{}\"\n", tokens[*id as usize], id.user(), id.user(), id.groups()))
        .collect();
    std::fs::write(dir.join("tokens.csv"), csv)?;

    let t0 = Instant::now();
    let (client_port, peer_port, secure_port) = (free_port()?, free_port()?, free_port()?);
    let etcd_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut etcd = Command::new(&etcd_bin);
    etcd.args(["--name", "hereabouts-test", "--log-level", "warn", "--unsafe-no-fsync"])
        .arg("--data-dir")
        .arg(dir.join("etcd"))
        .args(["--listen-client-urls", &etcd_url, "--advertise-client-urls", &etcd_url])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("hereabouts-test={peer_url}")]);
    launch(&dir, "etcd", etcd)?;

    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let mut apiserver = Command::new(&apiserver_bin);
    apiserver
        .arg(format!("--etcd-servers={etcd_url}"))
        .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
        .arg(format!("--secure-port={secure_port}"))
        .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
        .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
        .arg(format!("--token-auth-file={}", p("tokens.csv")))
        .arg("--authorization-mode=RBAC")
        .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
        .arg(format!("--service-account-key-file={}", p("sa.pub")))
        .arg(format!("--service-account-signing-key-file={}", p("sa.key")))
        // install-cni binds the host's token to a Node: ServiceAccountTokenNodeBinding (and its validation, and the
        // node claims of pod tokens) are GA and locked on in this kube-apiserver (1.37), so no --feature-gates
        // virtual service IPs only: nothing is ever sent to them
        .arg("--service-cluster-ip-range=10.0.0.0/24")
        // the `kubernetes` Endpoints would carry 127.0.0.1, which validation rejects
        .arg("--endpoint-reconciler-type=none")
        .args(["--allow-privileged=true", "--profiling=false", "-v=1"]);
    if !service_accounts {
        // no controller-manager makes `default` ServiceAccounts, so pods could not be created with this plugin on
        apiserver.arg("--disable-admission-plugins=ServiceAccount");
    }
    let program = apiserver.get_program().to_owned();
    let args = apiserver.get_args().map(ToOwned::to_owned).collect();
    let pid = launch(&dir, "kube-apiserver", apiserver)?;
    let apiserver = Apiserver { program, args, pid: Mutex::new(Some(pid)) };

    let server = format!("https://127.0.0.1:{secure_port}");
    let admin = client_for(&server, &pki.ca_pem, Identity::Admin, &tokens[0]).await?;
    wait_ready(&admin, &dir).await?;
    let ready_after = t0.elapsed();
    eprintln!(
        "testenv: control plane ready in {:.1} s at {server} (state in {})",
        ready_after.as_secs_f64(),
        dir.display()
    );
    install_crds(&admin).await?;
    Ok(TestCluster { dir, server, ca_pem: pki.ca_pem, tokens, apiserver, ready_after })
}

/// Starts `cmd` as `name`, logging to `<name>.log` (appended to, so a restart keeps the earlier run's log), with
/// its pid in `<name>.pid`. Returns the pid.
fn launch(dir: &Path, name: &str, mut cmd: Command) -> anyhow::Result<u32> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("{name}.log")))?;
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    let pid = process::spawn(cmd).with_context(|| format!("start {name}"))?;
    process::record_pid(dir, name, pid)?;
    Ok(pid)
}

async fn wait_ready(admin: &Client, dir: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last = String::new();
    while Instant::now() < deadline {
        let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
        match admin.request_text(req).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => last = body,
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!(
        "kube-apiserver not ready after {READY_TIMEOUT:?} (last answer: {last})\n--- etcd.log ---\n{}\n--- kube-apiserver.log ---\n{}",
        tail(&dir.join("etcd.log")),
        tail(&dir.join("kube-apiserver.log"))
    )
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Applies the committed manifests (what users apply), not the types, and waits until each is established.
async fn install_crds(admin: &Client) -> anyhow::Result<()> {
    let api = Api::<CustomResourceDefinition>::all(admin.clone());
    let mut names = Vec::new();
    for (file, _) in crate::crds::render() {
        let path = crate::crds::dir().join(file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        let crd: CustomResourceDefinition =
            serde_yaml_ng::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &crd).await.with_context(|| format!("create CRD {name}"))?;
        names.push(name);
    }
    for name in names {
        crate::wait::crd_established(&api, &name).await?;
    }
    crds_servable(admin).await
}

async fn crds_servable(admin: &Client) -> anyhow::Result<()> {
    // Established (or a restarted server's `/readyz`) is not yet servable: the first list of a resource may
    // answer 429 "storage is (re)initializing" for a moment, which no test should have to see.
    let lp = kube::api::ListParams::default().limit(1);
    crate::wait::until(Duration::from_secs(30), "the CRDs to be servable", || async {
        let pools = Api::<IpPool>::all(admin.clone()).list(&lp).await.is_ok();
        let reservations = Api::<OverlappingRangeIpReservation>::all(admin.clone()).list(&lp).await.is_ok();
        let slices = Api::<NodeSlicePool>::all(admin.clone()).list(&lp).await.is_ok();
        (pools && reservations && slices).then_some(())
    })
    .await
}
