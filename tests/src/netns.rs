//! Simulated nodes for the end-to-end tests: network namespaces made with `ip` (iproute2), nothing in the
//! machine's own network namespace.
//!
//! A [`Fabric`] is one L2 segment: a bridge `br0` in a namespace of its own, and for each node a namespace joined
//! to that bridge by a veth pair whose node end, `fab0`, is the `master` the macvlan plugin attaches pod
//! interfaces to. Pods get namespaces of their own ([`PodNs`]). Every namespace is named
//! `hbe2e-<pid>-<n>-...`, with the pid of the process that made it, and is deleted by a `Drop` guard — also when a
//! test fails or panics — and [`sweep_stale`] deletes those of processes that no longer run (a killed run).
//!
//! **How a plugin inside a node namespace reaches the API server.** The CNI chain runs where the container
//! runtime runs it: `ip netns exec <node> cnitool add ...`, so macvlan finds its master `fab0` there and moves the
//! new link into the pod namespace; hereabouts (and Multus) run in the same process tree, in the node namespace,
//! whose loopback cannot see the API server on the host's 127.0.0.1. Each node namespace therefore gets an
//! [`ApiRelay`]: a listener on the node namespace's `127.0.0.1:<API server port>`, made by a thread of the test
//! process that entered the namespace with `setns(2)` only to create the socket, which forwards every connection
//! to the same address in the test process's own namespace. The kubeconfigs stay unchanged (same URL, TLS to the
//! same certificate), and nothing — no link, no address, no route — is added to the machine's namespace. Traffic
//! between pods stays inside the namespaces made here; the only host address reached is the API server's
//! loopback port, by the relay.
//!
//! [`ping`] sends one ICMP echo request from inside a pod namespace over a raw socket, so the tests need no
//! `ping` binary.

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// The prefix of every namespace this module makes.
pub const PREFIX: &str = "hbe2e-";

static FABRICS: AtomicUsize = AtomicUsize::new(0);

/// The `ip` binary; panics with the package to install when it is missing.
pub fn ip_bin() -> &'static str {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        let found = Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success());
        assert!(found, "`ip` (iproute2) is missing: run `apt-get install iproute2`");
    });
    "ip"
}

/// Whether this process can make network namespaces (it is root).
pub fn is_root() -> bool {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions and no memory effects.
    unsafe {
        libc::geteuid() == 0
    }
}

/// Runs `ip ARGS`; the error names the command and what it printed.
pub fn ip(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(ip_bin()).args(args).output().context("run ip")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The names of the namespaces `ip netns list` shows.
pub fn list() -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Deletes the namespaces this module made in processes that no longer run.
pub fn sweep_stale() {
    for name in list() {
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

/// Runs `f` on a thread of its own that has entered network namespace `ns` (its other namespaces stay).
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> anyhow::Result<T> {
    in_netns_at(std::path::Path::new(&format!("/var/run/netns/{ns}")), f)
}

/// [`in_netns`] with the namespace named by a path, e.g. `/proc/<pid>/ns/net`.
pub fn in_netns_at<T: Send + 'static>(
    path: &std::path::Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    let ns = path.display().to_string();
    let file = File::open(path).with_context(|| format!("open netns {ns}"))?;
    std::thread::spawn(move || {
        #[allow(unsafe_code)]
        // SAFETY: setns on an open namespace file changes only this thread's network namespace; the thread ends
        // when `f` returns, so no other code runs in it.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(f())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the thread in netns {ns} panicked"))?
    .with_context(|| format!("setns into {ns}"))
}

/// A network namespace, deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Makes namespace `name` with its loopback up.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        ip(&["netns", "add", name])?;
        let me = Self { name: name.to_string() };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(me)
    }

    /// The path a runtime passes as CNI_NETNS.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// Runs `ip -n <this> ARGS`.
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Whether the namespace still exists.
    pub fn exists(&self) -> bool {
        std::path::Path::new(&self.path()).exists()
    }

    /// Deletes the namespace now (a pod whose sandbox disappears without CNI DEL).
    pub fn delete(&self) -> anyhow::Result<()> {
        if self.exists() {
            ip(&["netns", "del", &self.name])?;
        }
        Ok(())
    }

    /// The addresses (without prefix length, link-local IPv6 left out) on `ifname`, as `ip -o addr` shows them.
    pub fn addresses(&self, ifname: &str) -> anyhow::Result<Vec<IpAddr>> {
        let text = self.ip(&["-o", "addr", "show", "dev", ifname])?;
        Ok(parse_addresses(&text))
    }

    /// Whether link `ifname` exists in the namespace.
    pub fn has_link(&self, ifname: &str) -> bool {
        self.ip(&["link", "show", "dev", ifname]).is_ok()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.delete();
    }
}

/// The global addresses in `ip -o addr` output.
pub fn parse_addresses(text: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            if (pair[0] == "inet" || pair[0] == "inet6")
                && let Some(Ok(addr)) = pair[1].split('/').next().map(str::parse::<IpAddr>)
                && !matches!(addr, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
            {
                out.push(addr);
            }
        }
    }
    out
}

/// One simulated node: its namespace, the macvlan master in it, and the API relay.
#[derive(Debug)]
pub struct Node {
    /// The node's name (`spec.nodeName`, `NODENAME`).
    pub name: String,
    pub netns: Netns,
    /// The veth end to the fabric, in the node namespace.
    pub master: String,
    relay: Option<ApiRelay>,
}

/// One L2 fabric and its nodes; everything is deleted when dropped.
#[derive(Debug)]
pub struct Fabric {
    /// `hbe2e-<pid>-<n>`: the prefix of every namespace of this fabric.
    pub prefix: String,
    // dropped first: the relays hold sockets in the node namespaces
    pub nodes: Vec<Node>,
    pub bridge: Netns,
}

impl Fabric {
    /// A fabric with one node per name, each with an [`ApiRelay`] to `127.0.0.1:api_port` when given.
    pub fn new(node_names: &[String], api_port: Option<u16>) -> anyhow::Result<Self> {
        ip_bin();
        sweep_stale();
        let n = FABRICS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{PREFIX}{}-{n}", std::process::id());
        let bridge = Netns::new(&format!("{prefix}-fabric"))?;
        bridge.ip(&["link", "add", "br0", "type", "bridge"])?;
        bridge.ip(&["link", "set", "br0", "up"])?;
        let mut me = Self { prefix: prefix.clone(), nodes: Vec::new(), bridge };
        for (i, name) in node_names.iter().enumerate() {
            let netns = Netns::new(&format!("{prefix}-node{i}"))?;
            let port = format!("n{i}");
            // both ends are made in the fabric namespace's view and the peer put straight into the node's
            me.bridge.ip(&["link", "add", &port, "type", "veth", "peer", "name", "fab0", "netns", &netns.name])?;
            me.bridge.ip(&["link", "set", &port, "master", "br0", "up"])?;
            netns.ip(&["link", "set", "fab0", "up"])?;
            let relay = match api_port {
                Some(p) => Some(ApiRelay::start(&netns.name, p)?),
                None => None,
            };
            me.nodes.push(Node { name: name.clone(), netns, master: "fab0".into(), relay });
        }
        Ok(me)
    }

    /// A pod namespace `<prefix>-<pod>`, deleted when dropped.
    pub fn pod_netns(&self, pod: &str) -> anyhow::Result<Netns> {
        Netns::new(&format!("{}-{pod}", self.prefix))
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.relay.take();
        }
        self.nodes.clear();
    }
}

/// A TCP relay from `127.0.0.1:<port>` in a node namespace to `127.0.0.1:<port>` in the test process's own
/// network namespace (see the module documentation). Stopped when dropped.
#[derive(Debug)]
pub struct ApiRelay {
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiRelay {
    /// Listens in `ns` and forwards to the same port here.
    pub fn start(ns: &str, port: u16) -> anyhow::Result<Self> {
        let listener = in_netns(ns, move || TcpListener::bind(("127.0.0.1", port)))?
            .with_context(|| format!("listen on 127.0.0.1:{port} in {ns}"))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (stop2, conns2) = (stop.clone(), conns.clone());
        let thread = std::thread::spawn(move || {
            let target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((inbound, _)) => {
                        let _ = inbound.set_nonblocking(false);
                        let Ok(outbound) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) else {
                            continue;
                        };
                        if let (Ok(a), Ok(b)) = (inbound.try_clone(), outbound.try_clone()) {
                            let mut held = conns2.lock().unwrap();
                            held.retain(|s| s.peer_addr().is_ok());
                            held.push(a);
                            held.push(b);
                        }
                        pipe(inbound, outbound);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        Ok(Self { stop, conns, thread: Some(thread) })
    }
}

fn pipe(a: TcpStream, b: TcpStream) {
    let (a2, b2) = match (a.try_clone(), b.try_clone()) {
        (Ok(a2), Ok(b2)) => (a2, b2),
        _ => return,
    };
    std::thread::spawn(move || copy(a, b));
    std::thread::spawn(move || copy(b2, a2));
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
    let _ = from.shutdown(std::net::Shutdown::Read);
}

impl Drop for ApiRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Sends ICMP echo requests from inside namespace `ns` to `to` until one is answered or `within` passes;
/// returns whether a reply came.
pub fn ping(ns: &str, to: IpAddr, within: Duration) -> anyhow::Result<bool> {
    in_netns(ns, move || echo(to, within))?
}

/// [`ping`] from the namespace at `path`, e.g. `/proc/<pid>/ns/net` of a pod's process.
pub fn ping_at(path: &std::path::Path, to: IpAddr, within: Duration) -> anyhow::Result<bool> {
    in_netns_at(path, move || echo(to, within))?
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// `sendto(2)` of `packet` to the socket address `addr` (a `sockaddr_in` or `sockaddr_in6`).
#[allow(unsafe_code)]
fn send_to<A>(sock: &std::os::fd::OwnedFd, packet: &[u8], addr: &A) -> isize {
    // SAFETY: the buffer and the address are valid for the call, and the length is the address type's size.
    unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            packet.as_ptr().cast(),
            packet.len(),
            0,
            (addr as *const A).cast(),
            size_of::<A>() as libc::socklen_t,
        )
    }
}

#[allow(unsafe_code)]
fn echo(to: IpAddr, within: Duration) -> anyhow::Result<bool> {
    let (domain, proto, request_type, reply_type) = match to {
        IpAddr::V4(_) => (libc::AF_INET, libc::IPPROTO_ICMP, 8u8, 0u8),
        IpAddr::V6(_) => (libc::AF_INET6, libc::IPPROTO_ICMPV6, 128u8, 129u8),
    };
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(domain, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error()).context("open a raw ICMP socket (needs root)");
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let timeout = libc::timeval { tv_sec: 0, tv_usec: 200_000 };
    // SAFETY: the option value is a timeval that lives across the call.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let ident = (std::process::id() & 0xffff) as u16;
    let deadline = Instant::now() + within;
    let mut seq: u16 = 0;
    while Instant::now() < deadline {
        seq = seq.wrapping_add(1);
        let mut packet = vec![request_type, 0, 0, 0];
        packet.extend_from_slice(&ident.to_be_bytes());
        packet.extend_from_slice(&seq.to_be_bytes());
        packet.extend_from_slice(b"hereabouts-e2e!!");
        if to.is_ipv4() {
            // the kernel fills in the ICMPv6 checksum itself, not the ICMPv4 one
            let sum = checksum(&packet);
            packet[2..4].copy_from_slice(&sum.to_be_bytes());
        }
        let sent = match to {
            IpAddr::V4(v4) => send_to(
                &sock,
                &packet,
                &libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: 0,
                    sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.octets()) },
                    sin_zero: [0; 8],
                },
            ),
            IpAddr::V6(v6) => send_to(
                &sock,
                &packet,
                &libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: 0,
                    sin6_flowinfo: 0,
                    sin6_addr: libc::in6_addr { s6_addr: v6.octets() },
                    sin6_scope_id: 0,
                },
            ),
        };
        if sent < 0 {
            // e.g. no neighbour yet or IPv6 DAD still running: try again until the deadline
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let until = (Instant::now() + Duration::from_millis(500)).min(deadline);
        while Instant::now() < until {
            let mut buf = [0u8; 1500];
            // SAFETY: buf is valid for writes of its length.
            let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n <= 0 {
                continue;
            }
            let data = &buf[..n as usize];
            // raw IPv4 sockets return the IP header, raw IPv6 sockets do not
            let icmp = match to {
                IpAddr::V4(_) => {
                    let ihl = usize::from(data[0] & 0x0f) * 4;
                    let from = Ipv4Addr::new(data[12], data[13], data[14], data[15]);
                    if from != to || data.len() < ihl + 8 {
                        continue;
                    }
                    &data[ihl..]
                }
                IpAddr::V6(_) => data,
            };
            if icmp.len() >= 8 && icmp[0] == reply_type && icmp[4..6] == ident.to_be_bytes() {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_ip_output() {
        let text = "5: net1    inet 198.18.0.3/24 brd 198.18.0.255 scope global net1\\       valid_lft forever\n\
                    5: net1    inet6 2001:db8::3/64 scope global \\       valid_lft forever\n\
                    5: net1    inet6 fe80::1/64 scope link \\       valid_lft forever\n";
        assert_eq!(
            parse_addresses(text),
            vec!["198.18.0.3".parse::<IpAddr>().unwrap(), "2001:db8::3".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn the_icmp_checksum_is_the_ones_complement_sum() {
        let mut packet = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
        let sum = checksum(&packet);
        packet[2..4].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(checksum(&packet), 0);
    }
}
