//! The bytes install-cni writes, and the checks of its flag values. No I/O here.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use hereabouts_ipam::config::LogLevel;
use serde_json::{Map, Value, json};

/// The cluster, user and context names inside the kubeconfig (one of each).
pub(super) const CLUSTER: &str = "local";
pub(super) const USER: &str = "hereabouts";
pub(super) const CONTEXT: &str = "hereabouts";

/// A bearer token and the CA that verifies the API server: this pod's own (read from its projected files, used
/// to mint), or the CNI plugin's (the minted token, embedded in the host's kubeconfig).
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Credentials {
    /// The token, trimmed.
    pub token: String,
    /// The CA file's content, as it is (PEM).
    pub ca: Vec<u8>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &format_args!("<{} bytes>", self.token.len()))
            .field("ca", &format_args!("<{} bytes>", self.ca.len()))
            .finish()
    }
}

/// The CNI plugin's kubeconfig: `server`, the CA embedded as `certificate-authority-data`, the token, and one
/// context whose namespace is where the pools live. JSON, which is YAML too.
pub(super) fn kubeconfig(server: &str, namespace: &str, creds: &Credentials) -> Vec<u8> {
    let ca = base64::engine::general_purpose::STANDARD.encode(&creds.ca);
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": USER, "user": {"token": creds.token}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CLUSTER, "user": USER, "namespace": namespace}}],
        "current-context": CONTEXT,
        "preferences": {},
    });
    let mut out = serde_json::to_vec_pretty(&doc).expect("a JSON value serialises");
    out.push(b'\n');
    out
}

/// What the flat file says.
#[derive(Debug)]
pub(super) struct FlatFile<'a> {
    /// The kubeconfig as the host sees it: the CNI plugin runs on the host.
    pub kubeconfig: &'a str,
    pub log_level: LogLevel,
    pub log_file: Option<&'a str>,
    pub reconciler_cron_expression: Option<&'a str>,
}

/// The flat file: the keys of an `ipam` object at top level (Whereabouts' format), only keys the config parser
/// accepts (`datastore` is an accepted-and-ignored legacy key, kept so Whereabouts' tooling recognises the file).
pub(super) fn flat_file(f: &FlatFile<'_>) -> Vec<u8> {
    let mut doc = Map::new();
    doc.insert("datastore".into(), json!("kubernetes"));
    doc.insert("kubernetes".into(), json!({"kubeconfig": f.kubeconfig}));
    doc.insert("log_level".into(), json!(f.log_level.as_str()));
    if let Some(path) = f.log_file {
        doc.insert("log_file".into(), json!(path));
    }
    if let Some(expr) = f.reconciler_cron_expression {
        doc.insert("reconciler_cron_expression".into(), json!(expr));
    }
    let mut out = serde_json::to_vec_pretty(&Value::Object(doc)).expect("a JSON value serialises");
    out.push(b'\n');
    out
}

/// `https://HOST:PORT` from `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`; an IPv6 host is bracketed.
pub(super) fn server_url(host: &str, port: &str) -> Result<String, String> {
    let host = host.trim();
    let port = port.trim();
    if host.is_empty() {
        return Err("KUBERNETES_SERVICE_HOST is empty".into());
    }
    if !matches!(port.parse::<u16>(), Ok(p) if p != 0) {
        return Err(format!("KUBERNETES_SERVICE_PORT {port:?} is not a port number"));
    }
    if host.contains(':') && !host.starts_with('[') {
        Ok(format!("https://[{host}]:{port}"))
    } else {
        Ok(format!("https://{host}:{port}"))
    }
}

/// `--server`: an `https://` (or `http://`) URL.
pub(super) fn check_server(s: &str) -> Result<(), String> {
    let rest = s.strip_prefix("https://").or_else(|| s.strip_prefix("http://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.contains(char::is_whitespace) => Ok(()),
        _ => Err(format!("{s:?} is not an https:// URL of the API server")),
    }
}

/// A namespace name (RFC 1123 label): the pools are kept there, and it is written into the kubeconfig.
pub(super) fn check_namespace(s: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !s.is_empty() && s.len() <= 63 && s.chars().all(ok) && alnum(s.chars().next()) && alnum(s.chars().last()) {
        Ok(())
    } else {
        Err(format!("{s:?} is not a namespace name (lower-case letters, digits and '-', at most 63)"))
    }
}

/// A Node name (a DNS-1123 subdomain): the object the CNI token is bound to, and the name the plugin records.
pub(super) fn check_node_name(s: &str) -> Result<(), String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.len() <= 253 && s.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!("{s:?} is not a Node name (lower-case letters, digits, '-' and '.', at most 253)"))
    }
}

/// A number with a unit, `ms`, `s`, `m` or `h` (`200ms`, `2s`, `1.5s`, `24h`); a bare number is seconds.
pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let bad = || format!("{s:?}: expected a duration such as 200ms, 2s, 1m or 24h");
    let number: f64 = number.parse().map_err(|_| bad())?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(number * scale).map_err(|_| bad())
}

/// `--watch-interval`: a duration between 10ms and 1h.
pub(super) fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(3600) {
        return Err(format!("{:?}: must be between 10ms and 1h", s.trim()));
    }
    Ok(d)
}

/// The shortest token the API server issues: it refuses a TokenRequest of `expirationSeconds` below 600.
pub(super) const MIN_TOKEN_LIFETIME: Duration = Duration::from_secs(600);
/// The longest CNI token install-cni asks for: a token on a host should not outlive a week of neglect.
pub(super) const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// `--cni-token-lifetime`: whole seconds between [`MIN_TOKEN_LIFETIME`] and [`MAX_TOKEN_LIFETIME`].
pub(super) fn parse_lifetime(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < MIN_TOKEN_LIFETIME || d > MAX_TOKEN_LIFETIME {
        return Err(format!("{:?}: must be between 10m (the API server refuses shorter tokens) and 168h", s.trim()));
    }
    Ok(Duration::from_secs(d.as_secs()))
}

/// `--cni-token-refresh-fraction`: between 0.001 and 0.9 of the granted lifetime.
pub(super) fn parse_fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s.trim().parse().map_err(|_| format!("{s:?}: expected a fraction such as 0.5"))?;
    if !(0.001..=0.9).contains(&f) {
        return Err(format!("{s:?}: must be between 0.001 and 0.9"));
    }
    Ok(f)
}

/// `--cni-service-account`: a ServiceAccount name (a DNS-1123 subdomain).
pub(super) fn parse_service_account(s: &str) -> Result<String, String> {
    let s = s.trim();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.len() <= 253 && s.split('.').all(label_ok) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a ServiceAccount name (lower-case letters, digits, '-' and '.')"))
    }
}

/// `--log-level`: one of the plugin's levels (the values the flat file's `log_level` accepts).
pub(super) fn parse_log_level(s: &str) -> Result<LogLevel, String> {
    LogLevel::parse(s).ok_or_else(|| format!("{s:?}: expected one of debug, verbose, info, error, panic"))
}

/// `--log-file`: absolute, as the host sees it (the flat file's `log_file` must be absolute).
pub(super) fn parse_absolute(s: &str) -> Result<String, String> {
    if Path::new(s).is_absolute() { Ok(s.to_string()) } else { Err(format!("{s:?} is not an absolute path")) }
}

/// `--reconciler-cron-expression`: a 5-field crontab (minute hour day-of-month month day-of-week).
pub(super) fn parse_cron(s: &str) -> Result<String, String> {
    use croner::parser::{CronParser, Seconds, Year};
    let s = s.trim();
    if s.split_whitespace().count() != 5 {
        return Err(format!("{s:?}: expected 5 fields (minute hour day-of-month month day-of-week)"));
    }
    let parser = CronParser::builder().seconds(Seconds::Disallowed).year(Year::Disallowed).build();
    parser.parse(s).map_err(|e| format!("{s:?}: {e}"))?;
    Ok(s.to_string())
}

/// Whether `ca` looks like a PEM certificate (a warning only: the plugin's client refuses a bad one).
pub(super) fn looks_like_pem(ca: &[u8]) -> bool {
    ca.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----")
}
