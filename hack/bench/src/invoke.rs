//! One CNI invocation, run as a container runtime runs it: the compiled binary as a process, CNI_* in the
//! environment, the network config on stdin.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use serde_json::Value;
use tokio::io::AsyncWriteExt as _;

/// One round's namespace and network config.
#[derive(Debug)]
pub struct Round {
    pub ns: String,
    pub config: String,
    pub program: PathBuf,
    /// The directory of the node agents' sockets (`<node>.sock`), when the round runs through agents; else the
    /// binary does every invocation itself.
    pub agents: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Op {
    pub command: &'static str,
    pub pod: String,
    pub node: String,
}

impl Op {
    pub fn add(pod: String, node: String) -> Self {
        Op { command: "ADD", pod, node }
    }
}

#[derive(Debug, Clone)]
pub struct OpResult {
    pub command: &'static str,
    pub pod: String,
    /// From the round's start to spawning the process, and to its exit.
    pub start: Duration,
    pub end: Duration,
    pub ip: Option<Ipv4Addr>,
    /// Keyed by CNI error code and message, so that failures group.
    pub error: Option<String>,
    pub sample: Option<String>,
}

impl OpResult {
    pub fn ms(&self) -> f64 {
        (self.end - self.start).as_secs_f64() * 1000.0
    }

    /// The CNI error code the plugin answered with, if it failed with one.
    pub fn code(&self) -> Option<u64> {
        self.error.as_deref()?.strip_prefix("code ")?.split(':').next()?.parse().ok()
    }
}

/// Time limits of one round's invocations.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// When the round's clock started: every result is timed from it.
    pub t0: Instant,
    /// Nothing runs past it.
    pub deadline: Instant,
    /// One invocation's cap.
    pub op_timeout: Duration,
}

impl Limits {
    pub fn start(round_timeout: Duration, op_timeout: Duration) -> Self {
        let t0 = Instant::now();
        Limits { t0, deadline: t0 + round_timeout, op_timeout }
    }
}

/// `ops` with at most `parallel` under way at once, in any order.
pub async fn parallel(r: &Round, ops: &[Op], parallel: usize, limits: Limits) -> Vec<OpResult> {
    futures::stream::iter(ops.iter()).map(|op| invoke(r, op, limits)).buffer_unordered(parallel).collect().await
}

pub async fn invoke(r: &Round, op: &Op, limits: Limits) -> OpResult {
    let start = limits.t0.elapsed();
    let mut res =
        OpResult { command: op.command, pod: op.pod.clone(), start, end: start, ip: None, error: None, sample: None };
    let now = Instant::now();
    if now >= limits.deadline {
        res.error = Some("harness: round timeout, not started".into());
        return res;
    }
    let limit = limits.op_timeout.min(limits.deadline - now);
    let mut cmd = tokio::process::Command::new(&r.program);
    cmd.env_clear()
        .env("CNI_COMMAND", op.command)
        // unique across rounds and variants, as a runtime's sandbox IDs are (the node's attachment marks are
        // keyed by it, and rounds reuse pod names)
        .env("CNI_CONTAINERID", format!("{}-{}-c", r.ns, op.pod))
        .env("CNI_NETNS", format!("/var/run/netns/{}", op.pod))
        .env("CNI_IFNAME", "net1")
        .env("CNI_ARGS", format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={}", r.ns, op.pod))
        .env("CNI_PATH", "/opt/cni/bin")
        .env("NODENAME", &op.node)
        .env(
            "HEREABOUTS_AGENT_SOCKET",
            r.agents.as_ref().map(|d| d.join(format!("{}.sock", op.node))).unwrap_or_default(),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let run = async {
        let mut child = cmd.spawn()?;
        let mut pipe = child.stdin.take().context("stdin")?;
        pipe.write_all(r.config.as_bytes()).await?;
        drop(pipe);
        anyhow::Ok(child.wait_with_output().await?)
    };
    let out = tokio::time::timeout(limit, run).await;
    res.end = limits.t0.elapsed();
    match out {
        Err(_) => {
            res.error = Some(if limit < limits.op_timeout {
                "harness: round timeout, killed".to_string()
            } else {
                format!("harness: killed after {} s", limits.op_timeout.as_secs())
            })
        }
        Ok(Err(e)) => res.error = Some(format!("harness: {e}")),
        Ok(Ok(out)) => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            let doc: Option<Value> = serde_json::from_str(stdout.trim()).ok();
            if out.status.success() {
                if op.command == "ADD" {
                    let addr = doc.as_ref().and_then(|d| d["ips"][0]["address"].as_str().map(str::to_string));
                    match addr.and_then(|a| a.split('/').next().and_then(|ip| ip.parse().ok())) {
                        Some(ip) => res.ip = Some(ip),
                        None => res.error = Some(format!("harness: no IPv4 address in {}", clip(&stdout, 200))),
                    }
                }
            } else {
                let key = match &doc {
                    Some(d) => format!(
                        "code {}: {}",
                        d["code"].as_u64().map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
                        normalise(d["msg"].as_str().unwrap_or(""))
                    ),
                    None => format!("exit {}: {}", out.status, normalise(stdout.lines().next().unwrap_or(""))),
                };
                res.error = Some(key);
                res.sample = Some(format!(
                    "stdout: {}\nstderr (tail): {}",
                    clip(&stdout, 600),
                    tail(&String::from_utf8_lossy(&out.stderr), 600)
                ));
            }
        }
    }
    res
}

/// A CNI error message with its variable parts (numbers, names with numbers) folded, to group failures.
fn normalise(msg: &str) -> String {
    let mut out = String::new();
    let mut digits = false;
    for c in msg.chars() {
        if c.is_ascii_digit() {
            if !digits {
                out.push('#');
            }
            digits = true;
        } else {
            digits = false;
            out.push(c);
        }
    }
    clip(&out, 160)
}

fn clip(s: &str, n: usize) -> String {
    let s = s.trim();
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

fn tail(s: &str, n: usize) -> String {
    let s = s.trim();
    let count = s.chars().count();
    if count <= n { s.to_string() } else { format!("…{}", s.chars().skip(count - n).collect::<String>()) }
}
