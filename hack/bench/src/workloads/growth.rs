//! W3 and W3s: single ADDs into pools pre-filled (in the plugins' own format, by the harness) to N allocations.
//! Overlapping ranges are off for both plugins, so the fill needs no reservations.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context as _;
use hereabouts_ipam::crd::IpPool;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use super::Bench;
use super::nodeslice::NODE_SLICES;
use crate::args::{Plugin, Variant};
use crate::invoke::{self, Op, Round};
use crate::k8s::{create_node_slice_pool, create_pools, fill_entries, pool_name, retry, slice_pool_name, slices};
use crate::results::RoundResult;
use crate::stats::median;

pub const W3_RANGE: &str = "198.18.64.0/18";
pub const W3S_RANGE: &str = "198.19.0.0/16";
pub const W3S_SLICE: &str = "/24";
/// Entries per filled slice: a /24 slice has 254 usable addresses, so each filled one keeps a little room.
pub const W3S_PER_SLICE: usize = 250;

impl Bench {
    /// W3: one /18 pool pre-filled to `level`.
    pub async fn growth(&self, plugin: Plugin, round: usize, level: usize) -> anyhow::Result<RoundResult> {
        let range = W3_RANGE;
        let r = self
            .round(plugin, &format!("w3-{level}"), json!({"range": range, "enable_overlapping_ranges": false}))
            .await?;
        let pool = IpPool {
            metadata: ObjectMeta { name: Some(pool_name(range)), ..Default::default() },
            spec: hereabouts_ipam::crd::IpPoolSpec {
                range: range.into(),
                allocations: fill_entries(&r.ns, "fill-", level),
                ..Default::default()
            },
        };
        Api::<IpPool>::namespaced(self.admin.clone(), &r.ns)
            .create(&PostParams::default(), &pool)
            .await
            .with_context(|| format!("pre-fill the pool with {level} allocations"))?;
        let nodes: Vec<String> = (0..self.sizes.nodes).map(|i| format!("node-{i}")).collect();
        let mut res = self.single_adds(&r, round, &nodes, level).await?;
        res.server_ms = Some(self.server_cost(&r.ns, &pool_name(range)).await?);
        Ok(res)
    }

    /// W3s: a /16 in /24 slices over `sliced_growth_nodes` nodes; the first ⌈level/250⌉ slices assigned
    /// round-robin, each slice's pool `node-<i>-<slice>` holding 250 entries. Every node that ADDs owns a slice
    /// with room (below that many slices, an empty one, its pool created empty as W3 creates its pool).
    pub async fn growth_sliced(&self, variant: Variant, round: usize, level: usize) -> anyhow::Result<RoundResult> {
        let ipam = json!({"range": W3S_RANGE, "enable_overlapping_ranges": false, "node_slice_size": W3S_SLICE});
        let mut r = self.round(variant.plugin(), &format!("w3s-{level}"), ipam).await?;
        let nodes = self.sizes.sliced_growth_nodes;
        let adders: Vec<String> = (0..self.sizes.growth_adds.min(nodes)).map(|i| format!("node-{i}")).collect();
        let all = slices(W3S_RANGE, W3S_SLICE.trim_start_matches('/').parse()?)?;
        let filled = level.div_ceil(W3S_PER_SLICE);
        anyhow::ensure!(filled + adders.len() <= all.len(), "{level} allocations do not fit {W3S_RANGE}");
        let mut owners: BTreeMap<String, String> = BTreeMap::new();
        let mut pools = Vec::new();
        for (k, slice) in all.iter().enumerate().take(filled) {
            let node = format!("node-{}", k % nodes);
            let count = W3S_PER_SLICE.min(level - k * W3S_PER_SLICE);
            pools.push((
                slice_pool_name(&node, slice),
                slice.clone(),
                fill_entries(&r.ns, &format!("fill-{k}-"), count),
            ));
            owners.insert(slice.clone(), node);
        }
        let mut spare = all.iter().skip(filled);
        for node in &adders {
            if !owners.values().any(|n| n == node) {
                let slice = spare.next().context("a spare slice")?;
                pools.push((slice_pool_name(node, slice), slice.clone(), BTreeMap::new()));
                owners.insert(slice.clone(), node.clone());
            }
        }
        let t0 = Instant::now();
        create_node_slice_pool(&self.admin, &r.ns, NODE_SLICES, W3S_RANGE, W3S_SLICE, &owners).await?;
        create_pools(&self.admin, &r.ns, pools).await.with_context(|| format!("pre-fill {level} allocations"))?;
        eprintln!("bench: W3s pre-fill of {level} in {} slices took {:.1} s", owners.len(), t0.elapsed().as_secs_f64());
        if variant != Variant::HereaboutsAgent {
            return self.single_adds(&r, round, &adders, level).await;
        }
        let agents = super::agents::Agents::start(
            &self.cluster.dir().join(format!("agents-{}", r.ns)),
            &adders,
            &self.cluster.kubeconfig(hereabouts_tests::Identity::Admin, &r.ns),
            None,
            None,
        )
        .await?;
        r.agents = Some(agents.dir.clone());
        let res = self.single_adds(&r, round, &adders, level).await;
        if let Some(mib) = agents.stop() {
            self.note(format!(
                "W3s@{level}: the agents' peak resident memory, the largest of {} ({level} allocations in the \
                 cluster's slice pools): {mib:.1} MiB",
                adders.len()
            ));
        }
        res
    }

    /// `growth_adds` ADDs one after the other, over `nodes` in turn; the `level` pre-filled entries are not
    /// leaks.
    async fn single_adds(
        &self,
        r: &Round,
        round: usize,
        nodes: &[String],
        level: usize,
    ) -> anyhow::Result<RoundResult> {
        let before = self.snapshot().await;
        let limits = self.limits();
        let mut outs = Vec::new();
        for i in 0..self.sizes.growth_adds {
            let op = Op::add(format!("r{round}-g{i}"), nodes[i % nodes.len()].clone());
            outs.push(invoke::invoke(r, &op, limits).await);
        }
        let wall = limits.t0.elapsed().as_secs_f64();
        let mut res = self.finish(r, &outs, wall, &before, false).await?;
        res.orphans = res.orphans.saturating_sub(level as u64);
        Ok(res)
    }

    /// Where an ADD's time goes on the server: the harness's own GET of the pool and a merge patch adding (then
    /// removing) one entry, each timed from this process (median of 3), after the measured ADDs.
    async fn server_cost(&self, ns: &str, name: &str) -> anyhow::Result<(f64, f64)> {
        let api = Api::<IpPool>::namespaced(self.admin.clone(), ns);
        let (mut gets, mut patches) = (Vec::new(), Vec::new());
        for i in 0..3 {
            let t0 = Instant::now();
            retry(|| api.get(name)).await?;
            gets.push(t0.elapsed().as_secs_f64() * 1000.0);
            let key = (16000 + i).to_string();
            let add = json!({"spec": {"allocations": {&key: {"id": "probe-c", "podref": format!("{ns}/probe"), "ifname": "net1"}}}});
            let t0 = Instant::now();
            api.patch(name, &PatchParams::default(), &Patch::Merge(&add)).await?;
            patches.push(t0.elapsed().as_secs_f64() * 1000.0);
            let remove = json!({"spec": {"allocations": {&key: null}}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&remove)).await?;
        }
        Ok((median(gets), median(patches)))
    }
}
