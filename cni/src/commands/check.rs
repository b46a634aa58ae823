use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::config::IpamConfig;
use hereabouts_ipam::ipam::{self, Request, Scope};
use hereabouts_ipam::store::Store;

use crate::error::CniError;

pub async fn run(store: &impl Store, cfg: &IpamConfig, req: &Request, budget: &Budget) -> Result<(), CniError> {
    Ok(ipam::check(store, &Scope::from(cfg), req, budget).await?)
}
