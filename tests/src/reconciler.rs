//! Running `hereabouts-reconciler run` as a process against the test control plane, as the DaemonSet would.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::plugin::workspace_bin;
use crate::{Identity, TestCluster, wait};

/// A running reconciler; killed when dropped.
#[derive(Debug)]
pub struct Reconciler {
    child: Option<Child>,
    pub listen: String,
    pub log: PathBuf,
}

/// How to start one.
#[derive(Debug, Clone)]
pub struct ReconcilerOptions {
    pub node: String,
    pub namespace: String,
    pub identity: String,
    pub cron: String,
    pub grace: String,
    /// `--orphan-age`: tests' ADDs take milliseconds, so a claim a couple of seconds old is abandoned.
    pub orphan_age: String,
    pub lease: String,
}

impl ReconcilerOptions {
    /// Node `node`, pools in `namespace`, cron every 2 s, grace 1 s.
    pub fn new(node: &str, namespace: &str) -> Self {
        Self {
            node: node.into(),
            namespace: namespace.into(),
            identity: format!("reconciler-{node}"),
            cron: "*/2 * * * * *".into(),
            grace: "1s".into(),
            orphan_age: "2s".into(),
            lease: format!("hereabouts-{namespace}"),
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
        let kubeconfig = cluster.kubeconfig(Identity::Restricted, &opts.namespace);
        let config_dir = cluster.dir().join(format!("reconciler-config-{}-{}", opts.namespace, opts.identity));
        std::fs::create_dir_all(&config_dir).unwrap();
        let log = cluster.dir().join(format!("reconciler-{}-{}.log", opts.namespace, opts.identity));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(workspace_bin("hereabouts-reconciler"))
            .arg("run")
            .args(["--node-name", &opts.node, "--namespace", &opts.namespace, "--identity", &opts.identity])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--config-dir")
            .arg(&config_dir)
            .arg("--flat-file")
            .arg(config_dir.join("absent.conf"))
            .args(["--cron-expression", &opts.cron, "--grace-period", &opts.grace, "--lease-name", &opts.lease])
            .args(["--orphan-age", &opts.orphan_age, "--node-resync", "2s"])
            .args(["--listen", &listen])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start hereabouts-reconciler");
        Self { child: Some(child), listen, log }
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
        tokio::task::spawn_blocking(move || http_get(&addr, &path)).await.ok().flatten()
    }

    /// The value of a metric line (name with labels, as printed), summed if it appears more than once.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
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
