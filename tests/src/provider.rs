//! A reference IaaS provider (docs/provider.md): the contract's two endpoints over HTTPS
//! on 127.0.0.1 with a CA of its own, a token-bucket rate limit with a bounded queue wait, a simulated cloud delay,
//! and the budget check the seed asks of a provider — a request whose `X-Request-Timeout-Ms` is below the
//! provider's own worst case (queue wait + cloud delay) is refused *before* a token is taken. Release is
//! idempotent. Faults are injected per call: a hang, an HTTP status, extra delay. Its side of the pool: warm
//! pre-creation for node-warm pools, and the `vlan: -1` mark before it unbinds idle sub-interfaces above a
//! watermark.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hereabouts_ipam::crd::{IpPool, SubInterfaceRecord};
use hereabouts_ipam::provider::placement::UNBINDING_VLAN;
use hereabouts_ipam::provider::{
    ALLOCATE_PATH, AllocateRequest, AllocateResponse, RELEASE_PATH, ReleaseRequest, SubEniResponse, TIMEOUT_HEADER,
};
use hereabouts_ipam::range::IpRange;
use hereabouts_ipam::store::NewPool;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// How the provider behaves.
#[derive(Debug, Clone)]
pub struct ProviderOptions {
    /// Tokens in the bucket when full.
    pub burst: u32,
    /// Tokens added per second.
    pub refill_per_second: f64,
    /// The longest a request waits for a token before it is refused with 429.
    pub max_queue_wait: Duration,
    /// How long the simulated cloud takes per call.
    pub cloud_delay: Duration,
}

impl Default for ProviderOptions {
    fn default() -> Self {
        Self {
            burst: 100,
            refill_per_second: 100.0,
            max_queue_wait: Duration::from_millis(300),
            cloud_delay: Duration::from_millis(20),
        }
    }
}

impl ProviderOptions {
    /// The most a call can take here: the queue wait and the cloud call. A smaller budget is refused.
    pub fn worst_case(&self) -> Duration {
        self.max_queue_wait + self.cloud_delay
    }
}

/// A fault for the next call.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Never answer (until the caller gives up).
    Hang,
    /// Answer with this status (after the budget check and the token) and do nothing.
    Status(u16),
    /// Take this long more before doing the work.
    Slow(Duration),
    /// Do the work but answer with an empty `macAddress` and no `vlanId` (the contract allows it).
    Blank,
}

/// A sub-interface as the provider holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubEni {
    pub node: String,
    pub parent_nic_mac: String,
    pub subnet: String,
    pub ipv4: String,
    pub ipv6: String,
    pub mac: String,
    pub vlan: i64,
    pub pool: String,
}

/// One request as the provider received it.
#[derive(Debug, Clone)]
pub struct Call {
    pub path: String,
    /// `X-Request-Timeout-Ms` as sent (`None` when missing or not a positive integer).
    pub budget_ms: Option<u64>,
    pub body: serde_json::Value,
    /// The status answered.
    pub status: u16,
    /// Whether a rate-limit token was taken for it.
    pub took_token: bool,
}

#[derive(Debug, Default)]
struct State {
    sub_enis: BTreeMap<String, SubEni>,
    calls: Vec<Call>,
    /// Requests by path as they arrive, before any answer ([`ReferenceProvider::arrived`]).
    arrived: BTreeMap<String, usize>,
    faults: VecDeque<Fault>,
    tokens: f64,
    refilled: Option<Instant>,
    next_vlan: i64,
}

/// A running provider; stops when dropped.
#[derive(Debug)]
pub struct ReferenceProvider {
    addr: SocketAddr,
    dir: tempfile::TempDir,
    state: Arc<Mutex<State>>,
    shutdown: watch::Sender<bool>,
}

impl ReferenceProvider {
    /// Starts one on an OS-chosen port of 127.0.0.1, on the current runtime.
    pub async fn start(options: ProviderOptions) -> ReferenceProvider {
        Self::try_start(options).await.unwrap_or_else(|e| panic!("start the reference provider: {e:#}"))
    }

    async fn try_start(options: ProviderOptions) -> anyhow::Result<ReferenceProvider> {
        let pki = crate::pki::generate()?;
        let dir = tempfile::Builder::new().prefix("hereabouts-provider-").tempdir()?;
        std::fs::write(dir.path().join("ca.pem"), &pki.ca_pem)?;
        let chain = CertificateDer::pem_slice_iter(pki.serving_cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(pki.serving_key_pem.as_bytes())?;
        let mut tls = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .context("the provider's certificate")?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state =
            Arc::new(Mutex::new(State { tokens: f64::from(options.burst), next_vlan: 100, ..State::default() }));
        let (shutdown, stop) = watch::channel(false);
        tokio::spawn(serve(listener, acceptor, state.clone(), Arc::new(options), stop));
        Ok(ReferenceProvider { addr, dir, state, shutdown })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The PEM file of the CA its certificate chains to.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A directory that lives as long as the provider, for a test's own files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Queues a fault for the next call that has none yet.
    pub fn inject(&self, fault: Fault) {
        self.state.lock().unwrap().faults.push_back(fault);
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    /// How many requests for `path` arrived so far, answered or not: a call still in the provider's hands (a
    /// [`Fault::Slow`] one) counts here before it is in [`ReferenceProvider::calls`].
    pub fn arrived(&self, path: &str) -> usize {
        self.state.lock().unwrap().arrived.get(path).copied().unwrap_or(0)
    }

    /// How many `allocate-ips` requests it received.
    pub fn allocate_calls(&self) -> usize {
        self.state.lock().unwrap().calls.iter().filter(|c| c.path == ALLOCATE_PATH).count()
    }

    /// The sub-interfaces it holds, by IPv4 address (IPv6 when there is none).
    pub fn sub_enis(&self) -> BTreeMap<String, SubEni> {
        self.state.lock().unwrap().sub_enis.clone()
    }

    /// Tokens left in the bucket (after refilling up to now).
    pub fn tokens(&self, options: &ProviderOptions) -> f64 {
        let mut state = self.state.lock().unwrap();
        refill(&mut state, options);
        state.tokens
    }
}

/// The provider's own side of the pool (the seed's metadata write-back): pre-creating a node-warm pool's
/// sub-interfaces, and taking idle ones away above a watermark — marked `vlan: -1` first, unbound only if no pod
/// took the address before the mark landed.
impl ReferenceProvider {
    /// Pre-creates `count` sub-interfaces on `node` for free addresses of the node-warm pool `pool` of `range`
    /// (created bound to `node` when missing, as hereabouts would) and records them in the pool. Returns their
    /// offsets.
    pub async fn prewarm(
        &self,
        pools: &Api<IpPool>,
        pool: &str,
        range: &IpRange,
        node: &str,
        count: usize,
    ) -> anyhow::Result<Vec<u128>> {
        let current = match pools.get_opt(pool).await? {
            Some(p) => p,
            None => {
                let range_string = hereabouts_ipam::names::range_string(range.cidr());
                let object =
                    NewPool { node_name: Some(node), ..NewPool::new(pool, &range_string, range.usable_count()) }
                        .object();
                pools.create(&PostParams::default(), &object).await?
            }
        };
        anyhow::ensure!(current.spec.node_name.as_deref() == Some(node), "pool {pool} is not bound to {node}");
        let taken = |o: &u128| {
            let key = o.to_string();
            current.spec.allocations.contains_key(&key) || current.spec.sub_interfaces.contains_key(&key)
        };
        let offsets: Vec<u128> = range.usable_intervals().flatten().filter(|o| !taken(o)).take(count).collect();
        for offset in &offsets {
            let ip = range.addr_at(*offset);
            let (mac, vlan) = {
                let mut s = self.state.lock().unwrap();
                let vlan = s.next_vlan;
                s.next_vlan += 1;
                let eni = SubEni {
                    node: node.into(),
                    parent_nic_mac: String::new(),
                    subnet: range.cidr().trunc().to_string(),
                    ipv4: if ip.is_ipv4() { ip.to_string() } else { String::new() },
                    ipv6: if ip.is_ipv6() { ip.to_string() } else { String::new() },
                    mac: mac_of(vlan),
                    vlan,
                    pool: pool.into(),
                };
                let mac = eni.mac.clone();
                s.sub_enis.insert(ip.to_string(), eni);
                (mac, vlan)
            };
            let record = SubInterfaceRecord { node: node.into(), mac, vlan, ..SubInterfaceRecord::default() };
            let patch = serde_json::json!({"spec": {"subInterfaces": {offset.to_string(): record}}});
            pools.patch(pool, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        Ok(offsets)
    }

    /// Watermark reclaim, step one: while more than `watermark` of the pool's `usable` addresses have a
    /// sub-interface, marks idle ones (a record, no allocation) `vlan: -1`, lowest first and at most `most` of
    /// them, each by a patch guarded on the record as read. Returns the offsets marked.
    pub async fn mark_idle_above_watermark(
        &self,
        pools: &Api<IpPool>,
        pool: &str,
        usable: u128,
        watermark: f64,
        most: usize,
    ) -> anyhow::Result<Vec<u128>> {
        let current = pools.get(pool).await?;
        let records = &current.spec.sub_interfaces;
        let keep = (watermark * usable as f64).floor() as usize;
        let live = records.values().filter(|r| r.vlan != UNBINDING_VLAN).count();
        let idle = records
            .iter()
            .filter(|(k, r)| r.vlan != UNBINDING_VLAN && !current.spec.allocations.contains_key(*k))
            .filter_map(|(k, r)| Some((k.parse::<u128>().ok()?, r)));
        let mut marked = Vec::new();
        for (offset, record) in idle.take(live.saturating_sub(keep).min(most)) {
            let path = format!("/spec/subInterfaces/{offset}");
            let ops = serde_json::json!([
                {"op": "test", "path": format!("{path}/node"), "value": record.node},
                {"op": "test", "path": format!("{path}/vlan"), "value": record.vlan},
                {"op": "replace", "path": format!("{path}/vlan"), "value": UNBINDING_VLAN},
            ]);
            match pools.patch(pool, &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(ops)?)).await {
                Ok(_) => marked.push(offset),
                // changed since read (a pod moved it): not idle any more, leave it
                Err(kube::Error::Api(status)) if status.code == 422 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(marked)
    }

    /// Watermark reclaim, step two, for every record marked `vlan: -1`: if a pod's entry is on the address (it
    /// claimed it before the mark landed), the VLAN is given back and the sub-interface stays; otherwise its record
    /// is dropped and it is unbound in the cloud. No claim can land after the mark: hereabouts guards its claim on
    /// the record's VLAN as it read it. A record that changed since this read (a pod's ADD had the provider move
    /// it) is left alone. Returns `(unbound, kept)` offsets.
    pub async fn unbind_marked(&self, pools: &Api<IpPool>, pool: &str) -> anyhow::Result<(Vec<u128>, Vec<u128>)> {
        let current = pools.get(pool).await?;
        let range = IpRange::parse(&current.spec.range, None, None, &[])?;
        let (mut unbound, mut kept) = (Vec::new(), Vec::new());
        for (key, record) in current.spec.sub_interfaces.iter().filter(|(_, r)| r.vlan == UNBINDING_VLAN) {
            let offset: u128 = key.parse()?;
            let ip = range.addr_at(offset).to_string();
            let path = format!("/spec/subInterfaces/{key}");
            let held = current.spec.allocations.contains_key(key);
            let ops = if held {
                let vlan = self.state.lock().unwrap().sub_enis.get(&ip).map_or(0, |e| e.vlan);
                serde_json::json!([
                    {"op": "test", "path": format!("{path}/vlan"), "value": UNBINDING_VLAN},
                    {"op": "replace", "path": format!("{path}/vlan"), "value": vlan},
                ])
            } else {
                serde_json::json!([
                    {"op": "test", "path": format!("{path}/vlan"), "value": UNBINDING_VLAN},
                    {"op": "test", "path": format!("{path}/node"), "value": record.node},
                    {"op": "remove", "path": path},
                ])
            };
            match pools.patch(pool, &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(ops)?)).await {
                Ok(_) if held => kept.push(offset),
                Ok(_) => {
                    self.state.lock().unwrap().sub_enis.remove(&ip);
                    unbound.push(offset);
                }
                Err(kube::Error::Api(status)) if status.code == 422 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok((unbound, kept))
    }
}

fn mac_of(vlan: i64) -> String {
    format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", vlan >> 24 & 0xff, vlan >> 16 & 0xff, vlan >> 8 & 0xff, vlan & 0xff)
}

impl Drop for ReferenceProvider {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

fn refill(state: &mut State, options: &ProviderOptions) {
    let now = Instant::now();
    if let Some(then) = state.refilled {
        let added = now.duration_since(then).as_secs_f64() * options.refill_per_second;
        state.tokens = (state.tokens + added).min(f64::from(options.burst));
    }
    state.refilled = Some(now);
}

async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    state: Arc<Mutex<State>>,
    options: Arc<ProviderOptions>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => continue },
            _ = stop.wait_for(|s| *s) => return,
        };
        let (acceptor, state, options, mut stop) = (acceptor.clone(), state.clone(), options.clone(), stop.clone());
        tokio::spawn(async move {
            // a client that does not trust the certificate ends the handshake: nothing to serve
            let Ok(tls) = acceptor.accept(tcp).await else { return };
            let service = hyper::service::service_fn(move |req| handle(req, state.clone(), options.clone()));
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
}

fn answer(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .expect("a valid response")
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
    options: Arc<ProviderOptions>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    *state.lock().unwrap().arrived.entry(path.clone()).or_default() += 1;
    let budget_ms = req
        .headers()
        .get(TIMEOUT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0);
    let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    let record = |status: StatusCode, took_token: bool| {
        let call = Call { path: path.clone(), budget_ms, body: body.clone(), status: status.as_u16(), took_token };
        state.lock().unwrap().calls.push(call);
    };
    if path != ALLOCATE_PATH && path != RELEASE_PATH {
        record(StatusCode::NOT_FOUND, false);
        return Ok(answer(StatusCode::NOT_FOUND, format!("{{\"error\":\"no such path {path}\"}}")));
    }
    let Some(budget) = budget_ms else {
        record(StatusCode::BAD_REQUEST, false);
        return Ok(answer(
            StatusCode::BAD_REQUEST,
            format!("{{\"error\":\"{TIMEOUT_HEADER} must be a positive integer\"}}"),
        ));
    };
    let worst = options.worst_case().as_millis() as u64;
    if budget < worst {
        // refused before a token is taken: work that cannot finish must not use the cloud's rate limit
        record(StatusCode::TOO_MANY_REQUESTS, false);
        let message = format!("budget {budget} ms is below the provider's worst case {worst} ms (queue + cloud)");
        return Ok(answer(StatusCode::TOO_MANY_REQUESTS, format!("{{\"error\":\"{message}\"}}")));
    }
    let fault = state.lock().unwrap().faults.pop_front();
    if let Some(Fault::Hang) = fault {
        record(StatusCode::GATEWAY_TIMEOUT, false);
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    // the token bucket, waiting at most max_queue_wait for a token
    let queued = Instant::now();
    loop {
        {
            let mut s = state.lock().unwrap();
            refill(&mut s, &options);
            if s.tokens >= 1.0 {
                s.tokens -= 1.0;
                break;
            }
        }
        if queued.elapsed() >= options.max_queue_wait {
            record(StatusCode::TOO_MANY_REQUESTS, false);
            return Ok(answer(StatusCode::TOO_MANY_REQUESTS, "{\"error\":\"rate limited\"}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if let Some(Fault::Status(code)) = fault {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        record(status, true);
        return Ok(answer(status, "{\"error\":\"injected\"}"));
    }
    if let Some(Fault::Slow(extra)) = fault {
        tokio::time::sleep(extra).await;
    }
    tokio::time::sleep(options.cloud_delay).await;
    if path == RELEASE_PATH {
        let Ok(release) = serde_json::from_value::<ReleaseRequest>(body.clone()) else {
            record(StatusCode::BAD_REQUEST, true);
            return Ok(answer(StatusCode::BAD_REQUEST, "{\"error\":\"not a release request\"}"));
        };
        let mut s = state.lock().unwrap();
        // idempotent: an address it does not hold is released already
        let key = s.sub_enis.iter().find(|(_, e)| e.ipv4 == release.ip_address || e.ipv6 == release.ip_address);
        if let Some(key) = key.map(|(k, _)| k.clone()) {
            s.sub_enis.remove(&key);
        }
        drop(s);
        record(StatusCode::OK, true);
        return Ok(answer(StatusCode::OK, "{}"));
    }
    let Ok(allocate) = serde_json::from_value::<AllocateRequest>(body.clone()) else {
        record(StatusCode::BAD_REQUEST, true);
        return Ok(answer(StatusCode::BAD_REQUEST, "{\"error\":\"not an allocate request\"}"));
    };
    let mut responses = Vec::new();
    {
        let mut s = state.lock().unwrap();
        for want in &allocate.sub_eni_requests {
            let key = if want.ipv4_address.is_empty() { want.ipv6_address.clone() } else { want.ipv4_address.clone() };
            let vlan = s.next_vlan;
            s.next_vlan += 1;
            let eni = SubEni {
                node: allocate.node_name.clone(),
                parent_nic_mac: want.parent_nic_mac.clone(),
                subnet: want.subnet.clone(),
                ipv4: want.ipv4_address.clone(),
                ipv6: want.ipv6_address.clone(),
                mac: mac_of(vlan),
                vlan,
                pool: want.ipv4_pool_name.clone(),
            };
            let blank = matches!(fault, Some(Fault::Blank));
            responses.push(SubEniResponse {
                parent_nic_mac: eni.parent_nic_mac.clone(),
                subnet: eni.subnet.clone(),
                ipv4_address: eni.ipv4.clone(),
                ipv6_address: eni.ipv6.clone(),
                mac_address: if blank { String::new() } else { eni.mac.clone() },
                vlan_id: (!blank).then_some(vlan),
            });
            s.sub_enis.insert(key, eni);
        }
    }
    let response = AllocateResponse {
        pod_name: allocate.pod_name,
        pod_namespace: allocate.pod_namespace,
        node_name: allocate.node_name,
        sub_eni_responses: responses,
    };
    record(StatusCode::OK, true);
    Ok(answer(StatusCode::OK, serde_json::to_vec(&response).expect("serialisable")))
}
