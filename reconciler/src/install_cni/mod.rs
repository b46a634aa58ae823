//! `install-cni`: puts the CNI plugin on the node and keeps its credentials fresh.
//!
//! It writes, each file atomically (see [`files`]):
//! - `<cni-bin-dir>/hereabouts`, mode 0755: a copy of `--source-binary`, skipped when the bytes are the same;
//! - `<cni-conf-dir>/hereabouts.d/hereabouts.kubeconfig`, mode 0600: the API server, the CA embedded, a token of
//!   ServiceAccount `--cni-service-account` minted with the TokenRequest API and bound to this node's Node (see
//!   [`token`]), and a context whose namespace is where the pools live;
//! - `<cni-conf-dir>/hereabouts.d/nodename`, mode 0644, with `--node-name` (the downward API's `spec.nodeName`):
//!   the plugin keys slices, locks and reservations by the node's name, which is the host name only by default,
//!   and the admission policy of the chart lets the token write only what records that name;
//! - `<cni-conf-dir>/hereabouts.d/hereabouts.conf`, mode 0644: the flat file (Whereabouts' format), naming the
//!   kubeconfig by its path on the host (`--host-cni-conf-dir`), since the plugin runs on the host.
//!
//! This pod's own token (`--token-file`) only authenticates the TokenRequest; it is never written to the host:
//! it is bound to this pod and stops working seconds after the pod is deleted, and its ServiceAccount has rights
//! the plugin must not have. The minted token carries only the plugin's rights and is bound to the Node, not to
//! this pod: it outlives a replaced DaemonSet pod, dies with the Node, and names the node to the API server.
//!
//! Then, unless `--once`, it polls the token and CA files every `--watch-interval` (see [`watch`]) and mints a new
//! token when `--cni-token-refresh-fraction` of the last one's lifetime has passed, when the CA changed, or when
//! its own token rotated (the kubelet rotates it hourly; after a signing-key rotation only new tokens verify).

mod files;
mod render;
#[cfg(test)]
mod tests;
mod token;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hereabouts_ipam::config::{DEFAULT_FLAT_FILE_PATHS, LogLevel};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{info, warn};

use render::Credentials;

/// The binary's name in the CNI bin directory: the `type` a netconf names.
const BINARY_NAME: &str = "hereabouts";
/// The name of the binary a Whereabouts netconf's `type` runs.
const WHEREABOUTS_NAME: &str = "whereabouts";
/// The subdirectory of the CNI conf directory holding the flat file and the kubeconfig. Runtimes read only the
/// top level of the conf directory, so nothing here is taken for a network config.
const CONF_SUBDIR: &str = "hereabouts.d";
const KUBECONFIG_NAME: &str = "hereabouts.kubeconfig";
const FLAT_FILE_NAME: &str = "hereabouts.conf";

/// `install-cni` flags. Each can also be set by the environment variable shown.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// This node's name (the pod's `spec.nodeName` through the downward API): the Node the CNI token is bound to,
    /// written to `hereabouts.d/nodename` for the plugin, which otherwise takes the host name. Required.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,

    /// The CNI plugin binary to install (the image's copy).
    #[arg(long, env = "HEREABOUTS_SOURCE_BINARY", value_name = "PATH", default_value = "/usr/local/bin/hereabouts")]
    pub source_binary: PathBuf,

    /// Also install the plugin as `whereabouts`, so that NetworkAttachmentDefinitions naming `"type":
    /// "whereabouts"` are served by it (the switch-over from Whereabouts, docs/migrating.md). Only once
    /// Whereabouts' own DaemonSet is gone: both would write the same file.
    #[arg(long, env = "HEREABOUTS_INSTALL_AS_WHEREABOUTS")]
    pub install_as_whereabouts: bool,

    /// The host's CNI binary directory, as this container sees it; `hereabouts` is written there (mode 0755).
    #[arg(long, env = "HEREABOUTS_CNI_BIN_DIR", value_name = "DIR", default_value = "/host/opt/cni/bin")]
    pub cni_bin_dir: PathBuf,

    /// The host's CNI config directory, as this container sees it; the flat file and the kubeconfig are written
    /// to its `hereabouts.d/`.
    #[arg(long, env = "HEREABOUTS_CNI_CONF_DIR", value_name = "DIR", default_value = "/host/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,

    /// The same directory as the host sees it: the flat file names the kubeconfig by this path, since the CNI
    /// plugin runs on the host. The plugin looks for the flat file in `/etc/cni/net.d/hereabouts.d/` unless a
    /// netconf sets `configuration_path`.
    #[arg(
        long,
        env = "HEREABOUTS_HOST_CNI_CONF_DIR",
        value_name = "DIR",
        default_value = "/etc/cni/net.d",
        value_parser = render::parse_absolute
    )]
    pub host_cni_conf_dir: String,

    /// This pod's own service-account token (the projected one): it authenticates the TokenRequests and is never
    /// written to the host. Re-read before each request; a rotation triggers a new CNI token.
    #[arg(
        long,
        env = "HEREABOUTS_TOKEN_FILE",
        value_name = "PATH",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    pub token_file: PathBuf,

    /// The API server's CA (PEM): verifies the API server for the TokenRequests, and is embedded in the kubeconfig
    /// as `certificate-authority-data`; a change is written at once and triggers a new CNI token.
    #[arg(
        long,
        env = "HEREABOUTS_CA_FILE",
        value_name = "PATH",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    )]
    pub ca_file: PathBuf,

    /// The file holding the namespace of the kubeconfig's context (where the pools live); `--namespace` wins.
    #[arg(
        long,
        env = "HEREABOUTS_NAMESPACE_FILE",
        value_name = "PATH",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    )]
    pub namespace_file: PathBuf,

    /// The namespace of the kubeconfig's context, instead of the content of `--namespace-file`.
    #[arg(long, env = "HEREABOUTS_NAMESPACE", value_name = "NAME")]
    pub namespace: Option<String>,

    /// The API server URL written into the kubeconfig; without it, https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    /// (an IPv6 host in brackets), which the kubelet sets in every pod.
    #[arg(long, env = "HEREABOUTS_SERVER", value_name = "URL")]
    pub server: Option<String>,

    /// The CNI plugin's log level, written as `log_level` into the flat file: debug, verbose, info, error or panic.
    #[arg(
        long,
        env = "HEREABOUTS_CNI_LOG_LEVEL",
        value_name = "LEVEL",
        default_value = "info",
        value_parser = render::parse_log_level
    )]
    pub log_level: LogLevel,

    /// The CNI plugin's log file (a host path), written as `log_file` into the flat file; without it the plugin
    /// logs to stderr, which the runtime collects.
    #[arg(long, env = "HEREABOUTS_CNI_LOG_FILE", value_name = "PATH", value_parser = render::parse_absolute)]
    pub log_file: Option<String>,

    /// The cluster-wide reconcile's schedule (5-field crontab, UTC), written as `reconciler_cron_expression` into
    /// the flat file; left out when not set.
    #[arg(
        long,
        env = "HEREABOUTS_RECONCILER_CRON_EXPRESSION",
        value_name = "CRON",
        value_parser = render::parse_cron
    )]
    pub reconciler_cron_expression: Option<String>,

    /// How often the token and CA files are read and compared with the last ones, removed files are put back, and
    /// a due or failed TokenRequest is tried: `200ms`, `2s`, `1m`.
    #[arg(
        long,
        env = "HEREABOUTS_WATCH_INTERVAL",
        value_name = "DURATION",
        default_value = "2s",
        value_parser = render::parse_interval
    )]
    pub watch_interval: Duration,

    /// The ServiceAccount whose token the kubeconfig gets, minted with the TokenRequest API in the kubeconfig's
    /// namespace. This pod's ServiceAccount needs `create` on its `serviceaccounts/token`, nothing more of it.
    #[arg(
        long,
        env = "HEREABOUTS_CNI_SERVICE_ACCOUNT",
        value_name = "NAME",
        default_value = "hereabouts-cni",
        value_parser = render::parse_service_account
    )]
    pub cni_service_account: String,

    /// The validity each CNI token is asked for (`expirationSeconds`), from 10m (the API server's minimum) to
    /// 168h. The API server may grant less (`--service-account-max-token-expiration`); its answer counts. 24h
    /// bounds what a token taken from a host is worth to a day (less when its Node is deleted first), and at the
    /// default refresh fraction leaves the node 12h of working ADD and DEL when no install-cni can renew it (a
    /// stuck rollout, an uninstall).
    #[arg(
        long,
        env = "HEREABOUTS_CNI_TOKEN_LIFETIME",
        value_name = "DURATION",
        default_value = "24h",
        value_parser = render::parse_lifetime
    )]
    pub cni_token_lifetime: Duration,

    /// The fraction of a CNI token's granted lifetime after which a new one is minted, from 0.001 to 0.9.
    #[arg(
        long,
        env = "HEREABOUTS_CNI_TOKEN_REFRESH_FRACTION",
        value_name = "FRACTION",
        default_value = "0.5",
        value_parser = render::parse_fraction
    )]
    pub cni_token_refresh_fraction: f64,

    /// Mint one token, write everything and exit, instead of keeping the token fresh until SIGTERM or SIGINT.
    #[arg(long, env = "HEREABOUTS_INSTALL_ONCE", value_parser = clap::builder::FalseyValueParser::new())]
    pub once: bool,
}

/// Runs `install-cni`: mints the CNI token and installs, then (unless `--once`) keeps the token fresh until
/// SIGTERM or SIGINT and returns `Ok`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let once = args.once;
    let interval = args.watch_interval;
    // Before the first write, so that a SIGTERM arriving meanwhile ends the process cleanly after it.
    let stop = if once { None } else { Some(Stop::new()?) };
    let installer = Arc::new(blocking(move || Installer::new(args)).await?);
    // Unreadable credentials are a deployment mistake: fail at once, before anything is written.
    let pod = {
        let installer = installer.clone();
        blocking(move || installer.read_credentials()).await?
    };
    let Some(mut stop) = stop else {
        let minted = installer.minter.mint(&pod).await.context("mint the CNI plugin's token")?;
        let creds = Credentials { token: minted.token, ca: pod.ca };
        return blocking(move || installer.install(Some(&creds))).await;
    };
    let first = tokio::select! {
        minted = installer.minter.mint(&pod) => minted,
        name = stop.recv() => {
            info!(signal = name, "stopping");
            return Ok(());
        }
    };
    info!(interval = ?interval, token = %installer.token_file.display(), ca = %installer.ca_file.display(),
        node = %installer.minter.node, "watching the token and CA files; the CNI token is bound to the node's Node");
    watch::watch(installer, pod, first, interval, stop).await
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> anyhow::Result<T> + Send + 'static) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await.context("install-cni worker thread")?
}

/// SIGTERM (the kubelet stopping the pod) and SIGINT.
#[derive(Debug)]
struct Stop {
    term: Signal,
    int: Signal,
}

impl Stop {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("install a SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("install a SIGINT handler")?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Where everything goes and what goes in it, resolved from the flags once.
#[derive(Debug)]
struct Installer {
    source_binary: PathBuf,
    /// `<cni-bin-dir>/hereabouts`.
    binary: PathBuf,
    /// `<cni-bin-dir>/whereabouts`, with `--install-as-whereabouts`.
    alias: Option<PathBuf>,
    /// `<cni-conf-dir>/hereabouts.d`.
    conf_dir: PathBuf,
    /// The kubeconfig, as this container sees it.
    kubeconfig: PathBuf,
    /// The flat file, as this container sees it.
    flat_file: PathBuf,
    token_file: PathBuf,
    ca_file: PathBuf,
    server: String,
    namespace: String,
    flat_file_contents: Vec<u8>,
    /// `nodename` as this container sees it, and the node's name.
    node_file: (PathBuf, String),
    minter: token::Minter,
}

impl Installer {
    /// Checks the flags and reads the namespace; writes nothing.
    fn new(args: Args) -> anyhow::Result<Self> {
        Self::with_env(args, |name| std::env::var(name).ok())
    }

    /// [`Installer::new`] with the environment (`KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`) given.
    fn with_env(args: Args, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let server = match args.server.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            Some(s) => {
                render::check_server(s).map_err(|e| anyhow::anyhow!("--server: {e}"))?;
                s.to_string()
            }
            None => match (env("KUBERNETES_SERVICE_HOST"), env("KUBERNETES_SERVICE_PORT")) {
                (Some(host), Some(port)) => render::server_url(&host, &port).map_err(anyhow::Error::msg)?,
                _ => bail!(
                    "no API server: set --server (HEREABOUTS_SERVER), or KUBERNETES_SERVICE_HOST and \
                     KUBERNETES_SERVICE_PORT (set by the kubelet in a pod)"
                ),
            },
        };
        let namespace = match args.namespace.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            Some(ns) => {
                render::check_namespace(ns).map_err(|e| anyhow::anyhow!("--namespace: {e}"))?;
                ns.to_string()
            }
            None => {
                let path = &args.namespace_file;
                let ns =
                    std::fs::read_to_string(path).with_context(|| format!("read namespace file {}", path.display()))?;
                let ns = ns.trim();
                render::check_namespace(ns).map_err(|e| anyhow::anyhow!("namespace file {}: {e}", path.display()))?;
                ns.to_string()
            }
        };
        let conf_dir = args.cni_conf_dir.join(CONF_SUBDIR);
        let host_conf_dir = Path::new(&args.host_cni_conf_dir).join(CONF_SUBDIR);
        let host_kubeconfig = host_conf_dir.join(KUBECONFIG_NAME);
        let host_kubeconfig = host_kubeconfig.to_str().context("--host-cni-conf-dir is not UTF-8")?;
        let host_flat_file = host_conf_dir.join(FLAT_FILE_NAME);
        if !DEFAULT_FLAT_FILE_PATHS.iter().any(|p| Path::new(p) == host_flat_file) {
            warn!(
                flat_file = %host_flat_file.display(),
                "the CNI plugin does not look for the flat file there by default: netconfs must set \
                 ipam.configuration_path to it"
            );
        }
        let flat_file_contents = render::flat_file(&render::FlatFile {
            kubeconfig: host_kubeconfig,
            log_level: args.log_level,
            log_file: args.log_file.as_deref(),
            reconciler_cron_expression: args.reconciler_cron_expression.as_deref(),
        });
        // Without the node's name there is no Node to bind the token to, and a token bound to nothing is one the
        // chart's admission policy lets write nothing: refuse to start rather than install a useless kubeconfig.
        let node = match args.node_name.as_deref().map(str::trim).filter(|n| !n.is_empty()) {
            Some(n) => {
                render::check_node_name(n).map_err(|e| anyhow::anyhow!("--node-name: {e}"))?;
                n.to_string()
            }
            None => bail!(
                "no node name: set --node-name (NODE_NAME, the pod's spec.nodeName through the downward API); the \
                 CNI plugin's token is bound to this node's Node"
            ),
        };
        let minter = token::Minter {
            server: server.clone(),
            namespace: namespace.clone(),
            service_account: args.cni_service_account,
            node: node.clone(),
            lifetime: args.cni_token_lifetime,
            refresh_fraction: args.cni_token_refresh_fraction,
        };
        let node_file = (conf_dir.join(hereabouts_ipam::config::NODE_NAME_FILE), node);
        Ok(Self {
            source_binary: args.source_binary,
            binary: args.cni_bin_dir.join(BINARY_NAME),
            alias: args.install_as_whereabouts.then(|| args.cni_bin_dir.join(WHEREABOUTS_NAME)),
            kubeconfig: conf_dir.join(KUBECONFIG_NAME),
            flat_file: conf_dir.join(FLAT_FILE_NAME),
            conf_dir,
            token_file: args.token_file,
            ca_file: args.ca_file,
            server,
            namespace,
            flat_file_contents,
            node_file,
            minter,
        })
    }

    /// This pod's token (trimmed) and the CA, as they are now.
    fn read_credentials(&self) -> anyhow::Result<Credentials> {
        let token = std::fs::read_to_string(&self.token_file)
            .with_context(|| format!("read token file {}", self.token_file.display()))?;
        let token = token.trim();
        if token.is_empty() {
            bail!("token file {} is empty", self.token_file.display());
        }
        let ca = std::fs::read(&self.ca_file).with_context(|| format!("read CA file {}", self.ca_file.display()))?;
        if ca.iter().all(u8::is_ascii_whitespace) {
            bail!("CA file {} is empty", self.ca_file.display());
        }
        if !render::looks_like_pem(&ca) {
            warn!(path = %self.ca_file.display(), "the CA file holds no PEM certificate");
        }
        Ok(Credentials { token: token.to_string(), ca })
    }

    /// Writes the binary, then the kubeconfig holding `cni` (the CNI plugin's token and the CA), then the flat
    /// file, each only if it differs, so that the flat file never names a kubeconfig that is not there. Without
    /// `cni` (no token could be minted yet) the kubeconfig an earlier run left stays as it is, and the flat file
    /// is written only if there is one: its token is bound to the Node, not to a pod, and may well still be valid.
    fn install(&self, cni: Option<&Credentials>) -> anyhow::Result<()> {
        for path in [&self.binary, &self.kubeconfig, &self.flat_file].into_iter().chain(&self.alias) {
            files::sweep_stale_temps(path);
        }
        if let Some(dir) = self.binary.parent() {
            files::create_dir(dir)?;
        }
        files::create_dir(&self.conf_dir)?;
        self.install_binary()?;
        self.write_node_name()?;
        match cni {
            Some(cni) => self.write_kubeconfig(cni, "installed")?,
            None if files::exists(&self.kubeconfig)? => {
                warn!(path = %self.kubeconfig.display(), "no new token yet: the kubeconfig of an earlier run stays");
            }
            None => {
                warn!(path = %self.kubeconfig.display(), "no token yet: no kubeconfig, and no flat file naming it");
                return Ok(());
            }
        }
        self.write_flat_file()
    }

    /// Writes the kubeconfig holding a newly minted token, and the flat file if it is missing.
    fn store(&self, cni: &Credentials) -> anyhow::Result<()> {
        files::create_dir(&self.conf_dir)?;
        self.write_kubeconfig(cni, "new token")?;
        if !files::exists(&self.flat_file)? {
            self.write_flat_file()?;
        }
        Ok(())
    }

    /// The plugin under each name it is installed as.
    fn binaries(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.binary).chain(&self.alias)
    }

    fn install_binary(&self) -> anyhow::Result<()> {
        for binary in self.binaries() {
            if files::install_binary(&self.source_binary, binary)? {
                info!(path = %binary.display(), source = %self.source_binary.display(), "installed the CNI binary");
            } else {
                info!(path = %binary.display(), "the CNI binary is up to date");
            }
        }
        Ok(())
    }

    fn write_kubeconfig(&self, creds: &Credentials, why: &str) -> anyhow::Result<()> {
        let contents = render::kubeconfig(&self.server, &self.namespace, creds);
        if files::write_if_changed(&self.kubeconfig, &contents, 0o600)? {
            info!(path = %self.kubeconfig.display(), server = %self.server, namespace = %self.namespace,
                "wrote the kubeconfig ({why})");
        } else {
            info!(path = %self.kubeconfig.display(), "the kubeconfig is up to date");
        }
        Ok(())
    }

    /// Written before the flat file: a plugin that finds the flat file finds the node's name beside it.
    fn write_node_name(&self) -> anyhow::Result<()> {
        let (path, name) = &self.node_file;
        if files::write_if_changed(path, format!("{name}\n").as_bytes(), 0o644)? {
            info!(path = %path.display(), node = %name, "wrote the node's name");
        }
        Ok(())
    }

    fn write_flat_file(&self) -> anyhow::Result<()> {
        if files::write_if_changed(&self.flat_file, &self.flat_file_contents, 0o644)? {
            info!(path = %self.flat_file.display(), "wrote the flat file");
        } else {
            info!(path = %self.flat_file.display(), "the flat file is up to date");
        }
        Ok(())
    }

    /// One poll: reads this pod's credentials and puts back any of the three files that was removed. `cni` is
    /// what the kubeconfig holds, if this process wrote it; when the CA differs from its CA, the kubeconfig is
    /// rewritten with the new CA at once (the token does not depend on it) and `cni` follows.
    fn poll(&self, cni: &mut Option<Credentials>) -> anyhow::Result<Credentials> {
        let pod = self.read_credentials()?;
        let mut removed = None;
        for binary in self.binaries() {
            if !files::exists(binary)? {
                removed = Some(binary);
            }
        }
        if let Some(binary) = removed {
            warn!(path = %binary.display(), "the CNI binary was removed; installing it again");
            if let Some(dir) = self.binary.parent() {
                files::create_dir(dir)?;
            }
            self.install_binary()?;
        }
        if let Some(cni) = cni.as_mut() {
            let ca_changed = cni.ca != pod.ca;
            if ca_changed || !files::exists(&self.kubeconfig)? {
                files::create_dir(&self.conf_dir)?;
                let candidate = Credentials { token: cni.token.clone(), ca: pod.ca.clone() };
                self.write_kubeconfig(&candidate, if ca_changed { "CA changed" } else { "it was removed" })?;
                *cni = candidate;
            }
        }
        let (path, _) = &self.node_file;
        if !files::exists(path)? {
            warn!(path = %path.display(), "the node's name file was removed; writing it again");
            files::create_dir(&self.conf_dir)?;
            self.write_node_name()?;
        }
        if !files::exists(&self.flat_file)? && files::exists(&self.kubeconfig)? {
            warn!(path = %self.flat_file.display(), "the flat file is missing; writing it");
            self.write_flat_file()?;
        }
        Ok(pod)
    }
}
