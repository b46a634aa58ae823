//! `hereabouts`, the CNI IPAM plugin, as a library: the binary is [`dispatch`] over the process's environment and
//! stdin, and tests drive the same path with environments, configs and hosts of their own.

pub mod agent;
pub mod attachments;
pub mod commands;
pub mod env;
pub mod error;
mod logging;
pub mod node;
pub mod output;

pub use commands::dispatch;
pub use env::CniEnv;
pub use error::CniError;

/// Starts logging to `log_file` (else stderr) at `level`: what the binary passes to [`dispatch`].
pub fn init_logging(log_file: Option<&std::path::Path>, level: hereabouts_ipam::config::LogLevel) {
    logging::init(log_file, level);
}
