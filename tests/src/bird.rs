//! Real routing daemons for the routing-table datastore's tests: BIRD 2 (Debian's `bird2`) in each simulated
//! node's namespace, full-mesh eBGP over the fabric, running the project's own `deploy/bird/hereabouts.conf`
//! unchanged.
//!
//! A [`RoutedFabric`] is a [`Fabric`] whose nodes' `fab0` have fabric addresses (`198.18.0.<n+1>/24`,
//! `2001:db8:f::<n+1>/64`) and a BIRD each (AS `65001 + n`, started with `-R` as the BIRD file asks), peered with
//! every other node over IPv4 and IPv6. The daemons are killed before the namespaces go.
//!
//! **Each node's flat file.** The routing keys that name the node's links, directories and sockets are the node's
//! own (only its flat file, `/etc/cni/net.d/hereabouts.d/hereabouts.conf`, sets them). `ip netns exec <node>`
//! bind-mounts `/etc/netns/<node>/<entry>` over `/etc/<entry>` in the process it starts (ip-netns(8)), so each
//! simulated node gets its own `/etc/cni` at `/etc/netns/<node>/cni`, which every plugin and reconciler run in
//! that node sees at the real path. The machine's `/etc/cni` must exist as the mount point: an empty one is made
//! when missing. The node directories are removed when the fabric goes, and those of killed runs by the next.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::netns::{Fabric, PREFIX};
use crate::{process, testenv};

/// Where `ip netns exec` finds a namespace's own `/etc` entries.
const NETNS_ETC: &str = "/etc/netns";

/// The node's flat file, as every process `ip netns exec <node>` starts sees it.
pub const NODE_FLAT_FILE: &str = "/etc/cni/net.d/hereabouts.d/hereabouts.conf";

/// How long a BGP session must have been established before the plugin counts its exchange done, in the tests'
/// node files: the exchange of a handful of routes takes milliseconds.
pub const SETTLE_MS: u64 = 1000;

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
    pid: Option<u32>,
    ns: String,
    conf: PathBuf,
    /// Its control socket, for `birdc -s` (and the node file's `bird_socket`).
    pub socket: PathBuf,
    dir: tempfile::TempDir,
}

impl Bird {
    /// Starts BIRD in namespace `ns` as node `n` of `count`, peered with all the others; each session gets
    /// `options` (BIRD's `bgp` options, e.g. `hold time 3;`) besides the template's.
    pub fn start(ns: &str, n: usize, count: usize, options: &str) -> anyhow::Result<Self> {
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
                "protocol bgp peer{peer}_4 from hereabouts_peer4 {{ local {} as {me}; neighbor {} as {them}; {options} }}\n",
                fabric_v4(n),
                fabric_v4(peer)
            );
            conf += &format!(
                "protocol bgp peer{peer}_6 from hereabouts_peer6 {{ local {} as {me}; neighbor {} as {them}; {options} }}\n",
                fabric_v6(n),
                fabric_v6(peer)
            );
        }
        let path = dir.path().join("bird.conf");
        std::fs::write(&path, conf)?;
        let socket = dir.path().join("bird.ctl");
        let mut me = Self { pid: None, ns: ns.to_string(), conf: path, socket, dir };
        me.run()?;
        Ok(me)
    }

    /// Starts the daemon as the BIRD file asks: in the foreground, with graceful restart recovery (`-R`).
    fn run(&mut self) -> anyhow::Result<()> {
        let mut cmd = Command::new(crate::netns::ip_bin());
        cmd.args(["netns", "exec", &self.ns, bird_bin(), "-f", "-R", "-c"])
            .arg(&self.conf)
            .arg("-s")
            .arg(&self.socket)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("bird.stderr"))?);
        self.pid = Some(process::spawn(cmd).context("start bird")?);
        Ok(())
    }

    /// `birdc -s <socket> ARGS`.
    pub fn birdc(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("birdc").arg("-s").arg(&self.socket).args(args).output().context("run birdc")?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `birdc disable <protocol>`: the session is shut down (a Cease to the neighbor), its routes flushed on both
    /// sides; no graceful restart.
    pub fn disable(&self, protocol: &str) {
        let said = self.birdc(&["disable", protocol]).unwrap_or_default();
        assert!(said.contains("disabled"), "birdc disable {protocol}: {said}");
    }

    /// `birdc enable <protocol>`.
    pub fn enable(&self, protocol: &str) {
        let said = self.birdc(&["enable", protocol]).unwrap_or_default();
        assert!(said.contains("enabled"), "birdc enable {protocol}: {said}");
    }

    /// SIGKILL: the daemon dies without a word to its peers or the kernel (its sessions' TCP connections close).
    pub fn kill(&mut self) {
        if let Some(pid) = self.pid.take() {
            process::kill(pid).expect("kill bird");
        }
    }

    /// Starts the killed daemon again, with its configuration and socket.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        assert!(self.pid.is_none(), "bird still runs");
        self.run()
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

impl Drop for Bird {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = process::kill(pid);
        }
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
    /// Each node's `route_state_dir`.
    states: Vec<tempfile::TempDir>,
}

/// `/etc/netns/<ns>`: the node's own `/etc` entries.
fn node_etc(ns: &str) -> PathBuf {
    Path::new(NETNS_ETC).join(ns)
}

/// Removes the `/etc/netns` entries of fabrics whose process no longer runs (a killed run).
fn sweep_node_files() {
    let Ok(entries) = std::fs::read_dir(NETNS_ETC) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for RoutedFabric {
    fn drop(&mut self) {
        for node in &self.fabric.nodes {
            let _ = std::fs::remove_dir_all(node_etc(&node.netns.name));
        }
    }
}

impl RoutedFabric {
    /// A fabric of `node_names` (with API relays to `api_port` when given), addressed, with BIRD established on
    /// every node.
    pub fn new(node_names: &[String], api_port: Option<u16>) -> anyhow::Result<Self> {
        Self::with_sessions(node_names, api_port, "")
    }

    /// [`Self::new`] with `options` on every BGP session (e.g. a short hold time).
    pub fn with_sessions(node_names: &[String], api_port: Option<u16>, options: &str) -> anyhow::Result<Self> {
        bird_bin();
        let fabric = Fabric::new(node_names, api_port)?;
        for (n, node) in fabric.nodes.iter().enumerate() {
            node.netns.ip(&["addr", "add", &format!("{}/24", fabric_v4(n)), "dev", "fab0"])?;
            node.netns.ip(&["addr", "add", &format!("{}/64", fabric_v6(n)), "dev", "fab0", "nodad"])?;
        }
        sweep_node_files();
        // the mount point of each node's own /etc/cni (module documentation)
        std::fs::create_dir_all("/etc/cni").context("make /etc/cni, the mount point of the nodes' own")?;
        let mut me = Self { birds: Vec::new(), fabric, states: Vec::new() };
        let count = node_names.len();
        for (n, node) in me.fabric.nodes.iter().enumerate() {
            me.birds.push(Bird::start(&node.netns.name, n, count, options)?);
            me.states.push(tempfile::Builder::new().prefix("hereabouts-routes-").tempdir()?);
        }
        for n in 0..count {
            me.node_file(n, json!({}))?;
        }
        for bird in &me.birds {
            bird.wait_established(Duration::from_secs(60))?;
        }
        Ok(me)
    }

    /// Node `n`'s `route_state_dir`.
    pub fn state_dir(&self, n: usize) -> &Path {
        self.states[n].path()
    }

    /// Writes node `n`'s flat file: its routes on `fab0`, records in [`Self::state_dir`], its BIRD's socket,
    /// [`SETTLE_MS`], and `extra` over them.
    pub fn node_file(&self, n: usize, extra: Value) -> anyhow::Result<()> {
        let mut file = json!({
            "route_device": "fab0",
            "route_state_dir": self.state_dir(n),
            "bird_socket": self.birds[n].socket,
            "bird_settle_ms": SETTLE_MS,
        });
        file.as_object_mut().unwrap().extend(extra.as_object().expect("an object").clone());
        let path = node_etc(&self.fabric.nodes[n].netns.name).join("cni/net.d/hereabouts.d/hereabouts.conf");
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(&path, file.to_string()).with_context(|| format!("write {}", path.display()))
    }

    /// Holds the fabric: every bridge port stops forwarding, so no BGP message gets through, while the sessions
    /// stay established (nothing tells the daemons; their TCP connections retransmit), as on a congested or
    /// partitioned network shorter than the hold time.
    pub fn hold(&self) {
        self.set_ports("0");
    }

    /// Lets the fabric forward again; what was held arrives with TCP's next retransmission (a fraction of a second).
    pub fn release(&self) {
        self.set_ports("3");
    }

    fn set_ports(&self, state: &str) {
        for n in 0..self.fabric.nodes.len() {
            let port = format!("n{n}");
            let ok = Command::new("bridge")
                .args(["-n", &self.fabric.bridge.name, "link", "set", "dev", &port, "state", state])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "bridge link set dev {port} state {state} (iproute2's bridge)");
        }
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
