//! The provider's HTTP contract, exactly as the seed gives it, over verified TLS, one connection per call (calls are
//! rare: at most one per ADD or DEL, none for a warm or cached address).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

use crate::budget::Budget;
use crate::codes::Code;
use crate::config::provider::ProviderConfig;

/// Creates (or attaches) sub-interfaces.
pub const ALLOCATE_PATH: &str = "/v1/apis/network.iaas.io/ipam/allocate-ips";
/// Releases one sub-interface, by one of its addresses.
pub const RELEASE_PATH: &str = "/v1/apis/network.iaas.io/ipam/release-ip";
/// What is left of the call's budget, in milliseconds, a positive integer.
pub const TIMEOUT_HEADER: &str = "X-Request-Timeout-Ms";

/// The body of [`ALLOCATE_PATH`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocateRequest {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_namespace: String,
    #[serde(rename = "podUID", default, skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
    pub node_name: String,
    pub sub_eni_requests: Vec<SubEniRequest>,
}

/// One sub-interface wanted: its IPv4 address, its IPv6 address, or a pair sharing it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubEniRequest {
    pub parent_nic_mac: String,
    /// The IPv4 CIDR when an IPv4 address is asked for (a pair shares it), else the IPv6 CIDR.
    pub subnet: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv4_address: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv6_address: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv4_pool_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv6_pool_name: String,
}

/// The answer of [`ALLOCATE_PATH`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocateResponse {
    #[serde(default)]
    pub pod_name: String,
    #[serde(default)]
    pub pod_namespace: String,
    #[serde(default)]
    pub node_name: String,
    pub sub_eni_responses: Vec<SubEniResponse>,
}

/// One sub-interface as the provider made it. An empty `mac_address` or absent `vlan_id` leaves the original result's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubEniResponse {
    #[serde(default)]
    pub parent_nic_mac: String,
    #[serde(default)]
    pub subnet: String,
    #[serde(default)]
    pub ipv4_address: String,
    #[serde(default)]
    pub ipv6_address: String,
    #[serde(default)]
    pub mac_address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<i64>,
}

/// The body of [`RELEASE_PATH`]: once per sub-interface, by its IPv4 address (its IPv6 one when it has none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseRequest {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_namespace: String,
    #[serde(rename = "podUID", default, skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
    pub node_name: String,
    /// Empty when the caller cannot know it (the reconciler's cluster sweep).
    #[serde(default)]
    pub parent_nic_mac: String,
    pub subnet: String,
    pub ip_address: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pool_name: String,
}

/// Why a provider call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// `http_request_timeout` passed before the provider answered (code 11).
    #[error("provider-interaction timeout: POST {url}{path} exceeded configured timeout {configured}")]
    Timeout { url: String, path: &'static str, configured: String },
    /// The invocation's own deadline came first (code 11).
    #[error("parent budget exhausted: POST {url}{path} cancelled by parent context deadline")]
    ParentBudget { url: String, path: &'static str },
    /// The provider could not be reached: name, connection, or the connection broke (code 11).
    #[error("IaaS provider {url}: {message}")]
    Unreachable { url: String, message: String },
    /// The provider's certificate is not trusted, or TLS failed otherwise (code 105).
    #[error("IaaS provider {url}: TLS: {message}")]
    Tls { url: String, message: String },
    /// A non-2xx answer: 429 and 5xx are worth retrying (code 11), others not (code 105).
    #[error("IaaS provider answered POST {url}{path} with HTTP {status}: {body}")]
    Refused { url: String, path: &'static str, status: u16, body: String },
    /// A 2xx answer that is not the contract's JSON (code 105).
    #[error("IaaS provider's answer to POST {url}{path} is not the contract's JSON: {message}")]
    BadAnswer { url: String, path: &'static str, message: String },
    /// The CA or client certificate files of the config cannot be read (code 5).
    #[error("ipam.iaas_provider: {0}")]
    Files(String),
}

impl ProviderError {
    /// The CNI error code.
    pub fn code(&self) -> Code {
        match self {
            ProviderError::Timeout { .. } | ProviderError::ParentBudget { .. } | ProviderError::Unreachable { .. } => {
                Code::TryAgainLater
            }
            ProviderError::Refused { status, .. } if *status == 429 || *status >= 500 => Code::TryAgainLater,
            ProviderError::Refused { .. } | ProviderError::Tls { .. } | ProviderError::BadAnswer { .. } => {
                Code::ProviderRefused
            }
            ProviderError::Files(_) => Code::Io,
        }
    }
}

/// A client of one provider.
#[derive(Clone)]
pub struct ProviderClient {
    url: String,
    host: String,
    port: u16,
    tls: TlsConnector,
    timeout: crate::config::duration::GoDuration,
}

impl std::fmt::Debug for ProviderClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderClient").field("url", &self.url).field("timeout", &self.timeout.text).finish()
    }
}

impl ProviderClient {
    /// A client for `config`, trusting its CA only and presenting its client certificate, if any.
    pub fn new(config: &ProviderConfig) -> Result<Self, ProviderError> {
        let files = |what: &str, path: &std::path::Path, e: &dyn std::fmt::Display| {
            ProviderError::Files(format!("{what} {}: {e}", path.display()))
        };
        let mut roots = RootCertStore::empty();
        let cas =
            CertificateDer::pem_file_iter(&config.ca_file).map_err(|e| files("read ca_file", &config.ca_file, &e))?;
        for ca in cas {
            let ca = ca.map_err(|e| files("parse ca_file", &config.ca_file, &e))?;
            roots.add(ca).map_err(|e| files("use ca_file", &config.ca_file, &e))?;
        }
        if roots.is_empty() {
            return Err(files("use ca_file", &config.ca_file, &"no certificate in it"));
        }
        let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| ProviderError::Files(e.to_string()))?
            .with_root_certificates(roots);
        let mut tls = match &config.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .map_err(|e| files("read client_cert_file", cert, &e))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| files("parse client_cert_file", cert, &e))?;
                let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| files("read client_key_file", key, &e))?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| files("use client_key_file", key, &e))?
            }
        };
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let host = config.url.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
        Ok(Self {
            url: format!("https://{}", config.url.authority().map(|a| a.as_str()).unwrap_or_default()),
            port: config.url.port_u16().unwrap_or(443),
            host,
            tls: TlsConnector::from(Arc::new(tls)),
            timeout: config.http_request_timeout.clone(),
        })
    }

    /// Asks the provider to create or attach the sub-interfaces of `request`, within `budget` and
    /// `http_request_timeout`.
    pub async fn allocate(
        &self,
        request: &AllocateRequest,
        budget: &Budget,
    ) -> Result<AllocateResponse, ProviderError> {
        let body = self.post(ALLOCATE_PATH, serde_json::to_vec(request).expect("serialisable"), budget).await?;
        serde_json::from_slice(&body).map_err(|e| ProviderError::BadAnswer {
            url: self.url.clone(),
            path: ALLOCATE_PATH,
            message: e.to_string(),
        })
    }

    /// Asks the provider to release one sub-interface; any 2xx is success (the provider makes it idempotent).
    pub async fn release(&self, request: &ReleaseRequest, budget: &Budget) -> Result<(), ProviderError> {
        self.post(RELEASE_PATH, serde_json::to_vec(request).expect("serialisable"), budget).await.map(|_| ())
    }

    async fn post(&self, path: &'static str, body: Vec<u8>, budget: &Budget) -> Result<Bytes, ProviderError> {
        let own = Instant::now() + self.timeout.value;
        let parent_first = budget.deadline() <= own;
        let deadline = if parent_first { budget.deadline() } else { own };
        match tokio::time::timeout_at(deadline, self.exchange(path, body, deadline)).await {
            Ok(answer) => answer,
            Err(_) if parent_first => Err(ProviderError::ParentBudget { url: self.url.clone(), path }),
            Err(_) => {
                Err(ProviderError::Timeout { url: self.url.clone(), path, configured: self.timeout.text.clone() })
            }
        }
    }

    async fn exchange(&self, path: &'static str, body: Vec<u8>, deadline: Instant) -> Result<Bytes, ProviderError> {
        let unreachable = |message: String| ProviderError::Unreachable { url: self.url.clone(), message };
        let ip = match self.host.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => crate::store::resolve::resolve_host(&self.host)
                .await
                .map_err(|e| unreachable(format!("resolve {}: {e}", self.host)))?,
        };
        let tcp = TcpStream::connect(SocketAddr::new(ip, self.port))
            .await
            .map_err(|e| unreachable(format!("connect to {ip}:{}: {e}", self.port)))?;
        tcp.set_nodelay(true).map_err(|e| unreachable(e.to_string()))?;
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| ProviderError::Tls { url: self.url.clone(), message: e.to_string() })?;
        let tls = self.tls.connect(name, tcp).await.map_err(|e| match e.get_ref() {
            Some(inner) if inner.is::<rustls::Error>() => {
                ProviderError::Tls { url: self.url.clone(), message: format!("{inner} (ca_file is the only trust)") }
            }
            _ => unreachable(format!("TLS handshake: {e}")),
        })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| unreachable(format!("HTTP/1.1: {e}")))?;
        let connection = tokio::spawn(conn);
        // computed just before sending, from the call's own deadline
        let left = deadline.saturating_duration_since(Instant::now()).as_millis().max(1);
        let request = http::Request::post(path)
            .header(http::header::HOST, self.url.trim_start_matches("https://"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(TIMEOUT_HEADER, left.to_string())
            .body(Full::new(Bytes::from(body)))
            .expect("a valid request");
        let answer = sender.send_request(request).await.map_err(|e| unreachable(format!("POST {path}: {e}")))?;
        let status = answer.status();
        let bytes = answer
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(format!("read the answer to POST {path}: {e}")))?
            .to_bytes();
        connection.abort();
        if !status.is_success() {
            let body = String::from_utf8_lossy(&bytes).chars().take(512).collect();
            return Err(ProviderError::Refused { url: self.url.clone(), path, status: status.as_u16(), body });
        }
        Ok(bytes)
    }
}
