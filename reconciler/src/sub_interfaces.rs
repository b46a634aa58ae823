//! The leader's release of cloud sub-interfaces cached on Nodes that are gone (IaaS provider mode, docs/provider.md).
//!
//! A pod's DEL gives its address back to the pool but leaves the sub-interface cached on its node for the next
//! pod there. When the node itself is gone, nothing will use that cache again: the leader asks the provider to
//! release the sub-interface, then drops its record. While the provider is asked, the pool *holds* the address
//! with an entry of its own, so no ADD can take it (and have the provider move it) while the cloud may be
//! deleting it: the provider's release comes before the pool's. A failed release keeps the hold, and the next
//! pass tries again (the provider's release is idempotent), as does a leader that died half-way.

use std::collections::BTreeSet;
use std::time::Duration;

use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::crd::{IpAllocation, IpPool, SubInterfaceRecord};
use hereabouts_ipam::provider::{HOLD_ID, HOLD_PODREF, ProviderClient, ReleaseRequest, hold_entry};
use hereabouts_ipam::range::IpRange;
use hereabouts_ipam::store::{AsRead, Patched, Store, StoreError};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use tokio_util::sync::CancellationToken;

use crate::leader::Leadership;

fn is_hold(entry: &IpAllocation) -> bool {
    entry.id == HOLD_ID && entry.podref == HOLD_PODREF
}

/// What to do with one address of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Its sub-interface is on a gone node and nothing holds the address: hold it, then release.
    HoldAndRelease { offset: u128, record: SubInterfaceRecord },
    /// Held already by an earlier pass: release (again) and finish.
    Release { offset: u128, record: SubInterfaceRecord },
    /// A hold whose record is gone already (a pass died after dropping it): drop the hold.
    DropHold { offset: u128 },
}

/// The steps for `pool` given the Nodes that exist. A record on a live node, or whose address a pod holds (the
/// sweep releases that first, by the usual rules), is left alone.
pub fn steps(pool: &IpPool, nodes: &BTreeSet<String>) -> Vec<Step> {
    let mut steps = Vec::new();
    for (key, record) in &pool.spec.sub_interfaces {
        let Ok(offset) = key.parse::<u128>() else { continue };
        if record.node.is_empty() || nodes.contains(&record.node) {
            continue;
        }
        match pool.spec.allocations.get(key) {
            None => steps.push(Step::HoldAndRelease { offset, record: record.clone() }),
            Some(entry) if is_hold(entry) => steps.push(Step::Release { offset, record: record.clone() }),
            Some(_) => {}
        }
    }
    for (key, entry) in &pool.spec.allocations {
        if is_hold(entry)
            && !pool.spec.sub_interfaces.contains_key(key)
            && let Ok(offset) = key.parse()
        {
            steps.push(Step::DropHold { offset });
        }
    }
    steps
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    pub released: usize,
    pub failed: usize,
}

/// The leader's provider client and store.
#[derive(Debug)]
pub struct SubInterfaceKeeper<S> {
    pub store: S,
    pub provider: ProviderClient,
    /// One release call's budget (the provider's `http_request_timeout` bounds it too).
    pub call_budget: Duration,
}

impl<S: Store> SubInterfaceKeeper<S> {
    /// One pass over every pool of the namespace, given the Nodes that exist.
    pub async fn pass(&self, nodes: &BTreeSet<String>) -> Result<Released, PassError> {
        let pools = self.store.list_pools().await.map_err(PassError::Pools)?;
        let mut done = Released::default();
        for pool in pools.iter().filter(|p| !p.spec.sub_interfaces.is_empty() || has_hold(p)) {
            let name = pool.metadata.name.clone().unwrap_or_default();
            let range = match IpRange::parse(&pool.spec.range, None, None, &[]) {
                Ok(range) => range,
                Err(e) => {
                    done.failed += 1;
                    tracing::warn!(pool = %name, range = %pool.spec.range, error = %e, "pool range unreadable");
                    continue;
                }
            };
            for step in steps(pool, nodes) {
                match self.take(&name, &range, step).await {
                    Ok(true) => done.released += 1,
                    Ok(false) => {}
                    Err(e) => {
                        done.failed += 1;
                        tracing::warn!(pool = %name, error = %crate::error_chain(&*e), "sub-interface release failed; next pass retries");
                    }
                }
            }
        }
        Ok(done)
    }

    async fn take(
        &self,
        pool_name: &str,
        range: &IpRange,
        step: Step,
    ) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        let (offset, record) = match step {
            Step::DropHold { offset } => {
                self.store.remove_allocation(pool_name, offset, &hold_entry(), None).await?;
                return Ok(false);
            }
            Step::Release { offset, record } => (offset, record),
            Step::HoldAndRelease { offset, record } => {
                match self.store.add_allocation(pool_name, offset, &hold_entry(), &AsRead::default()).await {
                    Ok(Patched::Applied) => {}
                    Ok(other) => {
                        tracing::debug!(pool = %pool_name, offset, ?other, "taken meanwhile: left to its holder");
                        return Ok(false);
                    }
                    // an answer lost after the hold was applied: the next pass finds the hold and goes on
                    Err(e) => return Err(Box::new(e)),
                }
                (offset, record)
            }
        };
        let ip = range.checked_addr_at(offset).ok_or_else(|| format!("offset {offset} is outside {}", range.cidr()))?;
        // Once per sub-interface, by its IPv4 address (the pool's, when it is an IPv4 pool), else its IPv6.
        let request = ReleaseRequest {
            node_name: record.node.clone(),
            parent_nic_mac: record.parent_nic_mac.clone(),
            subnet: range.cidr().trunc().to_string(),
            ip_address: ip.to_string(),
            pool_name: pool_name.to_string(),
            ..ReleaseRequest::default()
        };
        self.provider.release(&request, &Budget::new(self.call_budget)).await?;
        tracing::info!(pool = %pool_name, %ip, node = %record.node, "provider released the sub-interface of a gone node");
        match self.store.remove_sub_interface(pool_name, offset, &record.node).await? {
            Patched::Applied | Patched::Missing => {}
            other => tracing::info!(pool = %pool_name, %ip, ?other, "sub-interface record changed meanwhile"),
        }
        self.store.remove_allocation(pool_name, offset, &hold_entry(), None).await?;
        Ok(true)
    }
}

fn has_hold(pool: &IpPool) -> bool {
    pool.spec.allocations.values().any(is_hold)
}

/// Why a pass could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("node list failed")]
    Nodes(#[source] kube::Error),
    #[error("pool list failed")]
    Pools(#[source] StoreError),
}

async fn node_names(nodes: &Api<Node>) -> Result<BTreeSet<String>, PassError> {
    let listed = nodes.list_metadata(&ListParams::default()).await.map_err(PassError::Nodes)?;
    Ok(listed.items.into_iter().filter_map(|n| n.metadata.name).collect())
}

/// Makes a pass every `every` while this instance leads, until `shutdown`.
pub async fn run<S: Store>(
    keeper: SubInterfaceKeeper<S>,
    nodes: Api<Node>,
    leadership: Leadership,
    every: Duration,
    shutdown: CancellationToken,
) {
    while leadership.next_turn(every, &shutdown).await {
        let passed = match node_names(&nodes).await {
            Ok(names) => keeper.pass(&names).await,
            Err(e) => Err(e),
        };
        match passed {
            Ok(done) if done != Released::default() => {
                tracing::info!(released = done.released, failed = done.failed, "sub-interfaces of gone nodes")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %crate::error_chain(&e), "sub-interface pass failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(records: &[(&str, &str)], entries: &[(&str, IpAllocation)]) -> IpPool {
        let mut p = hereabouts_ipam::store::NewPool::new("p", "198.18.0.0/24", 254).object();
        for (offset, node) in records {
            let record = SubInterfaceRecord { node: node.to_string(), ..SubInterfaceRecord::default() };
            p.spec.sub_interfaces.insert(offset.to_string(), record);
        }
        for (offset, entry) in entries {
            p.spec.allocations.insert(offset.to_string(), entry.clone());
        }
        p
    }

    fn pod_entry() -> IpAllocation {
        IpAllocation { id: "c1".into(), podref: "ns/pod".into(), ..IpAllocation::default() }
    }

    #[test]
    fn only_idle_sub_interfaces_of_gone_nodes_are_released() {
        let nodes: BTreeSet<String> = ["alive".to_string()].into();
        let p = pool(
            &[("1", "alive"), ("2", "gone"), ("3", "gone"), ("4", "gone"), ("5", "")],
            &[("3", pod_entry()), ("4", hold_entry()), ("6", hold_entry())],
        );
        let record = |node: &str| SubInterfaceRecord { node: node.into(), ..SubInterfaceRecord::default() };
        assert_eq!(
            steps(&p, &nodes),
            vec![
                Step::HoldAndRelease { offset: 2, record: record("gone") },
                Step::Release { offset: 4, record: record("gone") },
                Step::DropHold { offset: 6 },
            ]
        );
    }

    #[test]
    fn a_hold_is_never_judged_as_a_pod() {
        assert!(hereabouts_ipam::reconcile::rules::podref_parts(HOLD_PODREF).is_none());
    }
}
