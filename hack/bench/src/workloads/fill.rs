//! Fill: hereabouts in slice mode, ADDs until every usable address of the range is given; then one more ADD must
//! fail with "range exhausted". Nodes claim slices on demand and, once none is free, borrow from each other's:
//! the range fills completely or this says where it did not.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use hereabouts_ipam::crd::NodeSlicePool;
use kube::api::Api;
use serde_json::json;

use super::Bench;
use super::nodeslice::NODE_SLICES;
use crate::args::Plugin;
use crate::invoke::{self, Op};
use crate::k8s::{parse_cidr, retry};
use crate::metrics::delta;
use crate::results::{RoundResult, summarise};

#[derive(Debug, Clone, Default)]
pub struct FillResult {
    pub range: String,
    pub slice: String,
    pub nodes: usize,
    pub parallel: usize,
    /// Usable addresses of the range: as many ADDs ran.
    pub usable: usize,
    pub res: RoundResult,
    /// Distinct addresses the successful ADDs were given.
    pub given: usize,
    /// The ADD after the fill: `None` when it succeeded (it must not).
    pub extra: Option<String>,
    pub extra_code: Option<u64>,
    pub slices: usize,
    pub slices_owned: usize,
    pub owners: usize,
}

impl FillResult {
    pub fn filled(&self) -> bool {
        self.given == self.usable && self.extra_code == Some(100)
    }
}

impl Bench {
    pub async fn fill(&self) -> anyhow::Result<FillResult> {
        let s = &self.sizes;
        let ipam = json!({"range": s.fill_range, "node_slice_size": s.fill_slice});
        let r = self.round(Plugin::Hereabouts, "fill", ipam).await?;
        let (_, len) = parse_cidr(&s.fill_range)?;
        anyhow::ensure!((8..=30).contains(&len), "fill: {} is not a range to fill", s.fill_range);
        let usable = (1usize << (32 - len)) - 2;
        let ops: Vec<Op> =
            (0..usable).map(|i| Op::add(format!("f{i}"), format!("node-{}", i % s.fill_nodes))).collect();
        let before = self.snapshot().await;
        // far more ADDs than a burst round: the round's cap grows with them
        let mut limits = self.limits();
        limits.deadline += Duration::from_millis(250 * usable as u64);
        let mut outs = invoke::parallel(&r, &ops, s.fill_parallel, limits).await;
        let wall = limits.t0.elapsed().as_secs_f64();
        let after = self.snapshot().await;
        let mut res = summarise(&outs, wall, delta(&before, &after));
        limits.deadline = Instant::now() + limits.op_timeout;
        let extra = invoke::invoke(&r, &Op::add("f-extra".into(), "node-0".into()), limits).await;
        let (extra_error, extra_code) = (extra.error.clone(), extra.code());
        // checked with the others: had it been given an address, that address would be held twice
        outs.push(extra);
        crate::verify::verify(&self.admin, &r, &outs, &mut res, false).await?;
        let given: BTreeSet<_> = outs[..usable].iter().filter_map(|o| o.ip).collect();
        let api = Api::<NodeSlicePool>::namespaced(self.admin.clone(), &r.ns);
        let pool = retry(|| api.get(NODE_SLICES)).await?;
        let listed = pool.status.map(|s| s.allocations).unwrap_or_default();
        let owners: BTreeSet<&str> = listed.iter().map(|a| a.node_name.as_str()).filter(|n| !n.is_empty()).collect();
        Ok(FillResult {
            range: s.fill_range.clone(),
            slice: s.fill_slice.clone(),
            nodes: s.fill_nodes,
            parallel: s.fill_parallel,
            usable,
            given: given.len(),
            extra: extra_error,
            extra_code,
            slices: listed.len(),
            slices_owned: listed.iter().filter(|a| !a.node_name.is_empty()).count(),
            owners: owners.len(),
            res,
        })
    }
}
