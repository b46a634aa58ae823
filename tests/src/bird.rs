//! Real routing daemons for the routing-table datastore's tests: BIRD 2 (Debian's `bird2`) in each simulated
//! node's namespace, full-mesh eBGP over the fabric, running the project's own `deploy/bird/hereabouts.conf`
//! unchanged.
//!
//! A [`RoutedFabric`] is a [`Fabric`] whose nodes' `fab0` have fabric addresses (`198.18.0.<n+1>/24`,
//! `2001:db8:f::<n+1>/64`) and a BIRD each (AS `65001 + n`), peered with every other node over IPv4 and IPv6. The
//! daemons are killed before the namespaces go.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::netns::Fabric;
use crate::{process, testenv};

/// `bird`, with the package to install when it is missing.
pub fn bird_bin() -> &'static str {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        let found =
            Command::new("bird").arg("--version").output().is_ok_and(|o| !o.stderr.is_empty() || o.status.success());
        assert!(found, "`bird` (BIRD 2) is missing: run `apt-get install bird2` (`make test` does, as root)");
    });
    "bird"
}

/// The fabric address of node `n`.
pub fn fabric_v4(n: usize) -> String {
    format!("198.18.0.{}", n + 1)
}

/// The fabric IPv6 address of node `n`.
pub fn fabric_v6(n: usize) -> String {
    format!("2001:db8:f::{}", n + 1)
}

/// One BIRD in one namespace; killed when dropped.
#[derive(Debug)]
pub struct Bird {
    pid: u32,
    /// Its control socket, for `birdc -s`.
    pub socket: PathBuf,
    dir: tempfile::TempDir,
}

impl Bird {
    /// Starts BIRD in namespace `ns` as node `n` of `count`, peered with all the others.
    pub fn start(ns: &str, n: usize, count: usize) -> anyhow::Result<Self> {
        bird_bin();
        let dir = tempfile::Builder::new().prefix("hereabouts-bird-").tempdir()?;
        let include = testenv::repo_root().join("deploy/bird/hereabouts.conf");
        let mut conf = format!(
            "router id {};\nlog \"{}\" all;\ninclude \"{}\";\n",
            fabric_v4(n),
            dir.path().join("bird.log").display(),
            include.display()
        );
        for peer in (0..count).filter(|p| *p != n) {
            let (me, them) = (65001 + n, 65001 + peer);
            conf += &format!(
                "protocol bgp peer{peer}_4 from hereabouts_peer4 {{ local {} as {me}; neighbor {} as {them}; }}\n",
                fabric_v4(n),
                fabric_v4(peer)
            );
            conf += &format!(
                "protocol bgp peer{peer}_6 from hereabouts_peer6 {{ local {} as {me}; neighbor {} as {them}; }}\n",
                fabric_v6(n),
                fabric_v6(peer)
            );
        }
        let path = dir.path().join("bird.conf");
        std::fs::write(&path, conf)?;
        let socket = dir.path().join("bird.ctl");
        let mut cmd = Command::new(crate::netns::ip_bin());
        cmd.args(["netns", "exec", ns, bird_bin(), "-f", "-c"])
            .arg(&path)
            .arg("-s")
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("bird.stderr"))?);
        let pid = process::spawn(cmd).context("start bird")?;
        Ok(Self { pid, socket, dir })
    }

    /// `birdc -s <socket> ARGS`.
    pub fn birdc(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("birdc").arg("-s").arg(&self.socket).args(args).output().context("run birdc")?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Freezes the daemon (SIGSTOP): routes neither leave nor reach this node until [`Self::resume`], as with a
    /// slow or lagging daemon. Netlink notifications and BGP updates queue up meanwhile.
    pub fn pause(&self) {
        signal(self.pid, "-STOP");
    }

    /// Lets a paused daemon go on (SIGCONT).
    pub fn resume(&self) {
        signal(self.pid, "-CONT");
    }

    /// What BIRD logged (and printed), for a failure message.
    pub fn log(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        read("bird.stderr") + &read("bird.log")
    }

    /// Waits until every BGP session is established.
    pub fn wait_established(&self, within: Duration) -> anyhow::Result<()> {
        let t0 = Instant::now();
        loop {
            let shown = self.birdc(&["show", "protocols"]).unwrap_or_default();
            let bgp: Vec<&str> = shown.lines().filter(|l| l.contains(" BGP ")).collect();
            if !bgp.is_empty() && bgp.iter().all(|l| l.contains("Established")) {
                return Ok(());
            }
            if t0.elapsed() > within {
                bail!("BGP sessions not established after {within:?}:\n{shown}\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args([sig, &pid.to_string()]).status().is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} (bird)");
}

impl Drop for Bird {
    fn drop(&mut self) {
        let _ = process::kill(self.pid);
    }
}

/// One route of a node's table, as `ip -N -j route` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRoute {
    pub dst: IpAddr,
    pub protocol: u8,
    pub metric: u32,
    /// `via`, for a learned route.
    pub gateway: Option<IpAddr>,
}

/// A fabric whose nodes run BIRD.
#[derive(Debug)]
pub struct RoutedFabric {
    // dropped first: the daemons live in the fabric's namespaces
    pub birds: Vec<Bird>,
    pub fabric: Fabric,
}

impl RoutedFabric {
    /// A fabric of `node_names` (with API relays to `api_port` when given), addressed, with BIRD established on
    /// every node.
    pub fn new(node_names: &[String], api_port: Option<u16>) -> anyhow::Result<Self> {
        bird_bin();
        let fabric = Fabric::new(node_names, api_port)?;
        for (n, node) in fabric.nodes.iter().enumerate() {
            node.netns.ip(&["addr", "add", &format!("{}/24", fabric_v4(n)), "dev", "fab0"])?;
            node.netns.ip(&["addr", "add", &format!("{}/64", fabric_v6(n)), "dev", "fab0", "nodad"])?;
        }
        let mut me = Self { birds: Vec::new(), fabric };
        let count = node_names.len();
        for (n, node) in me.fabric.nodes.iter().enumerate() {
            me.birds.push(Bird::start(&node.netns.name, n, count)?);
        }
        for bird in &me.birds {
            bird.wait_established(Duration::from_secs(60))?;
        }
        Ok(me)
    }

    /// The host routes (/32 and /128) of table `table` on node `n`, both families.
    pub fn host_routes(&self, n: usize, table: &str) -> Vec<KernelRoute> {
        let ns = &self.fabric.nodes[n].netns;
        let mut out = Vec::new();
        for family in ["-4", "-6"] {
            let listed = ns.ip(&["-N", "-j", family, "route", "show", "table", table]).unwrap_or_default();
            let listed: serde_json::Value = serde_json::from_str(listed.trim()).unwrap_or_default();
            for r in listed.as_array().into_iter().flatten() {
                let Some(dst) = r["dst"].as_str().and_then(|d| d.parse::<IpAddr>().ok()) else { continue };
                out.push(KernelRoute {
                    dst,
                    protocol: r["protocol"].as_str().and_then(|p| p.parse().ok()).unwrap_or(0),
                    metric: r["metric"].as_u64().and_then(|m| u32::try_from(m).ok()).unwrap_or(0),
                    gateway: r["gateway"].as_str().and_then(|g| g.parse().ok()),
                });
            }
        }
        out
    }

    /// Waits until `ok` holds of every node's host routes of table main; the error shows them all.
    pub fn wait_routes(&self, within: Duration, ok: impl Fn(usize, &[KernelRoute]) -> bool) -> anyhow::Result<()> {
        let t0 = Instant::now();
        loop {
            let all: Vec<Vec<KernelRoute>> = (0..self.birds.len()).map(|n| self.host_routes(n, "main")).collect();
            if all.iter().enumerate().all(|(n, r)| ok(n, r)) {
                return Ok(());
            }
            if t0.elapsed() > within {
                bail!("routes not as expected after {within:?}: {all:#?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
