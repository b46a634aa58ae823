//! The CNI plugin's own token, minted with the TokenRequest API (as Calico does for `calico-cni-plugin`).
//!
//! The token written to the host belongs to ServiceAccount `--cni-service-account`, whose Role allows exactly what
//! the plugin does, and it is bound to this node's Node object, not to this pod: it outlives the pod, so ADD and
//! DEL keep working on the node while the DaemonSet pod is replaced (a projected token dies with its pod within
//! seconds), and the API server stops taking it as soon as the Node is deleted (or replaced by one of the same
//! name: the token records the Node's UID). Binding it also puts the node's name into the identity the API server
//! sees (the `authentication.kubernetes.io/node-name` extra), which is what the chart's admission policy confines
//! the token's writes to. Binding to a Node needs Kubernetes 1.31 or newer (1.29 and 1.30 with the feature gate
//! `ServiceAccountTokenNodeBinding`); an older API server refuses the request with a message that says so. This
//! pod authenticates the request with its own token, which never leaves the pod.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::render::{self, Credentials};

/// A request that gets no answer within this is given up (and retried with backoff).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The soonest a new token is asked for after one was minted, whatever the lifetime and fraction say.
const MIN_REFRESH: Duration = Duration::from_secs(1);

/// Why a token could not be minted.
#[derive(Debug, thiserror::Error)]
pub(super) enum MintError {
    #[error("build an API client for {server}")]
    Config {
        server: String,
        #[source]
        source: Box<kube::config::KubeconfigError>,
    },
    #[error("build an API client for {server}")]
    Route {
        server: String,
        #[source]
        source: hereabouts_ipam::store::RouteError,
    },
    #[error("build an API client for {server}")]
    Client {
        server: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("TokenRequest for serviceaccount {namespace}/{name} bound to Node {node}")]
    Request {
        namespace: String,
        name: String,
        node: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(
        "TokenRequest for serviceaccount {namespace}/{name}: Node {node} does not exist, and the token is bound to it \
         (--node-name must be this node's Node)"
    )]
    NoNode { namespace: String, name: String, node: String },
    #[error("TokenRequest for serviceaccount {namespace}/{name}: the answer holds no token or no expiry")]
    Empty { namespace: String, name: String },
}

/// A token the API server issued.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Minted {
    pub token: String,
    /// `status.expirationTimestamp`, by the API server's clock.
    pub expires: Timestamp,
    /// How long after the request the next one is due.
    pub refresh_after: Duration,
}

impl std::fmt::Debug for Minted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minted")
            .field("token", &format_args!("<{} bytes>", self.token.len()))
            .field("expires", &self.expires)
            .field("refresh_after", &self.refresh_after)
            .finish()
    }
}

/// Mints tokens of one ServiceAccount, bound to one Node.
#[derive(Debug, Clone)]
pub(super) struct Minter {
    pub server: String,
    pub namespace: String,
    pub service_account: String,
    /// The Node each token is bound to: this node's.
    pub node: String,
    pub lifetime: Duration,
    pub refresh_fraction: f64,
}

impl Minter {
    /// A client that authenticates as this pod (`pod`: its token and CA), built fresh for each mint so that a
    /// rotated token or CA is always the one used. kube's retry layer is off: the caller retries with backoff.
    async fn client(&self, pod: &Credentials) -> Result<Client, MintError> {
        let text = render::kubeconfig(&self.server, &self.namespace, pod);
        let text = String::from_utf8(text).expect("the kubeconfig is JSON, hence UTF-8");
        let config_error = |e| MintError::Config { server: self.server.clone(), source: Box::new(e) };
        let kubeconfig = Kubeconfig::from_yaml(&text).map_err(config_error)?;
        let mut config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.map_err(config_error)?;
        config.default_retry = false;
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        config.read_timeout = Some(REQUEST_TIMEOUT);
        config.write_timeout = Some(REQUEST_TIMEOUT);
        let route_error = |e| MintError::Route { server: self.server.clone(), source: e };
        let proxies = hereabouts_ipam::store::Proxies::from_env().map_err(|e| route_error(e.into()))?;
        proxies.route(&mut config).await.map_err(route_error)?;
        Client::try_from(config).map_err(|e| MintError::Client { server: self.server.clone(), source: Box::new(e) })
    }

    /// One TokenRequest for the ServiceAccount, authenticated with `pod`: default audiences (the API server's),
    /// `expirationSeconds` of the lifetime, and the Node as `boundObjectRef` (by name: the API server reads its
    /// UID into the token), so the token is tied to the node rather than to this pod.
    pub async fn mint(&self, pod: &Credentials) -> Result<Minted, MintError> {
        let client = self.client(pod).await?;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(i64::try_from(self.lifetime.as_secs()).unwrap_or(i64::MAX)),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(self.node.clone()),
                    uid: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sent = Timestamp::now();
        let answer = Api::<ServiceAccount>::namespaced(client, &self.namespace)
            .create_token_request(&self.service_account, &PostParams::default(), &request)
            .await
            .map_err(|e| match &e {
                // the ServiceAccount missing is a 404 too: only the Node's names the node
                kube::Error::Api(status)
                    if status.code == 404 && status.details.as_ref().is_some_and(|d| d.kind == "nodes") =>
                {
                    MintError::NoNode {
                        namespace: self.namespace.clone(),
                        name: self.service_account.clone(),
                        node: self.node.clone(),
                    }
                }
                _ => MintError::Request {
                    namespace: self.namespace.clone(),
                    name: self.service_account.clone(),
                    node: self.node.clone(),
                    source: Box::new(e),
                },
            })?;
        let status = answer.status.unwrap_or_default();
        match (status.token.filter(|t| !t.trim().is_empty()), status.expiration_timestamp) {
            (Some(token), Some(expires)) => Ok(Minted {
                token: token.trim().to_string(),
                expires: expires.0,
                refresh_after: refresh_after(sent, expires.0, self.refresh_fraction),
            }),
            _ => Err(MintError::Empty { namespace: self.namespace.clone(), name: self.service_account.clone() }),
        }
    }
}

/// When the next token is due, counted from `sent` (when the request left): `fraction` of the validity granted,
/// which is the expiry the API server answered minus `sent`. The expiry is by the server's clock and `sent` by
/// ours, so a node clock behind by S delays the refresh by `fraction` × S; with a 24h token renewed at half-life
/// that leaves the token valid unless the clocks are 12h apart.
pub(super) fn refresh_after(sent: Timestamp, expires: Timestamp, fraction: f64) -> Duration {
    let granted = sent.duration_until(expires);
    let granted = if granted.is_negative() { Duration::ZERO } else { granted.unsigned_abs() };
    granted.mul_f64(fraction.clamp(0.0, 1.0)).max(MIN_REFRESH)
}
