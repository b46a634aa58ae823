//! [`NodeHost`]: a node's host as `install-cni` leaves it, with no kubelet: the Node object, a DaemonSet pod
//! object on it (ServiceAccount `hereabouts`), that pod's token as the kubelet projects it (bound to the pod, so
//! the API server also takes it as the pod's node's), and `install-cni --once` run with that token into a temp dir
//! standing for the host's CNI directories. What it writes there is what a real host gets: a kubeconfig whose
//! `hereabouts-cni` token is bound to the Node, the flat file naming it, and `nodename`.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::objects::{mk_node, mk_pod};
use crate::plugin::{netconf, workspace_bin};
use crate::{Identity, TestCluster, deploy};

/// One node's host, its CNI files in a temp dir.
#[derive(Debug)]
pub struct NodeHost {
    /// The Node's name: what the CNI token is bound to and what the plugin records.
    pub node: String,
    /// The namespace of the DaemonSet pod, its ServiceAccounts, and the pools (the kubeconfig's).
    pub namespace: String,
    /// The DaemonSet pod's projected token (bound to the pod on `node`), which install-cni mints with.
    pub pod_token: String,
    dir: tempfile::TempDir,
    server: String,
    ca: String,
}

impl NodeHost {
    /// Creates Node `node` (unless it exists) and the DaemonSet pod `hereabouts-<node>` of `namespace` on it, and
    /// runs install-cni once as that pod, for that node; panics with its log when it fails. `namespace` must hold
    /// the chart's ServiceAccounts and Role `hereabouts-node` (the right to mint the CNI's tokens).
    pub async fn install(cluster: &TestCluster, namespace: &str, node: &str) -> Self {
        let admin = cluster.admin().await;
        let nodes = Api::<Node>::all(admin.clone());
        if nodes.get_opt(node).await.unwrap_or_else(|e| panic!("get node {node}: {e}")).is_none() {
            mk_node(node).create(&admin).await;
        }
        let pod = mk_pod(namespace, &format!("hereabouts-{node}"))
            .service_account(deploy::NODE_ACCOUNT)
            .node(node)
            .create(&admin)
            .await;
        let pod_token = deploy::token_for(&admin, namespace, deploy::NODE_ACCOUNT, Some(&pod)).await;
        let host = Self {
            node: node.to_string(),
            namespace: namespace.to_string(),
            pod_token,
            dir: tempfile::tempdir().expect("a temp dir"),
            server: cluster.server().to_string(),
            ca: cluster.ca_pem().to_string(),
        };
        let out = host.install_cni(node);
        assert!(
            out.status.success(),
            "install-cni on {node}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        host
    }

    /// Runs `install-cni --once` as this host's DaemonSet pod with `NODE_NAME` set to `node` (the downward API's
    /// value; another than the pod's own node to see it refused), writing into this host's directories.
    pub fn install_cni(&self, node: &str) -> Output {
        let sa = self.path("sa");
        std::fs::create_dir_all(&sa).expect("create the service-account dir");
        std::fs::write(sa.join("token"), &self.pod_token).expect("write the pod's token");
        std::fs::write(sa.join("ca.crt"), &self.ca).expect("write the CA");
        Command::new(workspace_bin("hereabouts-reconciler"))
            .env_clear()
            .env("NODE_NAME", node)
            .args(["install-cni", "--once", "--server", &self.server, "--namespace", &self.namespace])
            .arg("--source-binary")
            .arg(workspace_bin("hereabouts"))
            .arg("--cni-bin-dir")
            .arg(self.path("bin"))
            .arg("--cni-conf-dir")
            .arg(self.path("net.d"))
            // the plugin runs here as on the host: the flat file names the kubeconfig by this path
            .arg("--host-cni-conf-dir")
            .arg(self.path("net.d"))
            .arg("--token-file")
            .arg(sa.join("token"))
            .arg("--ca-file")
            .arg(sa.join("ca.crt"))
            .stdin(Stdio::null())
            .output()
            .expect("run hereabouts-reconciler install-cni")
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The kubeconfig install-cni wrote.
    pub fn kubeconfig(&self) -> PathBuf {
        self.path("net.d/hereabouts.d/hereabouts.kubeconfig")
    }

    /// The flat file install-cni wrote; `nodename` is beside it.
    pub fn flat_file(&self) -> PathBuf {
        self.path("net.d/hereabouts.d/hereabouts.conf")
    }

    /// The CNI token the kubeconfig holds.
    pub fn token(&self) -> String {
        let text = std::fs::read_to_string(self.kubeconfig()).expect("read the kubeconfig install-cni wrote");
        let doc: Value = serde_json::from_str(&text).expect("install-cni writes the kubeconfig as JSON");
        doc["users"][0]["user"]["token"].as_str().expect("a token in the kubeconfig").to_string()
    }

    /// A network config named `name` whose ipam section is `ipam` plus the host's flat file and kubeconfig: the
    /// plugin finds the node's name in `nodename` beside the flat file, as on a host (no `NODENAME`).
    pub fn netconf(&self, name: &str, ipam: Value) -> Value {
        let mut config = netconf("1.0.0", name, &self.kubeconfig(), ipam);
        config["ipam"]["configuration_path"] = json!(self.flat_file());
        config
    }

    /// A client that authenticates with the host's CNI token, kube's retries off.
    pub async fn client(&self) -> Client {
        crate::cluster::client_for(&self.server, &self.ca, Identity::Cni, &self.token())
            .await
            .expect("a client with the host's token")
    }

    /// A client that authenticates with the DaemonSet pod's token (what install-cni mints with).
    pub async fn pod_client(&self) -> Client {
        crate::cluster::client_for(&self.server, &self.ca, Identity::Node, &self.pod_token)
            .await
            .expect("a client with the pod's token")
    }
}

/// A TokenRequest for the CNI's ServiceAccount in `namespace` as `client`, bound to `bound` (`(kind, name)`), or to
/// nothing: the token, or the API server's refusal.
pub async fn mint_cni_token(
    client: &Client,
    namespace: &str,
    bound: Option<(&str, &str)>,
) -> Result<String, kube::Error> {
    use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let bound_object_ref = bound.map(|(kind, name)| BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some(kind.into()),
        name: Some(name.into()),
        uid: None,
    });
    let spec = TokenRequestSpec { expiration_seconds: Some(3600), bound_object_ref, ..Default::default() };
    let request = TokenRequest { spec: Some(spec), ..Default::default() };
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(deploy::CNI_NAME, &PostParams::default(), &request)
        .await?;
    Ok(answer.status.and_then(|s| s.token).unwrap_or_default())
}
