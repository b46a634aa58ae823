//! Why a configuration is refused, with the CNI error code that goes with it.

use std::fmt;
use std::path::PathBuf;

use crate::codes::Code;
use crate::range::RangeError;

use super::SUPPORTED_CNI_VERSIONS;

/// Why a configuration is refused. Every message names the key it is about, e.g.
/// `ipam.ipRanges[1].range_start: 10.1.0.5 is outside 10.0.0.0/24`; [`ConfigError::code`] is the CNI error code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `cniVersion` is missing or not one this plugin speaks (code 1).
    #[error("cniVersion: {} (supported: {})", found_version(.found), SUPPORTED_CNI_VERSIONS.join(", "))]
    UnsupportedVersion {
        /// The version asked for, `None` when the key is missing.
        found: Option<String>,
    },
    /// Keys this plugin does not know, in the `ipam` object, one of its nested objects or the flat file (code 2).
    #[error("{}", join_unknown(.0))]
    UnknownKeys(Vec<UnknownKey>),
    /// A malformed or unknown `CNI_ARGS` pair, or a pod reference missing for ADD (code 4).
    #[error("CNI_ARGS: {0}")]
    CniArgs(String),
    /// The flat file exists but cannot be read (code 5).
    #[error("{key}: cannot read {}: {source}", .path.display())]
    Io {
        /// The key or file the path comes from.
        key: String,
        /// The file.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// Stdin or the flat file is not JSON (code 6).
    #[error("{key}: not valid JSON: {source}")]
    NotJson {
        /// `stdin` or the flat file.
        key: String,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
    /// A value of the wrong JSON type (code 6).
    #[error("{key}: expected {expected}, found {found}")]
    WrongType {
        /// The key, e.g. `ipam.ipRanges[0].exclude[2]`.
        key: String,
        /// What the key takes.
        expected: &'static str,
        /// What it was given.
        found: &'static str,
    },
    /// A value of the right type that makes no sense (code 7).
    #[error("{key}: {reason}")]
    Invalid {
        /// The key, e.g. `ipam.gateway`.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A range refused by [`crate::range::IpRange::parse`] (code 7).
    #[error("{key}: {source}")]
    Range {
        /// The key of the range entry: `ipam.range` or `ipam.ipRanges[N]`.
        key: String,
        /// Why the range is refused.
        #[source]
        source: RangeError,
    },
}

impl ConfigError {
    /// The CNI error code of this error.
    pub fn code(&self) -> Code {
        match self {
            Self::UnsupportedVersion { .. } => Code::IncompatibleVersion,
            Self::UnknownKeys(_) => Code::UnsupportedField,
            Self::CniArgs(_) => Code::InvalidEnvironment,
            Self::Io { .. } => Code::Io,
            Self::NotJson { .. } | Self::WrongType { .. } => Code::Decode,
            Self::Invalid { .. } | Self::Range { .. } => Code::InvalidConfig,
        }
    }

    pub(super) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid { key: key.into(), reason: reason.into() }
    }
}

/// One key that is not known where it was found, with the key probably meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    /// The full key, e.g. `ipam.rangeStart`.
    pub key: String,
    /// A hint such as `did you mean "range_start"?`.
    pub hint: Option<String>,
}

impl fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: unknown key", self.key)?;
        match &self.hint {
            Some(hint) => write!(f, " ({hint})"),
            None => Ok(()),
        }
    }
}

fn found_version(found: &Option<String>) -> String {
    match found {
        Some(v) => format!("{v:?} is not supported"),
        None => "missing (the CNI spec treats that as 0.1.0)".to_string(),
    }
}

fn join_unknown(keys: &[UnknownKey]) -> String {
    keys.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}
