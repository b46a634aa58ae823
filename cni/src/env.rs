//! The CNI environment (`CNI_COMMAND`, `CNI_CONTAINERID`, ...), read once at start.

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

#[derive(Debug, Clone)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: String,
    pub ifname: String,
    pub args: String,
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn missing(name: &str, command: &str) -> CniError {
    CniError::new(4, "invalid environment variables", format!("{name} is required for {command}"))
}

impl CniEnv {
    pub fn from_process() -> Result<Self, CniError> {
        let command = match var("CNI_COMMAND").as_str() {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            "" => return Err(CniError::new(4, "invalid environment variables", "CNI_COMMAND is not set")),
            other => {
                return Err(CniError::new(
                    4,
                    "invalid environment variables",
                    format!("unknown CNI_COMMAND {other:?}"),
                ));
            }
        };
        let env =
            Self { command, container_id: var("CNI_CONTAINERID"), ifname: var("CNI_IFNAME"), args: var("CNI_ARGS") };
        if matches!(command, Command::Add | Command::Del | Command::Check) {
            let verb = var("CNI_COMMAND");
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

/// The node this invocation runs on: `NODENAME` if the runtime passes it, else the host name, which is the
/// kubelet's default node name.
pub fn node_name() -> String {
    let from_env = var("NODENAME");
    if !from_env.is_empty() {
        return from_env;
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_lowercase()).unwrap_or_default()
}
