//! `hereabouts`, the CNI IPAM plugin, as a library: the binary is [`run`] over the process's environment and
//! stdin, and tests drive the same path with environments, configs and stores of their own.

pub mod commands;
pub mod env;
pub mod error;
pub mod lock;
mod logging;
pub mod node;
pub mod output;

pub use commands::{Connector, LiveConnector, dispatch};
pub use env::CniEnv;
pub use error::CniError;
