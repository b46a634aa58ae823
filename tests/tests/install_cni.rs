//! `hereabouts-reconciler install-cni`, run as a process into a temp dir standing for the host's CNI directories,
//! with service-account files standing for the projected volume. No API server is needed.

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hereabouts_ipam::config::{Input, LogLevel, load_with_paths};
use hereabouts_tests::plugin::workspace_bin;
use kube::config::Kubeconfig;
use serde_json::{Value, json};

/// Where the flat file names the kubeconfig: the host's view of `--cni-conf-dir` (the default
/// `--host-cni-conf-dir`).
const HOST_KUBECONFIG: &str = "/etc/cni/net.d/hereabouts.d/hereabouts.kubeconfig";
const NAMESPACE: &str = "hereabouts-pools";
const SERVER: &str = "https://192.0.2.10:6443";

/// A self-signed CA certificate (PEM), as the projected `ca.crt` holds.
fn ca_pem(name: &str) -> String {
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
}

impl Host {
    fn new(layout: Layout, token: &str, ca: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sa")).unwrap();
        let mut host = Self { dir, layout, generation: 0 };
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
        let files = [("token", token), ("ca.crt", ca), ("namespace", NAMESPACE)];
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

    /// `hereabouts-reconciler install-cni` with every path in the temp dir, a clean environment, and `extra`.
    fn command(&self, extra: &[&str]) -> Command {
        let mut cmd = Command::new(workspace_bin("hereabouts-reconciler"));
        cmd.env_clear().arg("install-cni");
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

    fn run_once(&self, extra: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = self.command(extra);
        cmd.arg("--once").envs(env.iter().copied());
        cmd.output().expect("run hereabouts-reconciler install-cni")
    }

    /// Starts the watcher, its stderr going to `install-cni.log` in the temp dir (see [`Host::log`]).
    fn spawn(&self, extra: &[&str]) -> Running {
        let log = fs::File::create(self.path("install-cni.log")).unwrap();
        let child = self
            .command(extra)
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
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[allow(unsafe_code)]
fn sigterm(pid: libc::pid_t) {
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped, so it is still ours.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(rc, 0, "kill({pid}, SIGTERM): {}", std::io::Error::last_os_error());
}

/// Polls `check` every 50 ms until it gives `Some`; panics naming `what` (and showing `log()`) after `timeout`.
fn wait_for<T>(timeout: Duration, what: &str, log: impl Fn() -> String, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; install-cni log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn assert_success(out: &Output) {
    assert!(out.status.success(), "install-cni failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
}

/// Whether two files have the same bytes (streamed: the plugin binary is large in a debug build).
fn same_bytes(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (fs::File::open(a).unwrap(), fs::File::open(b).unwrap());
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = read_full(&mut fa, &mut ba);
        let nb = read_full(&mut fb, &mut bb);
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

/// What the kubeconfig at `path` says. Panics if it does not parse: a reader must never see a partial file.
#[derive(Debug, PartialEq, Eq)]
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
async fn once_installs_the_binary_kubeconfig_and_flat_file_and_a_rerun_keeps_the_binary() {
    let ca = ca_pem("install-cni-test-ca");
    let host = Host::new(Layout::Projected, "token-one\n", &ca);
    let extra = ["--log-level", "verbose", "--reconciler-cron-expression", "30 4 * * *"];
    // No --server: it comes from the kubelet's service variables, an IPv6 host bracketed.
    let service = [("KUBERNETES_SERVICE_HOST", "fd00:10:96::1"), ("KUBERNETES_SERVICE_PORT", "443")];
    let out = host.run_once(&extra, &service);
    assert_success(&out);

    let source = workspace_bin("hereabouts");
    assert!(same_bytes(&source, &host.binary()), "the installed binary differs from {}", source.display());
    assert_eq!(mode(&host.binary()), 0o755);

    assert_eq!(mode(&host.kubeconfig()), 0o600);
    let seen = read_kubeconfig(&host.kubeconfig()).expect("the kubeconfig exists");
    assert_eq!(
        seen,
        Seen {
            server: "https://[fd00:10:96::1]:443".into(),
            token: "token-one".into(),
            ca: ca.clone(),
            namespace: NAMESPACE.into()
        }
    );
    // The CNI plugin builds its client from it: the embedded CA must be a usable certificate.
    let (_client, namespace) =
        hereabouts_ipam::store::connect(&host.kubeconfig()).await.expect("a client from the kubeconfig");
    assert_eq!(namespace, NAMESPACE);

    let flat: Value = serde_json::from_slice(&fs::read(host.flat_file()).unwrap()).expect("the flat file is JSON");
    assert_eq!(flat["kubernetes"]["kubeconfig"], HOST_KUBECONFIG, "the host's path of the kubeconfig: {flat}");
    assert_eq!(flat["log_level"], "verbose");
    assert_eq!(flat["reconciler_cron_expression"], "30 4 * * *");
    // As the CNI plugin loads it: an inline netconf pointing at the flat file.
    let stdin = json!({"cniVersion": "1.0.0", "name": "net1", "type": "macvlan",
        "ipam": {"type": "hereabouts", "range": "10.20.0.0/24", "configuration_path": host.flat_file()}});
    let stdin = serde_json::to_vec(&stdin).unwrap();
    let cfg = load_with_paths(&Input { stdin: &stdin, cni_args: "" }, &[]).expect("the flat file loads");
    assert_eq!(cfg.kubeconfig.as_deref(), Some(Path::new(HOST_KUBECONFIG)));
    assert_eq!(cfg.log_level, LogLevel::Verbose);
    assert_eq!(cfg.reconciler_cron_expression.as_deref(), Some("30 4 * * *"));
    assert_eq!(cfg.flat_file.as_deref(), Some(host.flat_file().as_path()));

    let names: Vec<String> = fs::read_dir(host.path("net.d/hereabouts.d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "only the kubeconfig and the flat file, no temp file: {names:?}");

    // A restart changes nothing on the host: the binary is neither copied nor renamed over.
    let before = fs::metadata(host.binary()).unwrap();
    let kubeconfig_ino = fs::metadata(host.kubeconfig()).unwrap().ino();
    std::thread::sleep(Duration::from_millis(20));
    let out = host.run_once(&extra, &service);
    assert_success(&out);
    let after = fs::metadata(host.binary()).unwrap();
    assert_eq!((after.ino(), after.mtime(), after.mtime_nsec()), (before.ino(), before.mtime(), before.mtime_nsec()));
    assert_eq!(fs::metadata(host.kubeconfig()).unwrap().ino(), kubeconfig_ino, "the same kubeconfig is not rewritten");
    assert!(String::from_utf8_lossy(&out.stderr).contains("up to date"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Starts the watcher, rotates the token, then changes the CA, each time waiting for the kubeconfig to follow,
/// then stops it with SIGTERM.
fn watch_follows_rotation(layout: Layout) {
    let (ca1, ca2) = (ca_pem("ca-one"), ca_pem("ca-two"));
    let mut host = Host::new(layout, "token-one", &ca1);
    let mut running = host.spawn(&["--server", SERVER, "--watch-interval", "200ms"]);
    let log = || host.log();
    let timeout = Duration::from_secs(10);

    // The flat file is written last, after the kubeconfig it names.
    wait_for(timeout, "the flat file", log, || host.flat_file().is_file().then_some(()));
    let seen = read_kubeconfig(&host.kubeconfig()).expect("the kubeconfig is written before the flat file");
    assert_eq!((seen.token.as_str(), seen.ca.as_str(), seen.server.as_str()), ("token-one", ca1.as_str(), SERVER));
    assert!(running.is_running(), "install-cni exited instead of watching; log:\n{}", host.log());

    host.write_sa("token-two\n", &ca1);
    let log = || host.log();
    wait_for(timeout, "the kubeconfig to hold the rotated token", log, || {
        read_kubeconfig(&host.kubeconfig()).filter(|s| s.token == "token-two")
    });
    assert_eq!(mode(&host.kubeconfig()), 0o600, "still 0600 after the rewrite");

    host.write_sa("token-two", &ca2);
    let log = || host.log();
    let seen = wait_for(timeout, "the kubeconfig to hold the new CA", log, || {
        read_kubeconfig(&host.kubeconfig()).filter(|s| s.ca == ca2)
    });
    assert_eq!((seen.token.as_str(), seen.namespace.as_str()), ("token-two", NAMESPACE));
    assert_eq!(mode(&host.kubeconfig()), 0o600);

    sigterm(running.pid());
    let status = running.wait_timeout(Duration::from_secs(5));
    let status = status.unwrap_or_else(|| panic!("install-cni still running 5s after SIGTERM; log:\n{}", host.log()));
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM; log:\n{}", host.log());
    let log = host.log();
    assert!(log.contains("token changed") && log.contains("CA changed") && log.contains("SIGTERM"), "{log}");
}

#[test]
fn watch_rewrites_the_kubeconfig_when_files_are_renamed_over_and_exits_0_on_sigterm() {
    watch_follows_rotation(Layout::Plain);
}

#[test]
fn watch_rewrites_the_kubeconfig_when_the_kubelet_swaps_the_data_symlink() {
    watch_follows_rotation(Layout::Projected);
}

#[test]
fn a_missing_token_file_fails_naming_it_and_writes_no_kubeconfig() {
    let host = Host::new(Layout::Plain, "token", &ca_pem("ca"));
    fs::remove_file(host.sa("token")).unwrap();
    let token = host.sa("token");

    let out = host.run_once(&["--server", SERVER], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "install-cni succeeded without a token:\n{stderr}");
    assert!(stderr.contains(&format!("read token file {}", token.display())), "the message names the file:\n{stderr}");
    assert!(!host.kubeconfig().exists(), "a kubeconfig was written");
    assert!(!host.flat_file().exists(), "a flat file was written");

    // Watch mode fails the same way, at once, instead of waiting for the token to appear.
    let mut running = host.spawn(&["--server", SERVER]);
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
    for (flag, env) in [
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
        ("--once", "HEREABOUTS_INSTALL_ONCE"),
    ] {
        assert!(help.contains(flag) && help.contains(env), "{flag} / {env} missing from:\n{help}");
    }
}
