use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::config::IpamConfig;
use hereabouts_ipam::ipam::{self, Request, Scope};
use hereabouts_ipam::store::Store;

use crate::error::CniError;

pub async fn run(store: &impl Store, cfg: &IpamConfig, req: &Request, budget: &Budget) -> Result<(), CniError> {
    if cfg.provider.is_some() {
        return Ok(ipam::check_candidates(store, &Scope::from(cfg), &cfg.kept_ranges(), req, budget).await?);
    }
    Ok(ipam::check(store, &Scope::from(cfg), req, budget).await?)
}
