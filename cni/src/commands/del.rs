use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::config::ReleaseConfig;
use hereabouts_ipam::ipam::{self, Request, Scope};
use hereabouts_ipam::store::Store;

use crate::error::CniError;

pub async fn run(store: &impl Store, cfg: &ReleaseConfig, req: &Request, budget: &Budget) -> Result<(), CniError> {
    let released = ipam::release(store, &Scope::from(cfg), req, budget).await?;
    tracing::info!(released, "DEL done");
    Ok(())
}
