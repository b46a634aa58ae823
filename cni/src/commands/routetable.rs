//! The verbs with `"datastore": "routetable"`: no API server, the node's routing table and its routing daemon
//! (`hereabouts_ipam::routetable`).

use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::config::{IpamConfig, ReleaseConfig};
use hereabouts_ipam::ipam::Request;
use hereabouts_ipam::routetable::{self, KernelTable};

use crate::env::{CniEnv, Command};
use crate::error::CniError;
use crate::output;

/// ADD, CHECK and STATUS.
pub async fn strict(
    env: &CniEnv,
    cfg: &IpamConfig,
    req: &Request,
    budget: &Budget,
) -> Result<Option<String>, CniError> {
    let table = KernelTable::connect()?;
    match env.command {
        Command::Add => {
            let claimed = routetable::assign(&table, cfg, req, budget).await?;
            tracing::info!(
                ips = ?claimed.assigned.iter().map(|a| a.ip).collect::<Vec<_>>(),
                collisions = claimed.collisions,
                rounds = claimed.rounds,
                "ADD done"
            );
            Ok(Some(output::add_result(cfg, &claimed.assigned)))
        }
        Command::Check => routetable::check(&table, cfg, req).await.map(|()| None).map_err(Into::into),
        _ => {
            let routes = cfg.host_routes.as_ref().expect("the routing-table datastore has host routes");
            routetable::status(&table, routes, &cfg.name).await.map(|()| None).map_err(Into::into)
        }
    }
}

/// DEL and GC: the records of the attachment (or of those the runtime no longer lists) and their routes.
pub async fn release(
    cfg: &ReleaseConfig,
    req: &Request,
    valid: Option<&[hereabouts_ipam::ipam::Attachment]>,
) -> Result<usize, CniError> {
    let Some(routes) = &cfg.host_routes else { return Ok(0) };
    let table = KernelTable::connect()?;
    let released = match valid {
        // an ADD under way has its record before the runtime lists its attachment; none runs longer than its budget
        Some(valid) => routetable::gc(&table, routes, &cfg.name, valid, cfg.timeout).await?,
        None => routetable::release(&table, routes, &cfg.name, &req.container_id, &req.ifname).await?,
    };
    Ok(released)
}
