//! CNI errors as the spec prints them: `{"cniVersion", "code", "msg", "details"}` on stdout. The numbers and
//! messages are `hereabouts_ipam::codes`'.

use hereabouts_ipam::codes::Code;
use hereabouts_ipam::config::ConfigError;
use serde_json::json;

/// A failed invocation: its code and what went wrong.
#[derive(Debug)]
pub struct CniError {
    pub code: Code,
    pub details: String,
}

impl CniError {
    /// An error of `code` with `details`.
    pub fn new(code: Code, details: impl Into<String>) -> Self {
        Self { code, details: details.into() }
    }

    /// The short message of the code.
    pub fn msg(&self) -> &'static str {
        self.code.message()
    }

    /// The error as the spec prints it, in `cni_version`'s layout.
    pub fn to_json(&self, cni_version: &str) -> String {
        json!({"cniVersion": cni_version, "code": self.code.number(), "msg": self.msg(), "details": self.details})
            .to_string()
    }
}

impl From<ConfigError> for CniError {
    fn from(e: ConfigError) -> Self {
        CniError::new(e.code(), e.to_string())
    }
}
