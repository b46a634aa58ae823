//! The runtime path of the end-to-end tests: `cnitool add|del <network> /var/run/netns/<pod>` run inside a node
//! namespace (`ip netns exec <node> ...`), as a container runtime on that node would run the CNI chain.
//!
//! A [`CniRuntime`] owns a temporary directory with the network configs (`NETCONFPATH`), a plugin directory
//! (`CNI_PATH`: symlinks to the reference plugins, Multus when built, and `target/<profile>/hereabouts`), the
//! plugins' log files, and libcni's result cache: cnitool has no setting for the cache (libcni's default is
//! `/var/lib/cni`), so each invocation bind-mounts the temporary cache over `/var/lib/cni` in the private mount
//! namespace `ip netns exec` makes, and nothing is left in the machine's `/var/lib/cni`.
//!
//! cnitool derives the container id from the netns path (`cnitool-` + hex of the first 10 bytes of its
//! SHA-512), so ADD and DEL of one pod namespace match and every pod needs its own namespace.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::netns::{Netns, Node, ip_bin};
use crate::{plugin, testenv};

/// The reference plugins linked into `CNI_PATH`.
pub const PLUGINS: [&str; 6] = ["bridge", "macvlan", "ipvlan", "dummy", "loopback", "host-local"];

/// Which pod a CNI invocation is for (`CNI_ARGS`).
#[derive(Debug, Clone)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One runtime's configuration directories; removed when dropped.
#[derive(Debug)]
pub struct CniRuntime {
    dir: tempfile::TempDir,
}

impl CniRuntime {
    /// A fresh runtime directory with `CNI_PATH` filled in.
    pub fn new() -> anyhow::Result<Self> {
        // below /tmp: a NAD may log only below /var/log or /tmp, and the networks log into this directory
        let dir = tempfile::Builder::new().prefix("hereabouts-e2e-").tempdir_in("/tmp").context("a temp dir")?;
        let me = Self { dir };
        for sub in ["net.d", "bin", "cache", "log"] {
            std::fs::create_dir_all(me.dir.path().join(sub))?;
        }
        for p in PLUGINS {
            std::os::unix::fs::symlink(testenv::tool(p), me.bin_dir().join(p))?;
        }
        std::os::unix::fs::symlink(plugin::workspace_bin("hereabouts"), me.bin_dir().join("hereabouts"))?;
        let multus = testenv::bin_dir().join("multus");
        if multus.is_file() {
            std::os::unix::fs::symlink(multus, me.bin_dir().join("multus"))?;
        }
        Ok(me)
    }

    /// The temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `CNI_PATH`.
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    /// `NETCONFPATH`.
    pub fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("net.d")
    }

    /// Where the plugins' log files go.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    /// The log file of network `name` (hereabouts' `log_file`).
    pub fn log_file(&self, name: &str) -> PathBuf {
        self.log_dir().join(format!("{name}.log"))
    }

    /// Writes `<name>.conflist` holding `plugins` (cniVersion 1.0.0).
    pub fn write_conflist(&self, name: &str, plugins: Vec<Value>) -> anyhow::Result<()> {
        let list = json!({"cniVersion": "1.0.0", "name": name, "plugins": plugins});
        std::fs::write(self.conf_dir().join(format!("{name}.conflist")), serde_json::to_vec_pretty(&list)?)?;
        Ok(())
    }

    /// Writes a network `name`: macvlan (bridge mode) on the node's master with `ipam` (hereabouts unless
    /// `ipam` says otherwise; its log goes to [`Self::log_file`]).
    pub fn write_macvlan(&self, name: &str, kubeconfig: &Path, master: &str, ipam: Value) -> anyhow::Result<()> {
        let mut full = json!({
            "type": "hereabouts",
            "kubernetes": {"kubeconfig": kubeconfig},
            "log_level": "debug",
            "log_file": self.log_file(name),
        });
        if let (Some(full), Some(extra)) = (full.as_object_mut(), ipam.as_object()) {
            full.extend(extra.clone());
        }
        self.write_conflist(name, vec![json!({"type": "macvlan", "master": master, "mode": "bridge", "ipam": full})])
    }

    /// `cnitool add <network> <pod netns>` inside `node`'s namespace, interface `net1`; the CNI result.
    pub fn add(&self, node: &Node, network: &str, pod: &Netns, who: &PodRef) -> anyhow::Result<Value> {
        self.add_as(node, network, pod, who, "net1")
    }

    /// Like [`Self::add`] with `CNI_IFNAME` = `ifname` (Multus gives its first delegate that name).
    pub fn add_as(&self, node: &Node, network: &str, pod: &Netns, who: &PodRef, ifname: &str) -> anyhow::Result<Value> {
        let out = self.cnitool("add", node, network, pod, who, ifname)?;
        serde_json::from_str(out.trim()).with_context(|| format!("cnitool add printed no JSON result: {out:?}"))
    }

    /// `cnitool del <network> <pod netns>` inside `node`'s namespace, interface `net1`.
    pub fn del(&self, node: &Node, network: &str, pod: &Netns, who: &PodRef) -> anyhow::Result<()> {
        self.cnitool("del", node, network, pod, who, "net1").map(drop)
    }

    /// Like [`Self::del`] with `CNI_IFNAME` = `ifname`.
    pub fn del_as(&self, node: &Node, network: &str, pod: &Netns, who: &PodRef, ifname: &str) -> anyhow::Result<()> {
        self.cnitool("del", node, network, pod, who, ifname).map(drop)
    }

    fn cnitool(
        &self,
        verb: &str,
        node: &Node,
        network: &str,
        pod: &Netns,
        who: &PodRef,
        ifname: &str,
    ) -> anyhow::Result<String> {
        // what containerd and CRI-O pass
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_UID={}",
            who.namespace, who.name, who.uid
        );
        std::fs::create_dir_all("/var/lib/cni").context("create the mount point /var/lib/cni")?;
        // `ip netns exec` runs the command in a mount namespace of its own whose mounts do not propagate back,
        // so the bind mount of the cache is private to this invocation.
        let script = r#"cache=$1; shift; mount --bind "$cache" /var/lib/cni && exec "$@""#;
        let out = Command::new(ip_bin())
            .args(["netns", "exec", &node.netns.name, "sh", "-c", script, "sh"])
            .arg(self.dir.path().join("cache"))
            .arg(testenv::tool("cnitool"))
            .args([verb, network, &pod.path()])
            .env("NETCONFPATH", self.conf_dir())
            .env("CNI_PATH", self.bin_dir())
            .env("CNI_IFNAME", ifname)
            .env("CNI_ARGS", args)
            .env("NODENAME", &node.name)
            .output()
            .context("run cnitool")?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "cnitool {verb} {network} {} on {}: {}{}",
                pod.path(),
                node.name,
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(stdout)
    }
}

/// The addresses (without prefix length) of a CNI result.
pub fn result_ips(result: &Value) -> Vec<std::net::IpAddr> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
        .collect()
}

/// Creates Pod `name` in `namespace` bound to `node` (as admin: a bare API server has no scheduler), with
/// `annotations`; returns it with its UID.
pub async fn create_pod(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
    annotations: &[(&str, String)],
) -> anyhow::Result<k8s_openapi::api::core::v1::Pod> {
    use k8s_openapi::api::core::v1::Pod;
    let pod = annotations
        .iter()
        .fold(crate::objects::mk_pod(namespace, name).node(node), |pod, (k, v)| pod.annotation(k, v.clone()))
        .build();
    kube::Api::<Pod>::namespaced(admin.clone(), namespace)
        .create(&Default::default(), &pod)
        .await
        .with_context(|| format!("create pod {namespace}/{name}"))
}

/// Deletes Pod `name` at once (grace period 0: no kubelet would confirm a graceful delete), without CNI DEL.
pub async fn force_delete_pod(admin: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let params = kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), namespace)
        .delete(name, &params)
        .await
        .map(drop)
        .with_context(|| format!("delete pod {namespace}/{name}"))
}

/// The NetworkAttachmentDefinition CRD built by `hack/testenv.sh`, when it is there.
pub fn nad_crd_path() -> Option<PathBuf> {
    let path = testenv::bin_dir().join("networks-crd.yaml");
    path.is_file().then_some(path)
}

/// Installs the NetworkAttachmentDefinition CRD (`k8s.cni.cncf.io/v1`) from `path` unless it is there, and waits
/// until it is established.
pub async fn install_nad_crd(admin: &kube::Client, path: &Path) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let crd: CustomResourceDefinition =
        serde_yaml_ng::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    let name = crd.metadata.name.clone().context("the CRD has a name")?;
    let api = kube::Api::<CustomResourceDefinition>::all(admin.clone());
    if api.get_opt(&name).await?.is_none() {
        api.create(&Default::default(), &crd).await.with_context(|| format!("create CRD {name}"))?;
    }
    crate::wait::crd_established(&api, &name).await
}

/// Creates NetworkAttachmentDefinition `name` in `namespace` whose `spec.config` is `config`.
pub async fn create_nad(admin: &kube::Client, namespace: &str, name: &str, config: &Value) -> anyhow::Result<()> {
    use kube::core::DynamicObject;
    let nad = crate::objects::mk_nad(namespace, name, config);
    kube::Api::<DynamicObject>::namespaced_with(admin.clone(), namespace, &hereabouts_ipam::crd::nad_resource())
        .create(&Default::default(), &nad)
        .await
        .map(drop)
        .with_context(|| format!("create NetworkAttachmentDefinition {namespace}/{name}"))
}
