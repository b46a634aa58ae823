use std::path::{Path, PathBuf};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

/// The namespace used when the kubeconfig's current context names none (Whereabouts' choice).
pub const DEFAULT_NAMESPACE: &str = "kube-system";

/// Why no client could be built from a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The file could not be read or parsed.
    #[error("kubeconfig {}: {source}", path.display())]
    Read {
        /// The kubeconfig's path.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: KubeconfigError,
    },
    /// The environment's proxy settings (`HTTPS_PROXY`, `NO_PROXY`, ...) are unusable.
    #[error("kubeconfig {}: {source}", path.display())]
    Proxy {
        /// The kubeconfig's path.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: super::ProxyError,
    },
    /// Its server's host name did not resolve.
    #[error("kubeconfig {}: {source}", path.display())]
    Resolve {
        /// The kubeconfig's path.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: super::resolve::ResolveError,
    },
    /// The client could not be built from it (bad CA, bad server URL).
    #[error("kubeconfig {}: build client: {source}", path.display())]
    Client {
        /// The kubeconfig's path.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: kube::Error,
    },
}

/// The namespace of the kubeconfig's current context, else [`DEFAULT_NAMESPACE`].
pub fn namespace_of(kubeconfig: &Kubeconfig) -> String {
    let current = kubeconfig.current_context.as_deref();
    kubeconfig
        .contexts
        .iter()
        .find(|c| Some(c.name.as_str()) == current)
        .and_then(|c| c.context.as_ref()?.namespace.clone())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string())
}

/// A client from the kubeconfig at `path` and the namespace its current context names, through the proxy the
/// kubeconfig or the environment names ([`super::proxy`]). The client trusts only the kubeconfig's CA, and kube's
/// own retries are off: callers retry inside their own time budget.
pub async fn connect(path: &Path) -> Result<(Client, String), ConnectError> {
    let proxy_err = |source| ConnectError::Proxy { path: path.to_path_buf(), source };
    let read_err = |source: KubeconfigError| match super::proxy::kube_refused(&source) {
        Some(refused) => proxy_err(refused),
        None => ConnectError::Read { path: path.to_path_buf(), source },
    };
    let proxies = super::Proxies::from_env().map_err(proxy_err)?;
    let kubeconfig = Kubeconfig::read_from(path).map_err(read_err)?;
    let namespace = namespace_of(&kubeconfig);
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.map_err(read_err)?;
    config.default_retry = false;
    proxies.route(&mut config).await.map_err(|e| match e {
        super::RouteError::Proxy(source) => proxy_err(source),
        super::RouteError::Resolve(source) => ConnectError::Resolve { path: path.to_path_buf(), source },
    })?;
    config.connect_timeout = Some(std::time::Duration::from_secs(5));
    let client =
        Client::try_from(config).map_err(|source| ConnectError::Client { path: path.to_path_buf(), source })?;
    Ok((client, namespace))
}
