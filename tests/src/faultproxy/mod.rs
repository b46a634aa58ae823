//! [`FaultProxy`]: an HTTPS proxy between a client (usually the `hereabouts` binary) and the test kube-apiserver
//! that injects the faults a real cluster produces, on the requests a test names by verb and resource.
//!
//! - It terminates TLS with the API server's own serving certificate (SAN 127.0.0.1, signed by the cluster CA),
//!   so a kubeconfig that trusts the cluster CA verifies it, and offers only HTTP/1.1.
//! - Requests and responses are buffered whole, except a watch's response, which is streamed through as it comes.
//! - Every request is classified as Kubernetes does ([`RequestInfo`]) and recorded ([`FaultProxy::seen`]) with
//!   the action applied and the API server's status, so a test can assert that its fault fired.
//! - Once the proxy has accepted a request it forwards it (after any [`Action::Delay`] or [`Action::Hold`]) and
//!   reads the answer even if the client goes away meanwhile: a client killed while its request is held still
//!   gets its write applied once the test releases it — "the request reached the server, the client died".
//! - A reset ([`Action::DropResponse`], [`Action::ResetBeforeForward`], or an API server that cannot be reached)
//!   closes the client's TCP connection with a zero linger, i.e. with RST: the client sees "connection reset" and
//!   never any HTTP response.
//! - Dropping the proxy stops accepting, closes every connection and abandons held and in-flight requests.

mod classify;
mod relay;
mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use http::{Method, Uri};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

pub use classify::{RequestInfo, Verb, classify};

use crate::{Identity, TestCluster, kubeconfig};

/// How long [`FaultProxy::wait_held`] waits before it fails the test.
const HOLD_WAIT: Duration = Duration::from_secs(60);

/// What the proxy does to a request a [`Rule`] picks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Forwards the request, reads the API server's whole answer, and resets the client's connection instead of
    /// delivering it: the server applied the write, the client never learns so.
    DropResponse,
    /// Resets the client's connection without forwarding: the server never sees the request.
    ResetBeforeForward,
    /// Forwards the request after this long.
    Delay(Duration),
    /// Forwards nothing until [`FaultProxy::release_held`]; then forwards the request, and delivers the answer if
    /// the client is still connected.
    Hold,
    /// Answers with a Kubernetes `Status` of this code and message, without forwarding.
    Status(u16, String),
}

/// Which requests get an [`Action`]: counting only requests of `verb` on `resource` from the moment the rule is
/// added, the `nth` (1-based) and the `times - 1` after it.
///
/// Every rule counts every request it matches; when several rules' turns fall on one request, the first added
/// acts and the others' turns pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The verb to match.
    pub verb: Verb,
    /// The plural resource to match (`ippools`, `serviceaccounts/token`), or `*` for any.
    pub resource: String,
    /// The first matching request (1-based) that gets the action.
    pub nth: usize,
    /// How many matching requests in a row, from the `nth`, get the action; `usize::MAX` for all of them.
    pub times: usize,
    /// What to do to them.
    pub action: Action,
}

impl Rule {
    /// The `nth` request of `verb` on `resource` (1-based) gets `action`, once.
    pub fn nth(verb: Verb, resource: &str, nth: usize, action: Action) -> Self {
        Self { verb, resource: resource.to_string(), nth, times: 1, action }
    }

    /// Every request of `verb` on `resource` from now on gets `action`.
    pub fn every(verb: Verb, resource: &str, action: Action) -> Self {
        Self { verb, resource: resource.to_string(), nth: 1, times: usize::MAX, action }
    }

    fn matches(&self, info: &RequestInfo) -> bool {
        self.verb == info.verb && (self.resource == "*" || self.resource == info.resource)
    }
}

/// One request the proxy received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The HTTP method.
    pub method: Method,
    /// The path and query.
    pub path: String,
    /// What it asks of the API server.
    pub request: RequestInfo,
    /// The action a rule applied, if any.
    pub action: Option<Action>,
    /// The API server's status, once it answered a forwarded request.
    pub status: Option<u16>,
    /// Why forwarding failed (API server unreachable, connection lost), if it did.
    pub error: Option<String>,
}

impl Seen {
    /// Whether this is a request of `verb` on `resource`.
    pub fn is(&self, verb: Verb, resource: &str) -> bool {
        self.request.verb == verb && self.request.resource == resource
    }
}

struct Armed {
    rule: Rule,
    matched: usize,
}

#[derive(Default)]
struct Book {
    rules: Vec<Armed>,
    seen: Vec<Seen>,
}

#[derive(Clone, Copy, Default)]
struct Held {
    count: usize,
    /// Bumped by each release; a held request waits for it to change.
    generation: u64,
}

/// State shared by the proxy's handle, its connections and its detached forwards.
struct Shared {
    upstream: upstream::Upstream,
    book: Mutex<Book>,
    held: watch::Sender<Held>,
    shutdown: watch::Receiver<bool>,
}

impl Shared {
    /// Records a request and returns its index in [`FaultProxy::seen`] and the action it gets.
    fn admit(&self, method: &Method, uri: &Uri, info: &RequestInfo) -> (usize, Option<Action>) {
        let mut book = self.book.lock().unwrap();
        let mut action = None;
        for armed in book.rules.iter_mut().filter(|a| a.rule.matches(info)) {
            armed.matched += 1;
            let turn = armed.matched >= armed.rule.nth && armed.matched - armed.rule.nth < armed.rule.times;
            if turn && action.is_none() {
                action = Some(armed.rule.action.clone());
            }
        }
        let path = uri.path_and_query().map_or_else(|| uri.path().to_string(), |p| p.to_string());
        book.seen.push(Seen {
            method: method.clone(),
            path,
            request: info.clone(),
            action: action.clone(),
            status: None,
            error: None,
        });
        (book.seen.len() - 1, action)
    }

    fn record(&self, index: usize, update: impl FnOnce(&mut Seen)) {
        update(&mut self.book.lock().unwrap().seen[index]);
    }

    async fn hold(&self) {
        let mut generation = 0;
        self.held.send_modify(|h| {
            h.count += 1;
            generation = h.generation;
        });
        let _ = self.held.subscribe().wait_for(|h| h.generation != generation).await;
    }
}

/// Resolves once the proxy stops: `true` sent, or the sender dropped with the [`FaultProxy`].
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// A fault-injecting HTTPS proxy in front of the test API server, serving on a task of the current runtime.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl FaultProxy {
    /// Starts a proxy to `cluster`'s API server on an OS-chosen port of 127.0.0.1. Panics when it cannot.
    pub async fn start(cluster: &TestCluster) -> FaultProxy {
        Self::try_start(cluster).await.unwrap_or_else(|e| panic!("start the fault proxy: {e:#}"))
    }

    async fn try_start(cluster: &TestCluster) -> anyhow::Result<FaultProxy> {
        let (cert, key) = cluster.serving_cert_paths();
        let acceptor = TlsAcceptor::from(upstream::server_config(&cert, &key)?);
        let (shutdown, stop) = watch::channel(false);
        let upstream = upstream::Upstream::new(cluster.server(), cluster.ca_pem(), stop.clone())?;
        let shared = Arc::new(Shared {
            upstream,
            book: Mutex::new(Book::default()),
            held: watch::Sender::new(Held::default()),
            shutdown: stop,
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        tokio::spawn(accept(listener, acceptor, shared.clone()));
        Ok(FaultProxy { addr, shared, shutdown })
    }

    /// The proxy's URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// A kubeconfig like [`TestCluster::kubeconfig`]'s, for `id` in `namespace`, pointing at this proxy.
    pub fn kubeconfig(&self, cluster: &TestCluster, id: Identity, namespace: &str) -> PathBuf {
        let path = cluster.dir().join(format!("kubeconfig-proxy{}-{}-{namespace}", self.addr.port(), id.slug()));
        let text = kubeconfig::render(&self.server(), cluster.ca_pem(), id.user(), cluster.token(id), namespace);
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// A client for `id` through this proxy, with kube's own retries off like [`TestCluster::client`]'s.
    pub async fn client(&self, cluster: &TestCluster, id: Identity) -> kube::Client {
        crate::cluster::client_for(&self.server(), cluster.ca_pem(), id, cluster.token(id))
            .await
            .expect("build a kube client for the fault proxy")
    }

    /// Adds a rule; its count of matching requests starts now. Panics on a [`Action::Status`] code that is not
    /// an HTTP status, or an `nth` of 0.
    pub fn add_rule(&self, rule: Rule) {
        if let Action::Status(code, _) = &rule.action {
            assert!((100..=999).contains(code), "{code} is not an HTTP status code");
        }
        assert!(rule.nth >= 1, "nth counts from 1");
        self.shared.book.lock().unwrap().rules.push(Armed { rule, matched: 0 });
    }

    /// Every request received so far, in order of arrival.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.book.lock().unwrap().seen.clone()
    }

    /// How many requests are being held now.
    pub fn held(&self) -> usize {
        self.shared.held.borrow().count
    }

    /// Waits until at least `n` requests are being held; panics, listing what the proxy saw, after 60 s.
    pub async fn wait_held(&self, n: usize) {
        let mut held = self.shared.held.subscribe();
        if tokio::time::timeout(HOLD_WAIT, held.wait_for(|h| h.count >= n)).await.is_err() {
            panic!("{n} requests not held after {HOLD_WAIT:?}; the proxy saw {:#?}", self.seen());
        }
    }

    /// Releases every request held now, and returns how many there were. Requests a rule holds later are held
    /// again.
    pub fn release_held(&self) -> usize {
        let mut released = 0;
        self.shared.held.send_modify(|h| {
            released = h.count;
            h.count = 0;
            h.generation += 1;
        });
        released
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

async fn accept(listener: TcpListener, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                // e.g. out of file descriptors: let the moment pass rather than spin
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut shutdown) => return,
        };
        tokio::spawn(relay::serve(shared.clone(), tcp, acceptor.clone()));
    }
}
