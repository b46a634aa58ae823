use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::codes::Code;
use hereabouts_ipam::config::ReleaseConfig;
use hereabouts_ipam::ipam::{self, Attachment, Scope};
use hereabouts_ipam::store::Store;

use crate::error::CniError;

const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";

/// The attachments the runtime still holds. A GC without the list is refused rather than read as "none are
/// valid", which would release every address of this node.
pub fn valid_attachments(stdin: &[u8]) -> Result<Vec<Attachment>, CniError> {
    let invalid = |details: String| CniError::new(Code::InvalidConfig, details);
    let doc: serde_json::Value =
        serde_json::from_slice(stdin).map_err(|e| CniError::new(Code::Decode, e.to_string()))?;
    let list = doc.get(VALID_ATTACHMENTS).ok_or_else(|| invalid(format!("{VALID_ATTACHMENTS} is required for GC")))?;
    serde_json::from_value(list.clone()).map_err(|e| invalid(format!("{VALID_ATTACHMENTS}: {e}")))
}

pub async fn run(
    store: &impl Store,
    cfg: &ReleaseConfig,
    node: &str,
    valid: &[Attachment],
    budget: &Budget,
) -> Result<(), CniError> {
    let released = ipam::gc(store, &Scope::from(cfg), node, valid, budget).await?;
    tracing::info!(released, valid = valid.len(), "GC done");
    Ok(())
}
