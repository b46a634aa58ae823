//! The CNI wire protocol's numbers in one place: the error codes (the spec's, and ours from 100 up as the spec
//! reserves them for plugins), the message that goes with each, and the spec versions this plugin speaks.

use std::fmt;

/// The `cniVersion`s this plugin speaks, oldest first.
pub const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest version this plugin speaks: what an error is reported in when the config's cannot be read.
pub const NEWEST_VERSION: &str = SUPPORTED_VERSIONS[SUPPORTED_VERSIONS.len() - 1];

/// A CNI error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// 1: incompatible CNI version.
    IncompatibleVersion,
    /// 2: unsupported field in the network configuration.
    UnsupportedField,
    /// 4: invalid necessary environment variables (`CNI_*`, `CNI_ARGS`).
    InvalidEnvironment,
    /// 5: I/O failure.
    Io,
    /// 6: failed to decode content.
    Decode,
    /// 7: invalid network configuration.
    InvalidConfig,
    /// 11: try again later (the API server is unreachable or overloaded).
    TryAgainLater,
    /// 50: the plugin is not available (STATUS).
    NotAvailable,
    /// 100: every usable address of a range is taken.
    RangeExhausted,
    /// 101: an exact address was requested that another pod holds, or that may not be handed out.
    RequestedAddressTaken,
    /// 102: CHECK found no allocation for the attachment.
    AllocationMissing,
    /// 103: the API server refused a request (forbidden, invalid, denied by a policy): not worth retrying as is.
    StoreRefused,
    /// 104: a pool object has reached the storage's size limit.
    PoolTooLarge,
    /// 105: the IaaS provider refused the request, or cannot be trusted (its certificate, its answer).
    ProviderRefused,
}

impl Code {
    /// The number on the wire.
    pub fn number(self) -> u32 {
        match self {
            Code::IncompatibleVersion => 1,
            Code::UnsupportedField => 2,
            Code::InvalidEnvironment => 4,
            Code::Io => 5,
            Code::Decode => 6,
            Code::InvalidConfig => 7,
            Code::TryAgainLater => 11,
            Code::NotAvailable => 50,
            Code::RangeExhausted => 100,
            Code::RequestedAddressTaken => 101,
            Code::AllocationMissing => 102,
            Code::StoreRefused => 103,
            Code::PoolTooLarge => 104,
            Code::ProviderRefused => 105,
        }
    }

    /// The short message (`msg`) that goes with the code.
    pub fn message(self) -> &'static str {
        match self {
            Code::IncompatibleVersion => "incompatible CNI version",
            Code::UnsupportedField => "unsupported field in network configuration",
            Code::InvalidEnvironment => "invalid environment or CNI_ARGS",
            Code::Io => "I/O failure",
            Code::Decode => "failed to decode network configuration",
            Code::InvalidConfig => "invalid network configuration",
            Code::TryAgainLater => "try again later",
            Code::NotAvailable => "plugin not available",
            Code::RangeExhausted => "range exhausted",
            Code::RequestedAddressTaken => "requested address taken",
            Code::AllocationMissing => "allocation missing",
            Code::StoreRefused => "API server refused the request",
            Code::PoolTooLarge => "pool object too large",
            Code::ProviderRefused => "IaaS provider refused the request",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.number())
    }
}

impl PartialEq<u32> for Code {
    fn eq(&self, other: &u32) -> bool {
        self.number() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_the_specs_and_ours_from_100() {
        assert_eq!(Code::IncompatibleVersion, 1);
        assert_eq!(Code::TryAgainLater, 11);
        assert_eq!(Code::NotAvailable, 50);
        assert_eq!(Code::PoolTooLarge, 104);
        assert_eq!(NEWEST_VERSION, "1.1.0");
    }
}
