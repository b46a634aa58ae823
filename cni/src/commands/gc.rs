use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::config::IpamConfig;
use hereabouts_ipam::ipam::{self, Attachment};
use hereabouts_ipam::store::Store;

use crate::error::CniError;

const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";

/// The attachments the runtime still holds. A GC without the list is refused rather than read as "none are
/// valid", which would release every address of this node.
fn valid_attachments(stdin: &[u8]) -> Result<Vec<Attachment>, CniError> {
    let invalid = |details: String| CniError::new(7, "invalid network configuration", details);
    let doc: serde_json::Value =
        serde_json::from_slice(stdin).map_err(|e| CniError::new(6, "failed to decode", e.to_string()))?;
    let list = doc.get(VALID_ATTACHMENTS).ok_or_else(|| invalid(format!("{VALID_ATTACHMENTS} is required for GC")))?;
    serde_json::from_value(list.clone()).map_err(|e| invalid(format!("{VALID_ATTACHMENTS}: {e}")))
}

pub async fn run(store: &Store, cfg: &IpamConfig, node: &str, stdin: &[u8], budget: &Budget) -> Result<(), CniError> {
    let valid = valid_attachments(stdin)?;
    let released = ipam::gc(store, cfg, node, &valid, budget).await?;
    tracing::info!(released, valid = valid.len(), "GC done");
    Ok(())
}
