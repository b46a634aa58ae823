//! [`ConnectProxy`]: the HTTP proxy a node behind a corporate proxy has, on 127.0.0.1. It tunnels `CONNECT` and
//! nothing else, resolves the names it is told (a name nothing else on the machine resolves, so a client that
//! reaches the server by that name went through the proxy), and records every `CONNECT` target.
//!
//! Written here rather than taken from a crate: the tunnel is thirty lines of tokio, and what a test needs of it is
//! the record of what was asked, and names that only it knows.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct ConnectProxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl ConnectProxy {
    /// A proxy on a free port of 127.0.0.1 that resolves each host of `names` to 127.0.0.1, and IP literals to
    /// themselves.
    pub async fn start(names: &[&str]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the CONNECT proxy");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let names: Arc<HashMap<String, std::net::IpAddr>> =
            Arc::new(names.iter().map(|n| (n.to_ascii_lowercase(), std::net::Ipv4Addr::LOCALHOST.into())).collect());
        let record = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (names, record) = (names.clone(), record.clone());
                tokio::spawn(async move {
                    let _ = tunnel(client, &names, &record).await;
                });
            }
        });
        Self { addr, seen, task }
    }

    /// `http://127.0.0.1:<port>`, for `HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every `CONNECT` target asked so far (`host:port`), in order.
    pub fn connects(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn tunnel(
    mut client: TcpStream,
    names: &HashMap<String, std::net::IpAddr>,
    seen: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    // byte by byte up to the blank line, so that nothing of the tunnelled stream is read here
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 || client.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut request = head.lines().next().unwrap_or_default().split_whitespace();
    let (Some("CONNECT"), Some(target)) = (request.next(), request.next()) else {
        client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n").await?;
        return Ok(());
    };
    seen.lock().unwrap().push(target.to_string());
    let upstream = target.rsplit_once(':').and_then(|(host, port)| {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        let ip = names.get(&host).copied().or_else(|| host.parse().ok())?;
        Some(SocketAddr::new(ip, port.parse().ok()?))
    });
    let Some(upstream) = upstream else {
        client.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n").await?;
        return Ok(());
    };
    let mut server = match TcpStream::connect(upstream).await {
        Ok(server) => server,
        Err(_) => {
            client.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n").await?;
            return Ok(());
        }
    };
    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}
