//! ADD of a provider-backed range (IaaS provider mode): which free address to prefer, and the provider call that
//! places it on this node when its sub-interface is not cached (or warm) here. A failed or timed-out call fails
//! the ADD, and the claim's journal rolls back the entry and reservation it claimed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::placement::{self, Mode, Pick, SubInterface};
use super::{AllocateRequest, ProviderClient, ProviderConfig, ProviderError, SubEniRequest};
use crate::budget::Budget;
use crate::config::IpamConfig;
use crate::crd::{IpPool, SubInterfaceRecord};
use crate::error::IpamError;
use crate::range::IpRange;
use crate::store::{Failure, Patched, StoreError, SubInterfaceStore};

/// A provider-backed ADD's client and identity.
pub(super) struct Placer<'a> {
    client: ProviderClient,
    parent_interface: &'a str,
    cfg: &'a IpamConfig,
    node: &'a str,
}

/// The address a placement is for: `offset` of `range`, whose pool is `pool` as read after the claim; in a
/// dual-stack pair, the IPv6 address (and its pool's name) the sub-interface carries with it.
#[derive(Debug, Clone, Copy)]
pub(super) struct At<'p> {
    pub pool: &'p IpPool,
    pub range: &'p IpRange,
    pub offset: u128,
    pub paired: Option<(IpAddr, &'p str)>,
}

/// What placing an address came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placed {
    /// Its sub-interface was cached on this node: no provider call.
    Cached,
    /// The provider created or moved it here.
    Called,
}

impl<'a> Placer<'a> {
    /// The placer of `provider` for the ADD of `cfg` on `node`: the provider's CA and certificates are read here,
    /// before anything is written.
    pub(super) fn new(cfg: &'a IpamConfig, provider: &'a ProviderConfig, node: &'a str) -> Result<Self, IpamError> {
        let client = ProviderClient::new(provider)?;
        Ok(Self { client, parent_interface: &provider.parent_interface, cfg, node })
    }

    /// The node it places on.
    pub(super) fn node(&self) -> &str {
        self.node
    }

    /// The offsets an ADD in `pool` must not take (sub-interfaces the provider is unbinding), and the free one it
    /// should: in a global pool a sub-interface cached on this node, else an address with none, else another
    /// node's idle one; in a node-warm pool a warm one on this node, or none.
    pub(super) fn prefer(
        &self,
        mode: &Mode,
        pool: &IpPool,
        range: &IpRange,
        excluded: &BTreeSet<u128>,
    ) -> (Vec<u128>, Option<u128>) {
        let subs = sub_interfaces(pool);
        let unbinding: Vec<u128> = subs.iter().filter(|(_, s)| s.unbinding()).map(|(o, _)| *o).collect();
        let taken: BTreeSet<u128> = pool.spec.allocations.keys().filter_map(|k| k.parse().ok()).collect();
        let free_here = |o: &u128| !taken.contains(o) && !excluded.contains(o) && range.is_usable(*o);
        let mut free: Vec<u128> = subs.keys().copied().filter(free_here).collect();
        // the lowest free address with no sub-interface: every offset skipped on the way is in one of the sets
        let fresh = range.usable_intervals().flatten().find(|o| free_here(o) && !subs.contains_key(o));
        free.extend(fresh);
        free.sort_unstable();
        let pick = placement::pick(mode, self.node, &free, &subs);
        (unbinding, pick.as_ref().map(Pick::offset))
    }

    /// Makes sure the sub-interface of the address at `offset` of `pool` (as read, now held by this ADD) is on
    /// this node: nothing to do when it is cached (or warm) here, else a provider call within `budget`, recorded
    /// in the pool. A node-warm pool never calls the provider: an address of it that is not warm here is an error.
    /// With `paired` (an IPv6 address and its pool's name, also held by this ADD) the sub-interface carries both;
    /// a cached one only if it already pairs that address.
    pub(super) async fn place(
        &self,
        store: &impl SubInterfaceStore,
        mode: &Mode,
        at: &At<'_>,
        budget: &Budget,
    ) -> Result<Placed, IpamError> {
        let At { pool, range, offset, paired } = *at;
        let pool_name = pool.metadata.name.as_deref().unwrap_or_default();
        let subs = sub_interfaces(pool);
        let pairs = |s: &SubInterface| paired.is_none_or(|(ip, _)| s.paired == Some(ip));
        if subs.get(&offset).is_some_and(|s| s.node == self.node && !s.unbinding() && pairs(s)) {
            tracing::info!(pool = %pool_name, offset, "sub-interface cached on this node: no provider call");
            return Ok(Placed::Cached);
        }
        if let Mode::NodeWarm { .. } = mode {
            return Err(IpamError::NoWarmAddress { pool: pool_name.to_string(), node: self.node.to_string() });
        }
        let ip = range.addr_at(offset);
        let parent_nic_mac = parent_mac(self.parent_interface)?;
        let mut want = SubEniRequest {
            parent_nic_mac: parent_nic_mac.clone(),
            subnet: range.cidr().trunc().to_string(),
            ..SubEniRequest::default()
        };
        if ip.is_ipv4() {
            want.ipv4_address = ip.to_string();
            want.ipv4_pool_name = pool_name.to_string();
        } else {
            want.ipv6_address = ip.to_string();
            want.ipv6_pool_name = pool_name.to_string();
        }
        if let Some((v6, v6_pool)) = paired {
            want.ipv6_address = v6.to_string();
            want.ipv6_pool_name = v6_pool.to_string();
        }
        let request = AllocateRequest {
            pod_name: self.cfg.pod.name.clone(),
            pod_namespace: self.cfg.pod.namespace.clone(),
            pod_uid: self.cfg.pod.uid.clone().unwrap_or_default(),
            node_name: self.node.to_string(),
            sub_eni_requests: vec![want],
        };
        let answer = self.client.allocate(&request, budget).await?;
        let made = answer.sub_eni_responses.first();
        // the seed's merge: an empty macAddress or vlanId keeps what the record already had (a moved one)
        let before = pool.spec.sub_interfaces.get(&offset.to_string());
        let record = SubInterfaceRecord {
            node: self.node.to_string(),
            mac: made
                .map(|m| m.mac_address.clone())
                .filter(|m| !m.is_empty())
                .or_else(|| before.map(|r| r.mac.clone()))
                .unwrap_or_default(),
            vlan: made.and_then(|m| m.vlan_id).or_else(|| before.map(|r| r.vlan)).unwrap_or_default(),
            parent_nic_mac,
            paired_address: paired.map(|(v6, _)| v6.to_string()),
        };
        // The sub-interface exists now, and only the record says where: without it the address looks fresh (the
        // next ADD elsewhere asks the provider to create it again) and the leader cannot release it when the node
        // goes. So the write (a merge patch, the same whatever the retries) is retried within the budget — a 403
        // too: this ADD's claim, a patch of the same pool, was just allowed, so a refusal now is an authorizer
        // that is not ready (a restarted API server answers 403 until its RBAC caches fill). Only a record that
        // still cannot be written is given up, with the ADD kept, since the pod holds the address.
        let again = |e: &StoreError| e.is_transient() || e.failure == Failure::Refused(403);
        let written = budget.retry(again, || store.set_sub_interface(pool_name, offset, &record)).await;
        match written {
            Ok(Patched::Applied) => {}
            Ok(other) => tracing::warn!(pool = %pool_name, offset, ?other, "sub-interface not recorded"),
            Err(e) => tracing::warn!(pool = %pool_name, offset, error = ?e, "sub-interface not recorded"),
        }
        tracing::info!(pool = %pool_name, %ip, mac = %record.mac, vlan = record.vlan, "provider placed the sub-interface");
        Ok(Placed::Called)
    }
}

/// The pool's sub-interface records by offset (records whose key is not an offset are passed over).
fn sub_interfaces(pool: &IpPool) -> BTreeMap<u128, SubInterface> {
    pool.spec
        .sub_interfaces
        .iter()
        .filter_map(|(k, r)| {
            let paired = r.paired_address.as_deref().and_then(|a| a.parse().ok());
            Some((k.parse().ok()?, SubInterface { node: r.node.clone(), mac: r.mac.clone(), vlan: r.vlan, paired }))
        })
        .collect()
}

/// The MAC of the host interface `name` (the plugin runs in the host's network namespace).
fn parent_mac(name: &str) -> Result<String, ProviderError> {
    let path = format!("/sys/class/net/{name}/address");
    std::fs::read_to_string(&path)
        .map(|mac| mac.trim().to_string())
        .map_err(|e| ProviderError::Files(format!("parent_interface {name}: read {path}: {e}")))
}
