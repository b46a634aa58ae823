//! The wire to a request and back: [`dispatch`] reads the config (strictly for ADD, CHECK and STATUS, leniently
//! for DEL and GC, since the runtime replays to them the config it cached at ADD and a DEL that fails leaves a pod
//! stuck terminating), starts logging, hands the request to the verb of `hereabouts_ipam::verbs`, and formats its
//! answer. Which mode a config is in is the verbs' business, not this crate's.

use std::path::Path;

use hereabouts_ipam::config::{self, LogLevel};
use hereabouts_ipam::verbs::{self, Host};
use hereabouts_ipam::{Request, VerbError};
use tracing::Instrument as _;

use crate::env::{CniEnv, Command};
use crate::error::CniError;
use crate::{attachments, output};

/// Runs the verb of `env` on the config in `stdin` on `host`, with logging started by `init_logging` once the
/// config says where logs go; returns what goes to stdout on success.
pub async fn dispatch(
    env: &CniEnv,
    stdin: &[u8],
    host: &impl Host,
    init_logging: impl FnOnce(Option<&Path>, LogLevel),
) -> Result<Option<String>, CniError> {
    let input = config::Input { stdin, cni_args: &env.args };
    match env.command {
        Command::Version => Ok(Some(output::version_result(stdin))),
        Command::Add | Command::Check | Command::Status => {
            // a mistake in the config is an error that names it, and nothing is written or connected
            let cfg = config::load(&input)?;
            init_logging(cfg.log_file.as_deref(), cfg.log_level);
            let req = request(env, cfg.flat_file.as_deref());
            let outcome = async {
                logged(match env.command {
                    Command::Add => verbs::add(host, &cfg, &req).await.map(|a| Some(output::add_result(&cfg, &a))),
                    Command::Check => verbs::check(host, &cfg, &req).await.map(|()| None),
                    _ => verbs::status(host, &cfg).await.map(|()| None),
                })
            };
            outcome.instrument(span(env, &cfg.pod.to_string())).await
        }
        Command::Del | Command::Gc => {
            let cfg = config::load_for_release(&input);
            init_logging(cfg.log_file.as_deref(), cfg.log_level);
            let req = request(env, cfg.flat_file.as_deref());
            let valid = match env.command {
                Command::Gc => Some(attachments::valid(stdin)?),
                _ => None,
            };
            let released = async {
                let released = match &valid {
                    Some(valid) => verbs::gc(host, &cfg, &req, valid).await,
                    None => verbs::del(host, &cfg, &req).await,
                };
                logged(released.map(|released| {
                    tracing::info!(released, "done");
                    None
                }))
            };
            released.instrument(span(env, &cfg.pod.to_string())).await
        }
    }
}

/// `outcome`, its failure logged with its code.
fn logged(outcome: Result<Option<String>, VerbError>) -> Result<Option<String>, CniError> {
    outcome.map_err(|e| {
        tracing::error!(code = e.code.number(), msg = e.code.message(), details = %e.details, "failed");
        CniError::new(e.code, e.details)
    })
}

fn span(env: &CniEnv, pod: &str) -> tracing::Span {
    tracing::info_span!(
        "cni",
        command = ?env.command,
        container_id = %env.container_id,
        ifname = %env.ifname,
        pod = %pod,
    )
}

fn request(env: &CniEnv, flat_file: Option<&Path>) -> Request {
    let node = crate::node::node_name(env.node.as_deref(), flat_file);
    Request { container_id: env.container_id.clone(), ifname: env.ifname.clone(), node }
}
