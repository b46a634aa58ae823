//! [`Table`] on the kernel's routing tables of the network namespace the process runs in, over rtnetlink.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt as _;
use ipnet::IpNet;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope};
use rtnetlink::{Handle, RouteMessageBuilder};

use super::{HostRoute, NetRoute, Table, TableError};

/// The kernel's tables, through one netlink socket whose connection runs on the current tokio runtime.
#[derive(Debug, Clone)]
pub struct KernelTable {
    handle: Handle,
}

const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const EEXIST: i32 = 17;
const ENODEV: i32 = 19;

impl KernelTable {
    /// Opens the socket; must be called inside a tokio runtime, which runs the connection.
    pub fn connect() -> Result<Self, TableError> {
        let (conn, handle, _) = rtnetlink::new_connection()
            .map_err(|e| TableError::Netlink { op: "open a netlink socket", detail: e.to_string() })?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }
}

fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(-m.raw_code()),
        _ => None,
    }
}

fn netlink(op: &'static str, e: &rtnetlink::Error) -> TableError {
    TableError::Netlink { op, detail: e.to_string() }
}

/// The message naming `route` exactly: destination, table, protocol and metric.
fn message(route: &HostRoute, link: Option<u32>) -> RouteMessage {
    let builder = |b: RouteMessageBuilder<IpAddr>| {
        let b = b.table_id(route.table).protocol(RouteProtocol::from(route.protocol)).priority(route.metric);
        match link {
            Some(l) => b.output_interface(l).scope(RouteScope::Link),
            // "any scope": a delete with the builder's universe scope misses our link-scope route (ESRCH)
            None => b.scope(RouteScope::NoWhere),
        }
    };
    let prefix = if route.dst.is_ipv4() { 32 } else { 128 };
    let b = RouteMessageBuilder::<IpAddr>::new().destination_prefix(route.dst, prefix).expect("a host prefix fits");
    builder(b).build()
}

/// The host route a listed message is, if it is one (a /32 or /128 with a destination).
fn host_route(m: &RouteMessage) -> Option<HostRoute> {
    let full = match m.header.address_family {
        AddressFamily::Inet => 32,
        AddressFamily::Inet6 => 128,
        _ => return None,
    };
    if m.header.destination_prefix_length != full {
        return None;
    }
    let mut dst = None;
    let mut table = u32::from(m.header.table);
    let mut metric = 0;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(IpAddr::V4(*ip)),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = Some(IpAddr::V6(*ip)),
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Priority(p) => metric = *p,
            _ => {}
        }
    }
    Some(HostRoute { dst: dst?, table, protocol: u8::from(m.header.protocol), metric })
}

/// A listed route that is not a host route, with its destination, link and next hop.
fn net_route(m: &RouteMessage) -> Option<(u32, NetRoute)> {
    let full = match m.header.address_family {
        AddressFamily::Inet => 32,
        AddressFamily::Inet6 => 128,
        _ => return None,
    };
    let len = m.header.destination_prefix_length;
    if len == full {
        return None;
    }
    let mut dst: IpAddr = if full == 32 { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    let (mut table, mut link, mut gateway) = (u32::from(m.header.table), None, None);
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = IpAddr::V4(*ip),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = IpAddr::V6(*ip),
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Oif(i) => link = Some(*i),
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gateway = Some(IpAddr::V4(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gateway = Some(IpAddr::V6(*ip)),
            _ => {}
        }
    }
    let dst = IpNet::new(dst, len).ok()?;
    Some((table, NetRoute { dst, protocol: u8::from(m.header.protocol), link, gateway }))
}

impl Table for KernelTable {
    async fn routes_over(&self, table: u32, net: IpNet) -> Result<Vec<NetRoute>, TableError> {
        let query = match net {
            IpNet::V4(_) => RouteMessageBuilder::<Ipv4Addr>::new().table_id(table).build(),
            IpNet::V6(_) => RouteMessageBuilder::<Ipv6Addr>::new().table_id(table).build(),
        };
        let listed: Vec<RouteMessage> =
            self.handle.route().get(query).execute().try_collect().await.map_err(|e| netlink("list routes", &e))?;
        Ok(listed
            .iter()
            .filter_map(net_route)
            .filter(|(t, r)| *t == table && (r.dst.contains(&net) || net.contains(&r.dst)))
            .map(|(_, r)| r)
            .collect())
    }

    async fn host_routes(&self, table: u32, net: IpNet) -> Result<Vec<HostRoute>, TableError> {
        let query = match net {
            IpNet::V4(_) => RouteMessageBuilder::<Ipv4Addr>::new().build(),
            IpNet::V6(_) => RouteMessageBuilder::<Ipv6Addr>::new().build(),
        };
        let listed: Vec<RouteMessage> =
            self.handle.route().get(query).execute().try_collect().await.map_err(|e| netlink("list routes", &e))?;
        Ok(listed.iter().filter_map(host_route).filter(|r| r.table == table && net.contains(&r.dst)).collect())
    }

    async fn add(&self, route: &HostRoute, link: u32) -> Result<(), TableError> {
        match self.handle.route().add(message(route, Some(link))).execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(EEXIST) => Err(TableError::Exists { route: *route }),
            Err(e) => Err(netlink("add a route", &e)),
        }
    }

    async fn delete(&self, route: &HostRoute) -> Result<(), TableError> {
        match self.handle.route().del(message(route, None)).execute().await {
            Ok(()) => Ok(()),
            Err(e) if matches!(errno(&e), Some(ESRCH | ENOENT)) => Ok(()),
            Err(e) => Err(netlink("delete a route", &e)),
        }
    }

    async fn link_for(&self, device: Option<&str>, net: IpNet) -> Result<u32, TableError> {
        if let Some(name) = device {
            let links: Vec<_> =
                self.handle.link().get().match_name(name).execute().try_collect().await.map_err(|e| {
                    match errno(&e) {
                        Some(ENODEV) => TableError::NoLink { device: name.to_string() },
                        _ => netlink("find a link", &e),
                    }
                })?;
            return links
                .first()
                .map(|l| l.header.index)
                .ok_or_else(|| TableError::NoLink { device: name.to_string() });
        }
        let addrs: Vec<_> =
            self.handle.address().get().execute().try_collect().await.map_err(|e| netlink("list addresses", &e))?;
        addrs
            .iter()
            .find(|a| a.attributes.iter().any(|at| matches!(at, AddressAttribute::Address(ip) if net.contains(ip))))
            .map(|a| a.header.index)
            .ok_or(TableError::NoLinkInRange { range: net })
    }
}
