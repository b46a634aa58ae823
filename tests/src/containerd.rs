//! A containerd of a test's own: root, state and socket under a temporary directory, so it never meets the
//! machine's runtime; stopped, its mounts undone and its directory removed when dropped. containerd, ctr and runc
//! are Debian's packages, which `hack/testenv.sh` installs when it runs as root.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The containerd namespace the tests' images and containers live in.
pub const NAMESPACE: &str = "hereabouts-test";

/// A running containerd.
#[derive(Debug)]
pub struct Containerd {
    dir: tempfile::TempDir,
    child: Child,
    pub socket: PathBuf,
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
}

impl Containerd {
    /// Starts one with CRI off and waits until it answers; panics with its log when it does not within 20 s.
    pub fn start() -> Self {
        // CRI is off: images and containers are driven through ctr, and CRI would want a CNI config.
        Self::start_with("disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n")
    }

    /// Starts one whose config is its root, state and socket followed by `config` (TOML, version 2), and waits
    /// until it answers.
    pub fn start_with(config: &str) -> Self {
        for tool in ["containerd", "ctr", "runc"] {
            assert!(
                on_path(tool),
                "{tool} is not on PATH: run `make testenv` as root (it installs Debian's containerd and runc), or \
                 `apt-get install containerd runc`"
            );
        }
        // Not on /dev/shm: the overlay snapshots of an image want a disk-backed file system.
        let dir = tempfile::Builder::new().prefix("hereabouts-containerd-").tempdir_in("/var/tmp").unwrap();
        let root = dir.path();
        let socket = root.join("containerd.sock");
        let config = format!(
            "version = 2\nroot = \"{r}/root\"\nstate = \"{r}/state\"\n{config}\n[grpc]\n  address = \"{s}\"\n",
            r = root.display(),
            s = socket.display()
        );
        std::fs::write(root.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(root.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(root.join("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let runtime = Self { dir, child, socket };
        // The socket file may exist before the server answers: ask it.
        let t0 = Instant::now();
        while !runtime.ctr(&["version"]).status.success() {
            assert!(t0.elapsed() < Duration::from_secs(20), "containerd did not answer in 20 s:\n{}", runtime.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        runtime
    }

    /// `ctr` against this containerd, in [`NAMESPACE`], killed after 120 s.
    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_in(NAMESPACE, args)
    }

    /// `ctr` against this containerd, in containerd namespace `namespace` (`k8s.io` is the kubelet's), killed after
    /// 120 s.
    pub fn ctr_in(&self, namespace: &str, args: &[&str]) -> Output {
        Command::new("timeout")
            .args(["120", "ctr", "--address"])
            .arg(&self.socket)
            .args(["--namespace", namespace])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr")
    }

    /// Its directory: config, root, state, socket and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What containerd logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    fn mounts_under(dir: &Path) -> Vec<String> {
        let table = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = dir.display().to_string();
        let mut found: Vec<String> = table
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&prefix))
            .map(String::from)
            .collect();
        found.sort_by_key(|m| std::cmp::Reverse(m.len()));
        found
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let t0 = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // shims a failed test left behind name the socket on their command line
        let _ = Command::new("pkill").args(["-KILL", "-f"]).arg(self.dir.path()).status();
        for mount in Self::mounts_under(self.dir.path()) {
            let _ = Command::new("umount").args(["-l", &mount]).status();
        }
    }
}
