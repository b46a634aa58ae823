//! One node agent per simulated node (`hereabouts-reconciler agent`, as the DaemonSet's agent container runs it),
//! each on its own socket, for the length of one round.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// The round's agents; stopped (SIGKILL) with [`Agents::stop`] or when dropped.
#[derive(Debug)]
pub struct Agents {
    pub dir: PathBuf,
    children: Vec<Child>,
}

impl Agents {
    /// Starts an agent for each of `nodes` serving `<dir>/<node>.sock`, and waits until every socket is there.
    pub async fn start(dir: &Path, nodes: &[String]) -> anyhow::Result<Self> {
        let program = std::env::current_exe()?.with_file_name("hereabouts-reconciler");
        if !program.is_file() {
            bail!("{} is missing: run `make bench` (it builds it)", program.display());
        }
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let mut me = Self { dir: dir.to_path_buf(), children: Vec::new() };
        for node in nodes {
            let log = std::fs::File::create(dir.join(format!("{node}.log")))?;
            let child = Command::new(&program)
                .arg("agent")
                .arg("--socket")
                .arg(dir.join(format!("{node}.sock")))
                .args(["--node-name", node])
                // per-invocation lines would cost the agents more than their work
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("start {}", program.display()))?;
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
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        self.kill();
    }
}
