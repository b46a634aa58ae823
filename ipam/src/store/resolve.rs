//! The API server's host name, resolved without the C library. The binaries are linked statically, and a static
//! glibc's `getaddrinfo` loads the host's NSS modules at run time, which need not match it (or exist): the CNI
//! plugin runs on whatever host the runtime is on. A kubeconfig naming its server by IP needs none of this.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

/// Why the server's name did not resolve.
#[derive(Debug, thiserror::Error)]
#[error("resolve the API server's host {host}: {message}")]
pub struct ResolveError {
    /// The host name of the kubeconfig's server.
    pub host: String,
    /// What went wrong.
    pub message: String,
}

/// How long a lookup may take, over every name server and attempt.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Points `config` at an address of its server's host name, from `/etc/hosts` or the name servers of
/// `/etc/resolv.conf`, and keeps verifying the server's certificate against (and sending SNI for) that name.
/// A server given by address is left as it is.
pub async fn pin_server_address(config: &mut kube::Config) -> Result<(), ResolveError> {
    let Some(host) = config.cluster_url.host().map(str::to_owned) else { return Ok(()) };
    if host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let ip = resolve_host(&host).await.map_err(|message| ResolveError { host: host.clone(), message })?;
    config.cluster_url =
        with_address(&config.cluster_url, ip).map_err(|message| ResolveError { host: host.clone(), message })?;
    config.tls_server_name.get_or_insert(host.clone());
    tracing::debug!(host = %host, %ip, "API server host resolved");
    Ok(())
}

/// An address of `host`, from `/etc/hosts` or the name servers of `/etc/resolv.conf`, without the C library.
pub async fn resolve_host(host: &str) -> Result<IpAddr, String> {
    let resolver = resolver()?;
    let found = tokio::time::timeout(LOOKUP_TIMEOUT, resolver.lookup_ip(host))
        .await
        .map_err(|_| format!("no answer within {LOOKUP_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    found.iter().next().ok_or_else(|| "no address".to_string())
}

/// The system's resolver; without a resolv.conf, one that reads only the hosts file (hickory's own default
/// would ask public name servers).
fn resolver() -> Result<TokioResolver, String> {
    let builder = match TokioResolver::builder_tokio() {
        Ok(builder) => builder,
        Err(e) => {
            tracing::debug!(error = %e, "no usable resolv.conf: the hosts file only");
            let hosts_only = ResolverConfig::from_parts(None, Vec::new(), Vec::new());
            TokioResolver::builder_with_config(hosts_only, TokioRuntimeProvider::default())
        }
    };
    let mut builder = builder;
    builder.options_mut().use_hosts_file = ResolveHosts::Always;
    builder.build().map_err(|e| e.to_string())
}

/// `uri` with its host replaced by `ip`, its scheme, port, path and query kept.
fn with_address(uri: &http::Uri, ip: IpAddr) -> Result<http::Uri, String> {
    let authority = match uri.port_u16() {
        Some(port) => SocketAddr::new(ip, port).to_string(),
        None if ip.is_ipv6() => format!("[{ip}]"),
        None => ip.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    parts.authority = Some(authority.parse().map_err(|e| format!("{authority}: {e}"))?);
    http::Uri::from_parts(parts).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_replaces_the_host_and_nothing_else() {
        let uri: http::Uri = "https://api.example.test:6443/base?x=1".parse().unwrap();
        let v4 = with_address(&uri, "198.18.0.1".parse().unwrap()).unwrap();
        assert_eq!(v4.to_string(), "https://198.18.0.1:6443/base?x=1");
        let v6 = with_address(&uri, "2001:db8::1".parse().unwrap()).unwrap();
        assert_eq!(v6.to_string(), "https://[2001:db8::1]:6443/base?x=1");
        let portless: http::Uri = "https://api.example.test".parse().unwrap();
        assert_eq!(
            with_address(&portless, "2001:db8::1".parse().unwrap()).unwrap().to_string(),
            "https://[2001:db8::1]/"
        );
    }

    #[tokio::test]
    async fn a_server_given_by_address_is_left_alone() {
        for server in ["https://127.0.0.1:6443", "https://[::1]:6443"] {
            let mut config = kube::Config::new(server.parse().unwrap());
            pin_server_address(&mut config).await.unwrap();
            assert_eq!(config.cluster_url.to_string(), format!("{server}/"));
            assert_eq!(config.tls_server_name, None);
        }
    }

    #[tokio::test]
    async fn a_name_in_the_hosts_file_is_pinned_and_verified_by_name() {
        // /etc/hosts names localhost on every machine this runs on; the live test uses a name of its own.
        let mut config = kube::Config::new("https://localhost:6443".parse().unwrap());
        pin_server_address(&mut config).await.unwrap();
        let host = config.cluster_url.host().unwrap().trim_start_matches('[').trim_end_matches(']').to_owned();
        assert!(host.parse::<IpAddr>().unwrap().is_loopback(), "{}", config.cluster_url);
        assert_eq!(config.cluster_url.port_u16(), Some(6443));
        assert_eq!(config.tls_server_name.as_deref(), Some("localhost"));
    }

    #[tokio::test]
    async fn an_unknown_name_is_an_error_naming_it() {
        let mut config = kube::Config::new("https://no-such-host.invalid:6443".parse().unwrap());
        let e = pin_server_address(&mut config).await.unwrap_err();
        assert_eq!(e.host, "no-such-host.invalid");
        assert!(e.to_string().contains("no-such-host.invalid"), "{e}");
    }
}
