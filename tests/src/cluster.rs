//! [`TestCluster`]: one real etcd and kube-apiserver per test binary, on loopback, with TLS, static tokens for
//! three identities and RBAC, and the CRDs from `crds/` installed.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// A service-account-like user with only the rights a test (or `deploy/`) binds to it.
    Restricted,
    /// A user with no rights at all.
    Nobody,
}

impl Identity {
    /// Every identity, in a fixed order.
    pub const ALL: [Identity; 3] = [Identity::Admin, Identity::Restricted, Identity::Nobody];

    /// The user name the API server sees.
    pub fn user(self) -> &'static str {
        match self {
            Identity::Admin => "hereabouts-test-admin",
            // The name a ServiceAccount `hereabouts` in `kube-system` authenticates as, so RBAC bindings written
            // for the DaemonSet's ServiceAccount apply to it unchanged.
            Identity::Restricted => "system:serviceaccount:kube-system:hereabouts",
            Identity::Nobody => "hereabouts-test-nobody",
        }
    }

    fn groups(self) -> &'static str {
        match self {
            Identity::Admin => "system:masters",
            Identity::Restricted => "system:serviceaccounts,system:serviceaccounts:kube-system",
            Identity::Nobody => "",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::Restricted => "restricted",
            Identity::Nobody => "nobody",
        }
    }
}

/// A running control plane shared by every test of one test binary. Get it with [`TestCluster::get`].
#[derive(Debug)]
pub struct TestCluster {
    dir: PathBuf,
    server: String,
    ca_pem: String,
    tokens: [String; 3],
    /// Time from starting etcd to the API server answering `/readyz`.
    pub ready_after: Duration,
}

static CLUSTER: OnceLock<TestCluster> = OnceLock::new();
static NAMESPACES: AtomicUsize = AtomicUsize::new(0);

impl TestCluster {
    /// The control plane of this test binary, started on first use. Panics, with the reason and the tail of the
    /// failing process's log, when it cannot be started.
    pub fn get() -> &'static TestCluster {
        CLUSTER.get_or_init(|| {
            // Started on a thread of its own: the caller is usually inside a test's tokio runtime, and start-up
            // needs one of its own.
            std::thread::spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
                rt.block_on(start())
            })
            .join()
            .expect("control plane start-up thread")
            .unwrap_or_else(|e| panic!("test control plane: {e:#}"))
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

    /// Replaces the installed CRDs with the manifests in `dir` (e.g. Whereabouts' own), for the test binary's
    /// remaining life, and waits until they are established.
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
        }
        Ok(())
    }

    /// The API server's Prometheus metrics, as text.
    pub async fn metrics(&self) -> String {
        let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
        self.admin().await.request_text(req).await.expect("GET /metrics")
    }
}

async fn client_for(server: &str, ca_pem: &str, id: Identity, token: &str) -> anyhow::Result<Client> {
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

async fn start() -> anyhow::Result<TestCluster> {
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
    let tokens = [random_token("admin")?, random_token("restricted")?, random_token("nobody")?];
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
        // virtual service IPs only: nothing is ever sent to them
        .arg("--service-cluster-ip-range=10.0.0.0/24")
        // no controller-manager makes `default` ServiceAccounts, so pods could not be created with this plugin on
        .arg("--disable-admission-plugins=ServiceAccount")
        // the `kubernetes` Endpoints would carry 127.0.0.1, which validation rejects
        .arg("--endpoint-reconciler-type=none")
        .args(["--allow-privileged=true", "--profiling=false", "-v=1"]);
    launch(&dir, "kube-apiserver", apiserver)?;

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
    Ok(TestCluster { dir, server, ca_pem: pki.ca_pem, tokens, ready_after })
}

fn launch(dir: &Path, name: &str, mut cmd: Command) -> anyhow::Result<()> {
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    let pid = process::spawn(cmd).with_context(|| format!("start {name}"))?;
    process::record_pid(dir, name, pid)?;
    Ok(())
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
    // Established is not yet servable: the first list of a new resource may answer 429 "storage is
    // (re)initializing" for a moment, which no test should have to see.
    let lp = kube::api::ListParams::default().limit(1);
    crate::wait::until(Duration::from_secs(30), "the CRDs to be servable", || async {
        let pools = Api::<IpPool>::all(admin.clone()).list(&lp).await.is_ok();
        let reservations = Api::<OverlappingRangeIpReservation>::all(admin.clone()).list(&lp).await.is_ok();
        let slices = Api::<NodeSlicePool>::all(admin.clone()).list(&lp).await.is_ok();
        (pools && reservations && slices).then_some(())
    })
    .await
}
