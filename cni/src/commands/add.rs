use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::config::IpamConfig;
use hereabouts_ipam::ipam::{self, Request, Scope};
use hereabouts_ipam::routetable::{self, KernelTable};
use hereabouts_ipam::store::Store;

use crate::error::CniError;
use crate::output;

pub async fn run(store: &impl Store, cfg: &IpamConfig, req: &Request, budget: &Budget) -> Result<String, CniError> {
    let assigned = ipam::assign(store, cfg, req, budget).await?;
    if let Some(routes) = &cfg.host_routes {
        let pod = cfg.pod.to_string();
        let announced = match KernelTable::connect() {
            Ok(table) => routetable::announce(&table, routes, &cfg.name, req, &pod, &assigned).await,
            Err(e) => Err(e.into()),
        };
        if let Err(e) = announced {
            // an address a routing daemon cannot advertise is of no use to the pod: the ADD fails whole
            if let Err(back) = ipam::release(store, &Scope::from(cfg), req, budget).await {
                tracing::error!(error = %back, "roll-back of the allocation failed; the reconciler will release it");
            }
            return Err(e.into());
        }
    }
    Ok(output::add_result(cfg, &assigned))
}
