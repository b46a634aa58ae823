//! How the API server is reached: through the proxy kubectl would use, else directly at an address of its name
//! resolved here ([`super::resolve`]).
//!
//! A runtime hands its own environment to CNI plugins, and runtimes behind a corporate proxy have `HTTPS_PROXY` set
//! for their image pulls, so the plugin, the agent and `kubectl hereabouts` follow the rules every Go client of
//! Kubernetes follows (`golang.org/x/net/http/httpproxy`): the kubeconfig's `proxy-url` first; else `HTTPS_PROXY`
//! (`HTTP_PROXY` for an `http://` server), upper case before lower case; `NO_PROXY` entries are IPs, CIDRs and
//! domains (a domain covers its subdomains), each with an optional port, and `*` covers everything; a server named
//! `localhost` or by a loopback address is never proxied. kube's own reading differs (it matches `NO_PROXY` against
//! the proxy's address and refuses an empty entry), so the choice is made here and kube is only told the result.

use std::net::IpAddr;

use http::Uri;
use ipnet::IpNet;

use super::resolve::{ResolveError, pin_server_address};

/// A proxy setting no client could use. CNI code 4: the runtime's environment is at fault, not the network's
/// configuration.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The variable's value is not a URL of a proxy.
    #[error("proxy setting {var}={value:?} is not a proxy URL: {message}")]
    Url {
        /// The environment variable.
        var: &'static str,
        /// Its value, without a password.
        value: String,
        /// Why it is not one.
        message: String,
    },
    /// The proxy speaks a protocol the client cannot.
    #[error("proxy setting {var}={value:?}: scheme {scheme:?} is not supported (http, https or socks5)")]
    Scheme {
        /// The environment variable, or `proxy-url` for the kubeconfig's.
        var: &'static str,
        /// Its value, without a password.
        value: String,
        /// The scheme it names.
        scheme: String,
    },
    /// kube refused the settings while reading the kubeconfig (it reads `HTTPS_PROXY` and `NO_PROXY` itself).
    #[error("proxy settings (HTTPS_PROXY, NO_PROXY) refused by the API client: {0}")]
    Client(String),
}

/// Why the server cannot be reached as configured.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The proxy setting is unusable.
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    /// No proxy applies and the server's name did not resolve.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
}

/// The proxy settings of an environment, read once.
#[derive(Debug, Clone, Default)]
pub struct Proxies {
    https: Option<Uri>,
    http: Option<Uri>,
    no_proxy: NoProxy,
    /// `HTTPS_PROXY` as kube parses it: what kube put in `Config::proxy_url` when the kubeconfig named no proxy.
    kube_view: Option<Uri>,
}

impl Proxies {
    /// The settings of this process's environment.
    pub fn from_env() -> Result<Self, ProxyError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The settings `var` gives (an environment's lookup).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ProxyError> {
        let first = |names: [&'static str; 2]| {
            names.into_iter().find_map(|name| var(name).filter(|v| !v.trim().is_empty()).map(|v| (name, v)))
        };
        let https = first(["HTTPS_PROXY", "https_proxy"]);
        let kube_view = https.as_ref().and_then(|(_, v)| v.parse::<Uri>().ok());
        let https = https.map(|(name, value)| parse_proxy(name, &value)).transpose()?;
        let http = first(["HTTP_PROXY", "http_proxy"]).map(|(name, value)| parse_proxy(name, &value)).transpose()?;
        let no_proxy = first(["NO_PROXY", "no_proxy"]).map(|(_, v)| NoProxy::parse(&v)).unwrap_or_default();
        Ok(Self { https, http, no_proxy, kube_view })
    }

    /// The proxy a request to `server` goes through, if any.
    pub fn for_server(&self, server: &Uri) -> Option<&Uri> {
        let https = server.scheme_str() != Some("http");
        let proxy = if https { self.https.as_ref() } else { self.http.as_ref() }?;
        let host = server.host()?.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        let port = server.port_u16().unwrap_or(if https { 443 } else { 80 });
        let ip = host.parse::<IpAddr>().ok();
        if host == "localhost" || ip.is_some_and(|ip| ip.is_loopback()) {
            return None;
        }
        (!self.no_proxy.covers(&host, ip, port)).then_some(proxy)
    }

    /// Sets `config`'s proxy: the kubeconfig's `proxy-url` if it names one, else the proxy these settings give for
    /// the server, else none. True when the server is reached through a proxy.
    pub fn select(&self, config: &mut kube::Config) -> Result<bool, ProxyError> {
        let from_kubeconfig = config.proxy_url.as_ref().filter(|p| Some(*p) != self.kube_view.as_ref());
        if let Some(proxy) = from_kubeconfig {
            check_scheme("proxy-url", proxy)?;
            tracing::debug!(proxy = %redacted(&proxy.to_string()), "API server through the kubeconfig's proxy-url");
            return Ok(true);
        }
        config.proxy_url = self.for_server(&config.cluster_url).cloned();
        if let Some(proxy) = &config.proxy_url {
            tracing::debug!(proxy = %redacted(&proxy.to_string()), "API server through a proxy");
        }
        Ok(config.proxy_url.is_some())
    }

    /// [`Proxies::select`], then, when no proxy applies, points `config` at an address of the server's name
    /// resolved here. A proxied server's name is the proxy's to resolve: the node may have no name server that
    /// knows it.
    pub async fn route(&self, config: &mut kube::Config) -> Result<(), RouteError> {
        if !self.select(config)? {
            pin_server_address(config).await?;
        }
        Ok(())
    }
}

/// kube's reading of the same variables failed while it loaded a kubeconfig: the settings' fault, reported as
/// theirs. `None` for any other kubeconfig error.
pub fn kube_refused(error: &kube::config::KubeconfigError) -> Option<ProxyError> {
    use kube::config::KubeconfigError as E;
    matches!(error, E::ParseProxyUrl(_) | E::ParseNoProxy(_)).then(|| {
        let source = std::error::Error::source(error).map(|s| format!(": {s}")).unwrap_or_default();
        ProxyError::Client(format!("{error}{source}"))
    })
}

/// A proxy URL as Go reads one: a bare `host:port` is an HTTP proxy.
fn parse_proxy(var: &'static str, value: &str) -> Result<Uri, ProxyError> {
    let value = value.trim();
    let url_error = |message: String| ProxyError::Url { var, value: redacted(value), message };
    let parsed = match value.parse::<Uri>() {
        Ok(uri) if uri.scheme().is_some() && uri.host().is_some_and(|h| !h.is_empty()) => uri,
        _ => format!("http://{value}").parse::<Uri>().map_err(|e| url_error(e.to_string()))?,
    };
    if parsed.host().is_none_or(str::is_empty) {
        return Err(url_error("no host".into()));
    }
    check_scheme(var, &parsed)?;
    Ok(parsed)
}

fn check_scheme(var: &'static str, proxy: &Uri) -> Result<(), ProxyError> {
    match proxy.scheme_str() {
        Some("http" | "https" | "socks5") => Ok(()),
        other => Err(ProxyError::Scheme {
            var,
            value: redacted(&proxy.to_string()),
            scheme: other.unwrap_or_default().to_string(),
        }),
    }
}

/// `value` with the password of its user information replaced, for errors and logs.
fn redacted(value: &str) -> String {
    let after_scheme = value.find("://").map_or(0, |i| i + 3);
    let authority_end = value[after_scheme..].find('/').map_or(value.len(), |i| after_scheme + i);
    match value[after_scheme..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &value[after_scheme..after_scheme + at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &value[..after_scheme], &value[after_scheme + at..])
        }
        None => value.to_string(),
    }
}

/// `NO_PROXY`, as Go reads it: empty entries and entries with no host are skipped, not refused.
#[derive(Debug, Clone, Default)]
struct NoProxy {
    everything: bool,
    nets: Vec<IpNet>,
    ips: Vec<(IpAddr, Option<u16>)>,
    /// A domain with its leading dot, its port, and whether the domain itself matches too (`example.com` does,
    /// `.example.com` and `*.example.com` only their subdomains).
    domains: Vec<(String, Option<u16>, bool)>,
}

impl NoProxy {
    fn parse(value: &str) -> Self {
        let mut parsed = Self::default();
        for entry in value.split(',').map(|e| e.trim().to_ascii_lowercase()).filter(|e| !e.is_empty()) {
            if entry == "*" {
                return Self { everything: true, ..Self::default() };
            }
            if let Ok(net) = entry.parse::<IpNet>() {
                parsed.nets.push(net);
                continue;
            }
            let (host, port) = split_port(&entry);
            if host.is_empty() {
                continue;
            }
            if let Ok(ip) = host.parse::<IpAddr>() {
                parsed.ips.push((ip, port));
                continue;
            }
            let host = host.strip_prefix('*').unwrap_or(host);
            match host.strip_prefix('.') {
                Some(_) => parsed.domains.push((host.to_string(), port, false)),
                None => parsed.domains.push((format!(".{host}"), port, true)),
            }
        }
        parsed
    }

    fn covers(&self, host: &str, ip: Option<IpAddr>, port: u16) -> bool {
        let port_matches = |p: &Option<u16>| p.is_none_or(|p| p == port);
        if self.everything {
            return true;
        }
        let ip_covered = ip.is_some_and(|ip| {
            self.nets.iter().any(|net| net.contains(&ip)) || self.ips.iter().any(|(i, p)| *i == ip && port_matches(p))
        });
        if ip_covered {
            return true;
        }
        self.domains.iter().any(|(domain, p, itself)| {
            (host.ends_with(domain.as_str()) || (*itself && host == &domain[1..])) && port_matches(p)
        })
    }
}

/// `host:port`, `[v6]:port` or a bare host, as Go's `net.SplitHostPort` splits an entry (a bare IPv6 address
/// has no port).
fn split_port(entry: &str) -> (&str, Option<u16>) {
    if let Some((host, after)) = entry.strip_prefix('[').and_then(|rest| rest.split_once(']')) {
        return (host, after.strip_prefix(':').and_then(|p| p.parse().ok()));
    }
    match entry.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(port) => (host, Some(port)),
            Err(_) => (entry, None),
        },
        _ => (entry, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies(vars: &[(&str, &str)]) -> Result<Proxies, ProxyError> {
        Proxies::from_vars(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    }

    fn through(vars: &[(&str, &str)], server: &str) -> Option<String> {
        proxies(vars).unwrap().for_server(&server.parse().unwrap()).map(|p| p.to_string())
    }

    const PROXY: (&str, &str) = ("HTTPS_PROXY", "http://proxy.example.test:3128");

    #[test]
    fn https_proxy_upper_case_before_lower_case_and_a_bare_host_port_is_http() {
        let server = "https://api.example.test:6443";
        assert_eq!(through(&[PROXY], server).as_deref(), Some("http://proxy.example.test:3128/"));
        assert_eq!(through(&[("https_proxy", "lower.test:8080")], server).as_deref(), Some("http://lower.test:8080/"));
        assert_eq!(
            through(&[("https_proxy", "http://lower.test:1"), PROXY], server).as_deref(),
            Some("http://proxy.example.test:3128/")
        );
        assert_eq!(through(&[("HTTPS_PROXY", "  ")], server), None, "a blank value is no proxy");
        assert_eq!(through(&[("HTTP_PROXY", "http://plain.test:1")], server), None, "HTTP_PROXY is for http://");
        assert_eq!(
            through(&[("HTTP_PROXY", "http://plain.test:1")], "http://api.example.test:8080").as_deref(),
            Some("http://plain.test:1/")
        );
    }

    #[test]
    fn loopback_and_localhost_are_never_proxied() {
        for server in ["https://127.0.0.1:6443", "https://127.3.2.1", "https://[::1]:6443", "https://localhost:6443"] {
            assert_eq!(through(&[PROXY], server), None, "{server}");
        }
    }

    #[test]
    fn no_proxy_entries_as_go_reads_them() {
        let cases: &[(&str, &str, bool)] = &[
            // (NO_PROXY, server, bypassed)
            ("*", "https://api.example.test", true),
            ("10.0.0.0/8", "https://10.96.0.1:443", true),
            ("10.0.0.0/8", "https://11.0.0.1:443", false),
            ("10.96.0.1", "https://10.96.0.1:6443", true),
            ("10.96.0.1:443", "https://10.96.0.1:6443", false),
            ("10.96.0.1:443", "https://10.96.0.1", true),
            ("[2001:db8::1]:6443", "https://[2001:db8::1]:6443", true),
            ("2001:db8::/32", "https://[2001:db8::1]:6443", true),
            ("example.test", "https://example.test", true),
            ("example.test", "https://api.example.test:6443", true),
            ("example.test", "https://notexample.test", false),
            (".example.test", "https://example.test", false),
            (".example.test", "https://api.example.test", true),
            ("*.example.test", "https://api.example.test", true),
            ("*.example.test", "https://example.test", false),
            ("EXAMPLE.test:6443", "https://API.example.test:6443", true),
            ("example.test:443", "https://api.example.test:6443", false),
            // empty entries and a trailing comma are skipped, as Go skips them (kube would refuse them)
            ("a.test,,example.test,", "https://api.example.test", true),
            (" , ", "https://api.example.test", false),
            (":6443", "https://api.example.test:6443", false),
        ];
        for (no_proxy, server, bypassed) in cases {
            let found = through(&[PROXY, ("NO_PROXY", no_proxy)], server);
            assert_eq!(found.is_none(), *bypassed, "NO_PROXY={no_proxy:?} {server}: {found:?}");
        }
        assert_eq!(through(&[PROXY, ("no_proxy", "example.test")], "https://api.example.test"), None);
        assert!(
            through(&[PROXY, ("NO_PROXY", "other.test"), ("no_proxy", "example.test")], "https://api.example.test")
                .is_some()
        );
    }

    #[test]
    fn an_unusable_proxy_is_an_error_naming_the_variable_without_the_password() {
        let error = proxies(&[("HTTPS_PROXY", "ftp://user:secret@proxy.test:21")]).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, ProxyError::Scheme { var: "HTTPS_PROXY", .. }), "{error:?}");
        assert!(text.contains("ftp") && text.contains("HTTPS_PROXY") && !text.contains("secret"), "{text}");

        let error = proxies(&[("https_proxy", "http://user:secret@bad host:1")]).unwrap_err();
        assert!(matches!(error, ProxyError::Url { var: "https_proxy", .. }), "{error:?}");
        assert!(!error.to_string().contains("secret"), "{error}");

        let error = proxies(&[("HTTP_PROXY", "socks4://proxy.test:1080")]).unwrap_err();
        assert!(matches!(error, ProxyError::Scheme { var: "HTTP_PROXY", .. }), "{error:?}");
    }

    #[test]
    fn passwords_are_redacted_and_nothing_else_changes() {
        assert_eq!(redacted("http://u:p@proxy.test:1/"), "http://u:***@proxy.test:1/");
        assert_eq!(redacted("u:p@proxy.test:1"), "u:***@proxy.test:1");
        assert_eq!(redacted("http://proxy.test:1/a@b"), "http://proxy.test:1/a@b");
        assert_eq!(redacted("socks5://proxy.test"), "socks5://proxy.test");
    }

    #[tokio::test]
    async fn the_kubeconfigs_proxy_url_wins_and_a_proxied_name_is_not_resolved_here() {
        let settings = proxies(&[PROXY]).unwrap();
        // kube put the kubeconfig's proxy-url there: kept, whatever the environment says
        let mut config = kube::Config::new("https://api.hereabouts.invalid:6443".parse().unwrap());
        config.proxy_url = Some("socks5://kubeconfig.test:1080".parse().unwrap());
        settings.route(&mut config).await.unwrap();
        assert_eq!(config.proxy_url.unwrap().to_string(), "socks5://kubeconfig.test:1080/");
        assert_eq!(config.cluster_url.host(), Some("api.hereabouts.invalid"), "the proxy resolves the name");

        // kube put HTTPS_PROXY there itself: the rules above decide
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.proxy_url = Some("http://proxy.example.test:3128".parse().unwrap());
        settings.route(&mut config).await.unwrap();
        assert_eq!(config.proxy_url, None, "loopback is not proxied");

        let mut config = kube::Config::new("https://api.hereabouts.invalid:6443".parse().unwrap());
        settings.route(&mut config).await.unwrap();
        assert_eq!(config.proxy_url.unwrap().to_string(), "http://proxy.example.test:3128/");

        // no proxy applies: the name is resolved here, and an unknown one is a resolve error
        let settings = proxies(&[PROXY, ("NO_PROXY", ".invalid")]).unwrap();
        let mut config = kube::Config::new("https://api.hereabouts.invalid:6443".parse().unwrap());
        assert!(matches!(settings.route(&mut config).await, Err(RouteError::Resolve(_))));
    }
}
