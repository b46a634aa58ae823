//! Running the compiled `hereabouts` binary as a container runtime does: CNI_* in the environment, the network
//! config on stdin, the result or a CNI error on stdout.

use std::path::PathBuf;
use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

/// The directory cargo puts the workspace's binaries in, of the profile this executable was built with: a test
/// executable lives in its `deps/`, a binary in it directly.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the executable's path");
    let dir = exe.parent().expect("target/<profile>/[deps/]<exe>");
    if dir.ends_with("deps") { dir.parent().expect("target/<profile>").to_path_buf() } else { dir.to_path_buf() }
}

/// The path of a workspace binary; panics with the command that builds it when it is missing.
/// `HEREABOUTS_BIN_DIR` points the tests at binaries built elsewhere (another commit, to show a test failing
/// before its fix).
pub fn workspace_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("HEREABOUTS_BIN_DIR").map_or_else(target_dir, PathBuf::from);
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace --bins` (or `make test`, which does) first",
        path.display()
    );
    path
}

/// One CNI invocation.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub command: &'static str,
    pub container_id: String,
    pub ifname: String,
    pub args: String,
    /// Extra environment, e.g. `NODENAME`.
    pub env: Vec<(String, String)>,
    /// The plugin to run instead of `hereabouts` (e.g. upstream Whereabouts).
    pub program: Option<PathBuf>,
    /// The network namespace to run it in (`ip netns exec`), as a runtime on a simulated node would.
    pub netns: Option<String>,
    pub config: Value,
}

impl Invocation {
    /// An invocation of `command` for pod `namespace/name` with container `container_id` on interface `net1`.
    pub fn new(command: &'static str, config: &Value, namespace: &str, pod: &str, container_id: &str) -> Self {
        Self {
            command,
            container_id: container_id.to_string(),
            ifname: "net1".to_string(),
            args: format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod}"),
            // the binary itself, whatever agent this machine runs: a test asks an agent by naming its socket
            env: vec![("HEREABOUTS_AGENT_SOCKET".into(), String::new())],
            program: None,
            netns: None,
            config: config.clone(),
        }
    }

    /// Sets an extra environment variable.
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Runs the plugin in network namespace `ns`.
    pub fn in_netns(mut self, ns: &str) -> Self {
        self.netns = Some(ns.to_string());
        self
    }

    /// Runs the plugin and collects what it printed.
    pub async fn run(&self) -> Output {
        self.run_raw(self.config.to_string().as_bytes()).await
    }

    /// Runs the plugin with `stdin` as given (for malformed input).
    pub async fn run_raw(&self, stdin: &[u8]) -> Output {
        self.start_raw(stdin).await.wait().await
    }

    /// Starts the plugin, as a runtime would, without waiting for it: the test may kill it half-way.
    pub async fn start(&self) -> Running {
        self.start_raw(self.config.to_string().as_bytes()).await
    }

    async fn start_raw(&self, stdin: &[u8]) -> Running {
        let program = self.program.clone().unwrap_or_else(|| workspace_bin("hereabouts"));
        let mut cmd = match &self.netns {
            Some(ns) => {
                // absolute: the environment is cleared below, PATH with it
                let ip = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                    .map(|d| d.join(crate::netns::ip_bin()))
                    .find(|p| p.is_file())
                    .expect("`ip` (iproute2) on PATH");
                let mut c = tokio::process::Command::new(ip);
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            None => tokio::process::Command::new(program),
        };
        cmd.env_clear()
            .env("CNI_COMMAND", self.command)
            .env("CNI_CONTAINERID", &self.container_id)
            .env("CNI_NETNS", format!("/var/run/netns/{}", self.container_id))
            .env("CNI_IFNAME", &self.ifname)
            .env("CNI_ARGS", &self.args)
            .env("CNI_PATH", target_dir())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn hereabouts");
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(stdin).await.expect("write the config to the plugin");
        drop(pipe);
        Running { child }
    }
}

/// A plugin process under way.
#[derive(Debug)]
pub struct Running {
    child: tokio::process::Child,
}

impl Running {
    /// Waits for it and collects what it printed.
    pub async fn wait(self) -> Output {
        let out = self.child.wait_with_output().await.expect("wait for hereabouts");
        Output {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// SIGKILLs it, as a runtime does when its timeout expires, and waits until it is gone.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("kill hereabouts");
    }
}

/// What one invocation printed.
#[derive(Debug, Clone)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The JSON on stdout (result or error); panics when stdout is not one JSON document.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}\nstderr: {}", self.stdout, self.stderr))
    }

    /// The result of a successful invocation; panics with what the plugin said otherwise.
    pub fn result(&self) -> Value {
        assert!(self.success, "plugin failed: {}\nstderr: {}", self.stdout, self.stderr);
        self.json()
    }

    /// The CNI error code of a failed invocation; panics when it succeeded.
    pub fn error_code(&self) -> u64 {
        assert!(!self.success, "plugin succeeded where it should fail: {}", self.stdout);
        self.json()["code"].as_u64().unwrap_or_else(|| panic!("no code in {}", self.stdout))
    }

    /// The addresses of an ADD result, without prefix length.
    pub fn ips(&self) -> Vec<std::net::IpAddr> {
        self.result()["ips"]
            .as_array()
            .expect("ips in the result")
            .iter()
            .map(|ip| {
                let cidr = ip["address"].as_str().expect("address");
                cidr.split('/').next().unwrap().parse().expect("an IP")
            })
            .collect()
    }
}

/// A network config whose IPAM is hereabouts, with `ipam` merged over the kubeconfig and log settings.
pub fn netconf(cni_version: &str, name: &str, kubeconfig: &std::path::Path, ipam: Value) -> Value {
    let mut full = json!({
        "type": "hereabouts",
        "kubernetes": {"kubeconfig": kubeconfig},
        "log_level": "debug",
    });
    if let (Some(full), Some(extra)) = (full.as_object_mut(), ipam.as_object()) {
        full.extend(extra.clone());
    }
    json!({"cniVersion": cni_version, "name": name, "type": "macvlan", "ipam": full})
}

/// An invocation of upstream Whereabouts with the same config (ipam type swapped), as the admin of `namespace`:
/// Whereabouts takes a Lease per pool, which the CNI role does not grant (its own docs give it admin).
pub fn whereabouts(
    cluster: &crate::TestCluster,
    namespace: &str,
    command: &'static str,
    config: &Value,
    pod: &str,
    container_id: &str,
) -> Invocation {
    let kubeconfig = cluster.kubeconfig(crate::Identity::Admin, namespace);
    whereabouts_via(cluster, &kubeconfig, namespace, command, config, pod, container_id)
}

/// [`whereabouts`] with the kubeconfig at `kubeconfig` (e.g. one through a fault proxy). Whereabouts refuses to
/// run without a flat file, so one of the test's own is named rather than the host's.
pub fn whereabouts_via(
    cluster: &crate::TestCluster,
    kubeconfig: &std::path::Path,
    namespace: &str,
    command: &'static str,
    config: &Value,
    pod: &str,
    container_id: &str,
) -> Invocation {
    let mut config = config.clone();
    config["ipam"]["type"] = json!("whereabouts");
    config["ipam"]["kubernetes"]["kubeconfig"] = json!(kubeconfig);
    let flat = cluster.dir().join(format!("whereabouts-{namespace}-{container_id}.conf"));
    std::fs::write(&flat, json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": kubeconfig}}).to_string())
        .expect("write the Whereabouts flat file");
    config["ipam"]["configuration_path"] = json!(flat);
    for key in ["log_level", "timeout_seconds", "allocation_strategy"] {
        config["ipam"].as_object_mut().expect("an ipam object").remove(key);
    }
    let mut inv = Invocation::new(command, &config, namespace, pod, container_id);
    inv.program = Some(crate::testenv::tool("whereabouts"));
    inv
}
