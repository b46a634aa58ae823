use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::config::IpamConfig;
use hereabouts_ipam::ipam::{self, Request};
use hereabouts_ipam::store::Store;

use crate::error::CniError;
use crate::output;

pub async fn run(store: &impl Store, cfg: &IpamConfig, req: &Request, budget: &Budget) -> Result<String, CniError> {
    let assigned = ipam::assign(store, cfg, req, budget).await?;
    Ok(output::add_result(cfg, &assigned))
}
