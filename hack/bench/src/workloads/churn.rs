//! W2: ADD and DEL mixed, about `churn_live` addresses live, `churn_parallel` workers; everything DELeted.

use serde_json::json;

use super::Bench;
use crate::args::Plugin;
use crate::invoke::{self, Op, OpResult};
use crate::results::RoundResult;

impl Bench {
    pub async fn churn(&self, plugin: Plugin, round: usize, range: &str) -> anyhow::Result<RoundResult> {
        let r = self.round(plugin, "w2", json!({"range": range})).await?;
        let s = &self.sizes;
        let workers = s.churn_parallel;
        let target = s.churn_live / workers;
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (round as u64 + 1);
        let mut next_pod = 0usize;
        let plans: Vec<Vec<Op>> = (0..workers)
            .map(|w| {
                // in ADD/DEL pairs, so that every worker can end with nothing live
                let pairs = s.churn_ops / 2;
                let budget = 2 * (pairs / workers + usize::from(w < pairs % workers));
                let node = format!("node-{}", w % s.nodes);
                let mut live: Vec<String> = Vec::new();
                let mut plan = Vec::with_capacity(budget);
                for i in 0..budget {
                    let remaining = budget - i;
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let add = if live.len() + 1 >= remaining {
                        false
                    } else if live.is_empty() || live.len() < target.saturating_sub(target / 5) {
                        true
                    } else if live.len() > target + target / 5 {
                        false
                    } else {
                        rng.is_multiple_of(2)
                    };
                    if add {
                        let pod = format!("r{round}-p{next_pod}");
                        next_pod += 1;
                        live.push(pod.clone());
                        plan.push(Op { command: "ADD", pod, node: node.clone() });
                    } else {
                        let pod = live.swap_remove((rng >> 32) as usize % live.len());
                        plan.push(Op { command: "DEL", pod, node: node.clone() });
                    }
                }
                plan
            })
            .collect();
        let before = self.snapshot().await;
        let limits = self.limits();
        let round_ref = &r;
        let per_worker = futures::future::join_all(plans.iter().map(|plan| async move {
            let mut outs = Vec::with_capacity(plan.len());
            for op in plan {
                outs.push(invoke::invoke(round_ref, op, limits).await);
            }
            outs
        }))
        .await;
        let wall = limits.t0.elapsed().as_secs_f64();
        let outs: Vec<OpResult> = per_worker.into_iter().flatten().collect();
        self.finish(&r, &outs, wall, &before, true).await
    }
}
