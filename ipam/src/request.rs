//! What an invocation is about — one attachment of one pod on one node — and what an ADD hands out.

use std::net::IpAddr;

/// How long after its start an ADD may still write: its budget (`timeout_seconds`, at most
/// [`crate::config::MAX_TIMEOUT`]), the roll-back grace, and the API server's own timeout for a request still in
/// flight, with room to spare. A claim younger than this may belong to an ADD under way: GC leaves such entries
/// alone, and the reconciler's default orphan age is this.
pub const SETTLE_TIME: std::time::Duration = std::time::Duration::from_secs(300);

/// Who asks: one attachment of one pod, on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The node this invocation runs on.
    pub node: String,
}

/// One address handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// The address.
    pub ip: IpAddr,
    /// The prefix length of its range.
    pub prefix_len: u8,
    /// The configured gateway, if it lies in this range.
    pub gateway: Option<IpAddr>,
}

/// One attachment the runtime still holds, as listed in `cni.dev/valid-attachments` (GC).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Deserialize)]
pub struct Attachment {
    /// The container id.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name.
    pub ifname: String,
}
