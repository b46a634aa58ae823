//! `hereabouts-reconciler agent` as a process: the node agent the CNI binary hands its invocations to.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::plugin::workspace_bin;
use crate::wait;

/// A running agent; killed when dropped.
#[derive(Debug)]
pub struct Agent {
    child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
    /// Where its /healthz, /readyz and /metrics are served.
    pub listen: String,
}

impl Agent {
    /// Starts an agent for node `node` serving `socket` (its log beside it, its warm journal in a directory
    /// beside it), and waits until the socket is there.
    pub async fn start(socket: &Path, node: &str) -> Self {
        Self::start_with(socket, node, &[]).await
    }

    /// [`Agent::start`] with more environment: `KUBECONFIG` names the agent's own identity (the one it asks
    /// whether Whereabouts' reconciler runs with), as a DaemonSet pod's service account is in the cluster. It
    /// claims no slice ahead (`--claim-ahead=false`): agents of tests that run at once on one control plane would
    /// claim in each other's networks, whose NADs they all see.
    pub async fn start_with(socket: &Path, node: &str, env: &[(&str, &Path)]) -> Self {
        Self::launch(socket, node, env, None, false).await
    }

    /// [`Agent::start_with`], claiming its node's slices ahead as NADs appear (`--claim-ahead`, the default of the
    /// chart's agent).
    pub async fn start_claiming_ahead(socket: &Path, node: &str, env: &[(&str, &Path)]) -> Self {
        Self::launch(socket, node, env, None, true).await
    }

    /// [`Agent::start`] following `kubeconfig`'s pools from its start (`--follow`, as the chart has it follow
    /// install-cni's): it serves once its watches have listed them, or after its 10 s wait.
    pub async fn start_following(socket: &Path, node: &str, kubeconfig: &Path) -> Self {
        Self::launch(socket, node, &[], Some(kubeconfig), false).await
    }

    async fn launch(socket: &Path, node: &str, env: &[(&str, &Path)], follow: Option<&Path>, ahead: bool) -> Self {
        let log = socket.with_extension("log");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let listen = format!("127.0.0.1:{port}");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(workspace_bin("hereabouts-reconciler"))
            .arg("agent")
            .arg("--socket")
            .arg(socket)
            .args(["--node-name", node, "--listen", &listen])
            .arg(format!("--claim-ahead={ahead}"))
            .arg("--warm-dir")
            .arg(socket.with_extension("warm"))
            .args(follow.map(|k| [std::ffi::OsStr::new("--follow"), k.as_os_str()]).into_iter().flatten())
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start hereabouts-reconciler agent");
        let me = Self { child: Some(child), socket: socket.to_path_buf(), log, listen };
        let up = wait::until(Duration::from_secs(20), "the agent's socket", || async {
            me.logs().contains("agent serving the CNI").then_some(())
        })
        .await;
        if let Err(e) = up {
            panic!("{e}\n--- agent log ---\n{}", me.logs());
        }
        me
    }

    /// `path` of its HTTP endpoint, if it answers 200.
    pub fn get(&self, path: &str) -> Option<String> {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(&self.listen).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.listen).ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.contains(" 200 ").then(|| body.to_string())
    }

    /// What it logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: a crash, leaving its socket file behind.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}
