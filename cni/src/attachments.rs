//! GC's list of the attachments the runtime still holds (`cni.dev/valid-attachments`).

use hereabouts_ipam::Attachment;
use hereabouts_ipam::codes::Code;

use crate::error::CniError;

const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";

/// The attachments the runtime still holds. A GC without the list is refused rather than read as "none are
/// valid", which would release every address of this node.
pub fn valid(stdin: &[u8]) -> Result<Vec<Attachment>, CniError> {
    let invalid = |details: String| CniError::new(Code::InvalidConfig, details);
    let doc: serde_json::Value =
        serde_json::from_slice(stdin).map_err(|e| CniError::new(Code::Decode, e.to_string()))?;
    let list = doc.get(VALID_ATTACHMENTS).ok_or_else(|| invalid(format!("{VALID_ATTACHMENTS} is required for GC")))?;
    serde_json::from_value(list.clone()).map_err(|e| invalid(format!("{VALID_ATTACHMENTS}: {e}")))
}
