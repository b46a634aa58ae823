//! One client connection: TLS, HTTP/1.1, and for each request the rule's action and the relay to the API server.

use std::convert::Infallible;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Notify;
use tokio_rustls::TlsAcceptor;

use super::classify::{Verb, classify};
use super::{Action, Shared, stopped};

/// What the proxy answers with: a buffered body, or a watch's stream passed through.
pub(super) type Body = BoxBody<Bytes, hyper::Error>;

/// Serves one accepted connection until the client closes it, a rule resets it, or the proxy stops.
pub(super) async fn serve(shared: Arc<Shared>, tcp: TcpStream, acceptor: TlsAcceptor) {
    let _ = tcp.set_nodelay(true);
    // A second handle on the socket, kept outside hyper and TLS, so that a reset can set a zero linger on it:
    // closing then sends RST, and the client sees "connection reset" at once instead of an orderly end of stream.
    let Ok(std) = tcp.into_std() else { return };
    let Ok(keep) = std.try_clone() else { return };
    let Ok(tcp) = TcpStream::from_std(std) else { return };
    let mut shutdown = shared.shutdown.clone();
    let tls = tokio::select! {
        tls = acceptor.accept(tcp) => tls,
        () = stopped(&mut shutdown) => return,
    };
    let Ok(tls) = tls else { return };
    let kill = Arc::new(Notify::new());
    let service = {
        let (shared, kill) = (shared.clone(), kill.clone());
        service_fn(move |req| handle(shared.clone(), kill.clone(), req))
    };
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        () = kill.notified() => {
            let _ = TcpSocket::from_std_stream(keep).set_zero_linger();
        }
        () = stopped(&mut shutdown) => {}
    }
}

async fn handle(shared: Arc<Shared>, kill: Arc<Notify>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let info = classify(req.method(), req.uri());
    let (index, action) = shared.admit(req.method(), req.uri(), &info);
    let (mut parts, body) = req.into_parts();
    let Ok(body) = body.collect().await else { return reset(&kill).await };
    match &action {
        Some(Action::ResetBeforeForward) => return reset(&kill).await,
        Some(Action::Status(code, message)) => return Ok(status(*code, message)),
        _ => {}
    }
    strip_hop_by_hop(&mut parts.headers);
    let upstream = Request::from_parts(parts, Full::new(body.to_bytes()));
    let watch = info.verb == Verb::Watch;
    // Detached from this connection: once the proxy has accepted a request it forwards it (after any delay or
    // hold) and reads the answer even if the client goes away meanwhile, as a server that got the bytes would.
    let forward = {
        let (shared, action) = (shared.clone(), action.clone());
        let mut shutdown = shared.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                resp = forward(&shared, index, action, upstream, watch) => resp,
                () = stopped(&mut shutdown) => None,
            }
        })
    };
    match forward.await.ok().flatten() {
        Some(resp) if action != Some(Action::DropResponse) => Ok(resp),
        // the answer was lost, or there was none to give: the client sees its connection reset either way
        _ => reset(&kill).await,
    }
}

async fn forward(
    shared: &Shared,
    index: usize,
    action: Option<Action>,
    req: Request<Full<Bytes>>,
    watch: bool,
) -> Option<Response<Body>> {
    match action {
        Some(Action::Delay(delay)) => tokio::time::sleep(delay).await,
        Some(Action::Hold) => shared.hold().await,
        _ => {}
    }
    let (resp, sender) = match shared.upstream.send(req).await {
        Ok(sent) => sent,
        Err(e) => {
            shared.record(index, |s| s.error = Some(format!("{e:#}")));
            return None;
        }
    };
    shared.record(index, |s| s.status = Some(resp.status().as_u16()));
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if watch {
        // streamed as it comes; the connection is not reused, it ends with the watch
        return Some(Response::from_parts(parts, body.boxed()));
    }
    match body.collect().await {
        Ok(body) => {
            shared.upstream.checkin(sender);
            Some(Response::from_parts(parts, full(body.to_bytes())))
        }
        Err(e) => {
            shared.record(index, |s| s.error = Some(format!("reading the response body: {e}")));
            None
        }
    }
}

/// Asks [`serve`] to reset the connection, and never answers.
async fn reset(kill: &Notify) -> Result<Response<Body>, Infallible> {
    kill.notify_one();
    std::future::pending().await
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// A Kubernetes `Status` failure, as the API server writes it.
fn status(code: u16, message: &str) -> Response<Body> {
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    };
    let mut doc = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    let mut resp = Response::builder()
        .status(StatusCode::from_u16(code).expect("add_rule checked the code"))
        .header(header::CONTENT_TYPE, "application/json");
    if code == 429 {
        // as the API server's priority and fairness answers
        doc["details"] = json!({"retryAfterSeconds": 1});
        resp = resp.header(header::RETRY_AFTER, "1");
    }
    resp.body(full(Bytes::from(doc.to_string()))).expect("a valid response")
}

/// Drops the headers that describe one hop, not the message: hyper sets framing for the next hop itself.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    const HOP: [HeaderName; 7] = [
        header::CONNECTION,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::EXPECT,
    ];
    for name in HOP {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}
