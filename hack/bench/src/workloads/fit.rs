//! Fit: 64 nodes share a /22 (issue 28's shape). Fixed /26 slices are 16: hereabouts' other 48 nodes borrow from
//! them, Whereabouts' fast IPAM has no slice for them at all; adaptive slices (`min_node_slice_size: /28`) give
//! every node a /28 of its own. Each node ADDs 15 pods (960 in all, 94 % of the range), `burst_parallel` at a time.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use hereabouts_ipam::crd::NodeSlicePool;
use ipnet::IpNet;
use kube::api::Api;
use serde_json::json;

use super::Bench;
use super::nodeslice::NODE_SLICES;
use crate::args::Plugin;
use crate::invoke::{self, Op};
use crate::k8s::{create_node_slice_pool, retry, slices};
use crate::results::RoundResult;

pub const FIT_RANGE: &str = "198.18.0.0/22";
pub const FIT_NODES: usize = 64;
pub const FIT_PER_NODE: usize = 15;
pub const FIT_SLICE: &str = "/26";
pub const FIT_MIN_SLICE: &str = "/28";

/// One way of slicing the /22.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitVariant {
    /// hereabouts, fixed /26 slices (claimed on demand, borrowed from once none is free).
    Fixed,
    /// hereabouts, adaptive slices: /28 first, up to /26.
    Adaptive,
    /// Whereabouts' fast IPAM, fixed /26 slices as its controller assigns them (16 nodes of 64 get one).
    WhereaboutsFast,
}

impl FitVariant {
    pub const ALL: [FitVariant; 3] = [FitVariant::Fixed, FitVariant::Adaptive, FitVariant::WhereaboutsFast];

    pub fn label(self) -> &'static str {
        match self {
            FitVariant::Fixed => "Hs /26",
            FitVariant::Adaptive => "Hs /28→/26",
            FitVariant::WhereaboutsFast => "Wf /26",
        }
    }
}

#[derive(Debug, Clone)]
pub struct FitRound {
    pub variant: FitVariant,
    pub res: RoundResult,
    /// Nodes that own a slice once the burst is over.
    pub owners: usize,
    /// Slices listed in the NodeSlicePool.
    pub slices: usize,
    /// Successful ADDs whose address is in another node's slice.
    pub borrowed: usize,
}

impl Bench {
    pub async fn fit(&self, variant: FitVariant) -> anyhow::Result<FitRound> {
        let mut ipam = json!({"range": FIT_RANGE, "enable_overlapping_ranges": true, "node_slice_size": FIT_SLICE});
        if variant == FitVariant::Adaptive {
            ipam["min_node_slice_size"] = json!(FIT_MIN_SLICE);
        }
        let plugin = if variant == FitVariant::WhereaboutsFast { Plugin::Whereabouts } else { Plugin::Hereabouts };
        let r = self.round(plugin, "fit", ipam).await?;
        let nodes: Vec<String> = (0..FIT_NODES).map(|i| format!("node-{i:02}")).collect();
        if variant == FitVariant::WhereaboutsFast {
            // Whereabouts' controller gives the 16 slices to the first 16 nodes in name order and has none for the
            // rest; it waits for every node to be listed, which never happens here, so the bench writes what it
            // would have written
            self.note(format!(
                "fit Wf: the NodeSlicePool written as Whereabouts' node-slice controller assigns it ({} /26 slices, \
                 lowest-free to the first nodes in name order; the other nodes get none)",
                slices(FIT_RANGE, 26)?.len()
            ));
            let owners: BTreeMap<String, String> = slices(FIT_RANGE, 26)?.into_iter().zip(nodes.clone()).collect();
            create_node_slice_pool(&self.admin, &r.ns, NODE_SLICES, FIT_RANGE, FIT_SLICE, &owners).await?;
        }
        let ops: Vec<Op> =
            (0..FIT_NODES * FIT_PER_NODE).map(|i| Op::add(format!("fit-{i}"), nodes[i % FIT_NODES].clone())).collect();
        let node_of: BTreeMap<String, String> = ops.iter().map(|o| (o.pod.clone(), o.node.clone())).collect();
        let before = self.snapshot().await;
        let mut limits = self.limits();
        limits.deadline += Duration::from_millis(100 * ops.len() as u64);
        let outs = invoke::parallel(&r, &ops, self.sizes.burst_parallel, limits).await;
        let wall = limits.t0.elapsed().as_secs_f64();
        let res = self.finish(&r, &outs, wall, &before, false).await?;
        let api = Api::<NodeSlicePool>::namespaced(self.admin.clone(), &r.ns);
        let listed = retry(|| api.get(NODE_SLICES)).await?.status.map(|s| s.allocations).unwrap_or_default();
        let owned: Vec<(IpNet, &str)> = listed
            .iter()
            .filter(|a| !a.node_name.is_empty())
            .filter_map(|a| Some((a.slice_range.parse().ok()?, a.node_name.as_str())))
            .collect();
        let owners: std::collections::BTreeSet<&str> = owned.iter().map(|(_, n)| *n).collect();
        let borrowed = outs
            .iter()
            .filter_map(|o| Some((IpAddr::V4(o.ip?), node_of.get(&o.pod)?)))
            .filter(|(ip, node)| owned.iter().find(|(c, _)| c.contains(ip)).is_none_or(|(_, owner)| owner != node))
            .count();
        Ok(FitRound { variant, res, owners: owners.len(), slices: listed.len(), borrowed })
    }
}
