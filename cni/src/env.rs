//! The CNI environment (`CNI_COMMAND`, `CNI_CONTAINERID`, ...), read once at start.

use hereabouts_ipam::codes::Code;

use crate::error::CniError;

/// The CNI verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

/// What the runtime put in the environment.
#[derive(Debug, Clone)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: String,
    pub ifname: String,
    pub args: String,
    /// `NODENAME`, if the runtime passes it; the node's name is settled once the config names the flat file
    /// ([`crate::node::node_name`]).
    pub node: Option<String>,
}

fn missing(name: &str, command: &str) -> CniError {
    CniError::new(Code::InvalidEnvironment, format!("{name} is required for {command}"))
}

impl CniEnv {
    /// Reads the process's environment.
    pub fn from_process() -> Result<Self, CniError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the environment through `var` (tests pass their own).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, CniError> {
        let get = |name: &str| var(name).unwrap_or_default();
        let verb = get("CNI_COMMAND");
        let command = match verb.as_str() {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            "" => return Err(CniError::new(Code::InvalidEnvironment, "CNI_COMMAND is not set")),
            other => return Err(CniError::new(Code::InvalidEnvironment, format!("unknown CNI_COMMAND {other:?}"))),
        };
        let node = Some(get("NODENAME")).filter(|n| !n.trim().is_empty());
        let env = Self {
            command,
            container_id: get("CNI_CONTAINERID"),
            ifname: get("CNI_IFNAME"),
            args: get("CNI_ARGS"),
            node,
        };
        if matches!(command, Command::Add | Command::Del | Command::Check) {
            if env.container_id.is_empty() {
                return Err(missing("CNI_CONTAINERID", &verb));
            }
            if env.ifname.is_empty() {
                return Err(missing("CNI_IFNAME", &verb));
            }
        }
        Ok(env)
    }
}
