use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::config::IpamConfig;
use hereabouts_ipam::ipam::{self, Request};
use hereabouts_ipam::store::Store;

use crate::error::CniError;

pub async fn run(store: &Store, cfg: &IpamConfig, req: &Request, budget: &Budget) -> Result<(), CniError> {
    let released = ipam::release(store, cfg, req, budget).await?;
    tracing::info!(released, "DEL done");
    Ok(())
}
