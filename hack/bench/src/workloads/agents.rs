//! One node agent per simulated node (`hereabouts-reconciler agent`, as the DaemonSet's agent container runs it),
//! each on its own socket, with its own warm journal directory, for the length of one round.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// The agents' log filter: warnings only, since per-invocation lines would cost the agents more than their work.
const QUIET: &str = "warn";

/// With a warm reserve: also the lines the bench counts: the reserve's (a take, a hand-over round, a refusal), the
/// ADDs answered from it, and every invocation the agent served (the rest its binaries did themselves).
const WARM_LINES: &str =
    "warn,hereabouts_ipam::warm=info,hereabouts_ipam::verbs=info,hereabouts_reconciler::agent=info";

/// Agents that keep warm reserves: their own identity, and where their journals go.
#[derive(Debug, Clone, Copy)]
pub struct Warm<'a> {
    /// Their kubeconfig (`KUBECONFIG`, as a DaemonSet pod's service account), with which they ask whether
    /// Whereabouts' reconciler runs before keeping a reserve.
    pub identity: &'a Path,
    /// The directory of their journals (`<node>` each): on a disk, as a node's is, since every take fsyncs there
    /// before its ADD answers. Their logs are copied there when they stop, since the control plane's state
    /// directory goes when the bench ends.
    pub journals: &'a Path,
}

/// The round's agents; stopped (SIGKILL) with [`Agents::stop`] or when dropped.
#[derive(Debug)]
pub struct Agents {
    pub dir: PathBuf,
    children: Vec<Child>,
    /// Where their logs are kept once they stop.
    keep: Option<PathBuf>,
}

impl Agents {
    /// Starts an agent for each of `nodes` serving `<dir>/<node>.sock` and logging to `<dir>/<node>.log`; waits
    /// until every socket is there, which each serves once it has listed the pools of `follow` (the networks'
    /// kubeconfig, as the chart has each agent follow install-cni's) for its node. Each has a warm journal directory of its own (all simulated nodes share this
    /// machine, so none may use the default): in `warm`'s journals when given (their warm lines are logged then),
    /// else `<dir>/<node>.warm`, never written without a reserve.
    ///
    /// `identity` (or `warm`'s) is their own kubeconfig (`KUBECONFIG`), with which they watch the
    /// NetworkAttachmentDefinitions and claim their nodes' slices ahead; without one they claim on their first ADDs.
    pub async fn start(
        dir: &Path,
        nodes: &[String],
        follow: &Path,
        identity: Option<&Path>,
        warm: Option<Warm<'_>>,
    ) -> anyhow::Result<Self> {
        let program = std::env::current_exe()?.with_file_name("hereabouts-reconciler");
        if !program.is_file() {
            bail!("{} is missing: run `make bench` (it builds it)", program.display());
        }
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let keep = warm.map(|w| w.journals.to_path_buf());
        let mut me = Self { dir: dir.to_path_buf(), children: Vec::new(), keep };
        for node in nodes {
            let log = std::fs::File::create(me.log(node))?;
            let journal = match warm {
                Some(w) => w.journals.join(node),
                None => dir.join(format!("{node}.warm")),
            };
            let mut cmd = Command::new(&program);
            cmd.arg("agent")
                .arg("--socket")
                .arg(dir.join(format!("{node}.sock")))
                .args(["--node-name", node])
                .arg("--follow")
                .arg(follow)
                .arg("--warm-dir")
                .arg(journal)
                .env("RUST_LOG", if warm.is_some() { WARM_LINES } else { QUIET })
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            if let Some(own) = warm.map(|w| w.identity).or(identity) {
                cmd.env("KUBECONFIG", own);
            }
            let child = cmd.spawn().with_context(|| format!("start {}", program.display()))?;
            me.children.push(child);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !nodes.iter().all(|n| dir.join(format!("{n}.sock")).exists()) {
            if Instant::now() > deadline {
                bail!("the agents' sockets did not appear in {} within 20 s", dir.display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(me)
    }

    /// The agents' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// The log of `node`'s agent.
    pub fn log(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.log"))
    }

    /// Stops the agents; returns the largest peak resident memory among them (VmHWM), in MiB, when it could be
    /// read.
    pub fn stop(mut self) -> Option<f64> {
        let peak = self
            .children
            .iter()
            .filter_map(|c| {
                let status = std::fs::read_to_string(format!("/proc/{}/status", c.id())).ok()?;
                let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
                line.split_whitespace().nth(1)?.parse::<f64>().ok()
            })
            .fold(None, |max: Option<f64>, kib| Some(max.map_or(kib, |m| m.max(kib))));
        self.kill();
        peak.map(|kib| kib / 1024.0)
    }

    fn kill(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
        if let Some(keep) = self.keep.take() {
            for log in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                if log.path().extension().is_some_and(|x| x == "log") {
                    let _ = std::fs::copy(log.path(), keep.join(log.file_name()));
                }
            }
        }
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        self.kill();
    }
}
