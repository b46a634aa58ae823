//! W1 (overlapping on), W4 (off), W1r and W1s (node slices): distinct pods over the nodes, `burst_parallel` at a
//! time.

use serde_json::{Value, json};

use super::Bench;
use super::warm::WarmBurst;
use crate::args::{Plugin, Variant};
use crate::invoke::{self, Op, Round};
use crate::results::RoundResult;

/// W1s's slices of W1's /22: 16 slices for 8 nodes, so every node has one and half stay free to claim.
pub const W1S_SLICE: &str = "/26";

/// How many W1s slices there are.
const W1S_SLICES: usize = 16;

/// W1s's warm reserve per node: above each node's share of the burst (200 ADDs over 8 nodes: 25), and one /26
/// slice holds it beside that share and the node's first ADD once it is refilled (1 + 25 + 32 of 62).
pub const W1S_WARM: usize = 32;

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
        let mut ipam = json!({"range": range, "enable_overlapping_ranges": true, "node_slice_size": W1S_SLICE});
        if variant == Variant::HereaboutsWarm {
            ipam["warm_addresses"] = json!(W1S_WARM);
        }
        let mut r = self.round(variant.plugin(), "w1s", ipam).await?;
        if variant == Variant::HereaboutsWarm {
            let nodes: Vec<String> = (0..self.sizes.nodes).map(|i| format!("node-{i}")).collect();
            let share = self.sizes.burst_adds.div_ceil(self.sizes.nodes);
            if share > W1S_WARM {
                self.note(format!(
                    "W1s warm: a node's share of the burst ({share}) is more than its reserve ({W1S_WARM}): the rest \
                     claim their own"
                ));
            }
            let ops = self.burst_ops(round);
            let parallel = self.sizes.burst_parallel;
            let b = WarmBurst { what: "W1s", round, nodes: &nodes, warm: W1S_WARM, ops: &ops, parallel };
            return self.warm_burst(&mut r, b).await;
        }
        if variant == Variant::HereaboutsAgent {
            let nodes: Vec<String> = (0..self.sizes.nodes).map(|i| format!("node-{i}")).collect();
            // the agents' own identity: they watch the NADs and claim their nodes' slices ahead, as Whereabouts'
            // controller assigns them for Wf; the burst starts once every node holds one
            let identity = self.cluster.kubeconfig(hereabouts_tests::Identity::Admin, &r.ns);
            let agents = super::agents::Agents::start(
                &self.cluster.dir().join(format!("agents-{}", r.ns)),
                &nodes,
                &identity,
                Some(&identity),
                None,
            )
            .await?;
            r.agents = Some(agents.dir.clone());
            let (ahead, held, took) = self.slices_ahead(&r, &nodes, W1S_SLICES).await?;
            self.note(format!(
                "W1s agent: {held} of {} nodes held a slice claimed ahead {took:.2} s after the round's NAD was created",
                nodes.len()
            ));
            let res = self.burst_followed(&r, round, &agents.pids()).await;
            ahead.stop(&self.admin, &r.ns).await;
            let res = res.map(|(res, spent)| {
                self.note(spent.line("W1s agent", self.sizes.burst_adds));
                res
            });
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

    /// The burst's ADDs: distinct pods, spread over the nodes in turn.
    fn burst_ops(&self, round: usize) -> Vec<Op> {
        (0..self.sizes.burst_adds)
            .map(|i| Op::add(format!("r{round}-p{i}"), format!("node-{}", i % self.sizes.nodes)))
            .collect()
    }

    async fn burst_in(&self, r: &Round, round: usize) -> anyhow::Result<RoundResult> {
        self.burst_followed(r, round, &[]).await.map(|(res, _)| res)
    }

    /// [`Self::burst_in`], with where the burst's CPU went, the processes `followed` (the agents) apart.
    async fn burst_followed(
        &self,
        r: &Round,
        round: usize,
        followed: &[u32],
    ) -> anyhow::Result<(RoundResult, crate::cpu::Spent)> {
        let ops = self.burst_ops(round);
        let before = self.snapshot().await;
        let limits = self.limits();
        let cpu = crate::cpu::sample(followed);
        let outs = invoke::parallel(r, &ops, self.sizes.burst_parallel, limits).await;
        let spent = cpu.until(&crate::cpu::sample(followed));
        let wall = limits.t0.elapsed().as_secs_f64();
        Ok((self.finish(r, &outs, wall, &before, false).await?, spent))
    }
}
