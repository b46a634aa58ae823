//! TLS on both sides of the proxy, and the pool of HTTP/1.1 connections to kube-apiserver.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;

/// An idle upstream connection older than this is dropped rather than reused: the API server may close an idle
/// connection just as a request is written to it, which the client would see as a fault nobody injected.
const MAX_IDLE: Duration = Duration::from_secs(20);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    // explicit, so a second provider enabled elsewhere in the build cannot make the default ambiguous
    Arc::new(rustls::crypto::ring::default_provider())
}

/// TLS for the proxy's clients: the API server's own serving certificate, HTTP/1.1 only.
pub(super) fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("read {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parse {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("read {}", key.display()))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the serving certificate and key")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

type Sender = SendRequest<Full<Bytes>>;

/// Connections to the API server, opened on demand and reused one request at a time.
pub(super) struct Upstream {
    addr: SocketAddr,
    name: ServerName<'static>,
    tls: TlsConnector,
    idle: Mutex<Vec<(Instant, Sender)>>,
    shutdown: watch::Receiver<bool>,
}

impl Upstream {
    /// Connections to `server` (`https://127.0.0.1:<port>`), trusting only `ca_pem`.
    pub(super) fn new(server: &str, ca_pem: &str, shutdown: watch::Receiver<bool>) -> anyhow::Result<Self> {
        let uri: http::Uri = server.parse().with_context(|| format!("parse {server}"))?;
        let host = uri.host().context("the API server URL has no host")?;
        let port = uri.port_u16().context("the API server URL has no port")?;
        let addr = SocketAddr::new(host.parse().context("the API server host is not an IP")?, port);
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).context("parse the cluster CA")?)?;
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            addr,
            name: ServerName::IpAddress(addr.ip().into()),
            tls: TlsConnector::from(Arc::new(config)),
            idle: Mutex::new(Vec::new()),
            shutdown,
        })
    }

    /// Sends `req` on an idle connection, or a new one when none is left or the idle one turns out closed before
    /// the request was written. Returns the sender, to [`Upstream::checkin`] once the response body is read.
    pub(super) async fn send(&self, mut req: Request<Full<Bytes>>) -> anyhow::Result<(Response<Incoming>, Sender)> {
        while let Some(mut sender) = self.checkout() {
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok((resp, sender)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(e.into_error()).context("the API server's connection failed"),
                },
            }
        }
        let mut sender = self.connect().await?;
        let resp = sender.send_request(req).await.context("the API server's connection failed")?;
        Ok((resp, sender))
    }

    /// Returns a connection whose last response was read in full.
    pub(super) fn checkin(&self, sender: Sender) {
        if !sender.is_closed() {
            self.idle.lock().unwrap().push((Instant::now(), sender));
        }
    }

    fn checkout(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap();
        idle.retain(|(since, sender)| since.elapsed() < MAX_IDLE && !sender.is_closed());
        idle.pop().map(|(_, sender)| sender)
    }

    async fn connect(&self) -> anyhow::Result<Sender> {
        let tcp = TcpStream::connect(self.addr).await.with_context(|| format!("connect to {}", self.addr))?;
        tcp.set_nodelay(true)?;
        let tls = self.tls.connect(self.name.clone(), tcp).await.context("TLS with the API server")?;
        let (sender, conn) = http1::handshake(TokioIo::new(tls)).await.context("HTTP/1.1 with the API server")?;
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = conn => {}
                () = super::stopped(&mut shutdown) => {}
            }
        });
        Ok(sender)
    }
}
