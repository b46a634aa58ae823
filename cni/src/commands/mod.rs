//! One module per CNI verb; [`dispatch`] reads the config, starts logging and connects, in that order, so a bad
//! config never costs a client.

mod add;
mod check;
mod del;
mod gc;
mod status;

use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::config::{self, IpamConfig};
use hereabouts_ipam::ipam::Request;
use hereabouts_ipam::store::{self, ConnectError, Store};

use crate::env::{self, CniEnv, Command};
use crate::error::CniError;
use crate::{logging, output};

/// Runs the verb of `env` on the config in `stdin`; returns what goes to stdout on success.
pub async fn dispatch(env: &CniEnv, stdin: &[u8]) -> Result<Option<String>, CniError> {
    if env.command == Command::Version {
        return Ok(Some(output::version_result(stdin)));
    }
    let cfg = config::load(&config::Input { stdin, cni_args: &env.args })?;
    logging::init(&cfg);
    let span = tracing::info_span!(
        "cni",
        command = ?env.command,
        container_id = %env.container_id,
        ifname = %env.ifname,
        pod = %format!("{}/{}", cfg.pod.namespace, cfg.pod.name),
    );
    let _entered = span.enter();
    if env.command == Command::Add {
        cfg.require_pod()?;
    }
    let budget = Budget::new(cfg.timeout);
    let store = connect(&cfg, env.command).await?;
    let req = Request { container_id: env.container_id.clone(), ifname: env.ifname.clone(), node: env::node_name() };
    let outcome = match env.command {
        Command::Add => add::run(&store, &cfg, &req, &budget).await.map(Some),
        Command::Del => del::run(&store, &cfg, &req, &budget).await.map(|()| None),
        Command::Check => check::run(&store, &cfg, &req, &budget).await.map(|()| None),
        Command::Gc => gc::run(&store, &cfg, &req.node, stdin, &budget).await.map(|()| None),
        Command::Status => status::run(&store, &budget).await.map(|()| None),
        Command::Version => unreachable!("answered above"),
    };
    if let Err(e) = &outcome {
        tracing::error!(code = e.code, msg = %e.msg, details = %e.details, "failed");
    }
    outcome
}

async fn connect(cfg: &IpamConfig, command: Command) -> Result<Store, CniError> {
    let Some(path) = &cfg.kubeconfig else {
        return Err(CniError::new(
            7,
            "invalid network configuration",
            "ipam.kubernetes.kubeconfig is required (inline or in the flat file)",
        ));
    };
    match store::connect(path).await {
        Ok((client, namespace)) => Ok(Store::new(client, &namespace)),
        Err(e @ ConnectError::Read { .. }) => {
            let code = if command == Command::Status { 50 } else { 7 };
            Err(CniError::new(code, "invalid network configuration", e.to_string()))
        }
        Err(e @ ConnectError::Client { .. }) => Err(CniError::new(7, "invalid network configuration", e.to_string())),
    }
}
