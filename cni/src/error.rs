//! CNI errors as the spec prints them: `{"cniVersion", "code", "msg", "details"}` on stdout.

use hereabouts_ipam::config::ConfigError;
use hereabouts_ipam::ipam::IpamError;
use serde_json::json;

/// A failed invocation: the spec's code (or ours from 100 up), a short message and the details.
#[derive(Debug)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self { code, msg: msg.into(), details: details.into() }
    }

    pub fn to_json(&self, cni_version: &str) -> String {
        json!({"cniVersion": cni_version, "code": self.code, "msg": self.msg, "details": self.details}).to_string()
    }
}

impl From<ConfigError> for CniError {
    fn from(e: ConfigError) -> Self {
        let msg = match e.code() {
            1 => "incompatible CNI version",
            2 => "unsupported field in network configuration",
            4 => "invalid environment or CNI_ARGS",
            6 => "failed to decode network configuration",
            _ => "invalid network configuration",
        };
        CniError::new(e.code(), msg, e.to_string())
    }
}

impl From<IpamError> for CniError {
    fn from(e: IpamError) -> Self {
        let msg = match &e {
            IpamError::Exhausted { .. } => "range exhausted",
            IpamError::RequestedTaken { .. } | IpamError::RequestedUnusable { .. } => "requested address taken",
            IpamError::Missing { .. } => "allocation missing",
            IpamError::Store(s) if s.is_transient() => "try again later",
            IpamError::Store(_) => "API server refused the request",
            IpamError::Expired(_) => "try again later",
        };
        CniError::new(e.code(), msg, e.to_string())
    }
}
