//! W1 (overlapping on), W4 (off), W1r and W1s (node slices): distinct pods over the nodes, `burst_parallel` at a
//! time.

use serde_json::{Value, json};

use super::Bench;
use crate::args::{Plugin, Variant};
use crate::invoke::{self, Op, Round};
use crate::results::RoundResult;

/// W1s's slices of W1's /22: 16 slices for 8 nodes, so every node has one and half stay free to claim.
pub const W1S_SLICE: &str = "/26";

impl Bench {
    pub async fn burst(
        &self,
        plugin: Plugin,
        round: usize,
        prefix: &str,
        range: &str,
        overlapping: bool,
        extra: Value,
    ) -> anyhow::Result<RoundResult> {
        let mut ipam = json!({"range": range, "enable_overlapping_ranges": overlapping});
        if let (Some(ipam), Some(extra)) = (ipam.as_object_mut(), extra.as_object()) {
            ipam.extend(extra.clone());
        }
        let r = self.round(plugin, prefix, ipam).await?;
        self.burst_in(&r, round).await
    }

    /// W1 in slice mode. Whereabouts' CNI never claims a slice, so its node-slice controller must have given
    /// every node one before the burst, as it would in a cluster.
    pub async fn burst_sliced(&self, variant: Variant, round: usize, range: &str) -> anyhow::Result<RoundResult> {
        let ipam = json!({"range": range, "enable_overlapping_ranges": true, "node_slice_size": W1S_SLICE});
        let mut r = self.round(variant.plugin(), "w1s", ipam).await?;
        if variant == Variant::HereaboutsAgent {
            let nodes: Vec<String> = (0..self.sizes.nodes).map(|i| format!("node-{i}")).collect();
            let agents =
                super::agents::Agents::start(&self.cluster.dir().join(format!("agents-{}", r.ns)), &nodes).await?;
            r.agents = Some(agents.dir.clone());
            let res = self.burst_in(&r, round).await;
            if let Some(mib) = agents.stop() {
                self.note(format!(
                    "W1s: the agents' peak resident memory, the largest of {}: {mib:.1} MiB",
                    nodes.len()
                ));
            }
            return res;
        }
        if variant != Variant::WhereaboutsFast {
            return self.burst_in(&r, round).await;
        }
        let nodes: Vec<String> = (0..self.sizes.nodes).map(|i| format!("node-{i}")).collect();
        let slices = self.whereabouts_slices(&r, range, W1S_SLICE, &nodes).await?;
        let res = self.burst_in(&r, round).await;
        slices.stop(&self.admin, &r.ns).await;
        res
    }

    async fn burst_in(&self, r: &Round, round: usize) -> anyhow::Result<RoundResult> {
        let ops: Vec<Op> = (0..self.sizes.burst_adds)
            .map(|i| Op::add(format!("r{round}-p{i}"), format!("node-{}", i % self.sizes.nodes)))
            .collect();
        let before = self.snapshot().await;
        let limits = self.limits();
        let outs = invoke::parallel(r, &ops, self.sizes.burst_parallel, limits).await;
        let wall = limits.t0.elapsed().as_secs_f64();
        self.finish(r, &outs, wall, &before, false).await
    }
}
