//! The large burst, in the shape of Spiderpool's published benchmark: 1,000 pods over 10 nodes, here as 1,000 CNI
//! ADD processes with at most 100 under way (ten per node, as kubelets start a Deployment's pods; `--quick`: 200, 20
//! at a time), for each way of running: hereabouts with one pool (by the binary alone and through each node's agent), in node slices by the
//! binary alone, through each node's agent and through each node's agent with a warm reserve, Whereabouts with one
//! pool and in fast IPAM.

use serde_json::json;

use super::Bench;
use super::agents::Agents;
use super::warm::WarmBurst;
use crate::args::Variant;
use crate::invoke::{self, Op};
use crate::results::RoundResult;

pub const LARGE_RANGE: &str = "198.18.32.0/20";
/// One /24 per node: Whereabouts' fast IPAM gets exactly one slice per node and never borrows, so each node's
/// slice must hold its hundred pods.
pub const LARGE_SLICE: &str = "/24";

/// How many slices of `LARGE_SLICE` the range has.
const LARGE_SLICES: usize = 16;
pub const LARGE_ADDS: usize = 1000;
pub const LARGE_NODES: usize = 10;
pub const LARGE_PARALLEL: usize = 100;
/// The warm reserve per node: above each node's hundred (the config allows 256), and one /24 slice holds it beside
/// them and the node's first ADD once it is refilled (1 + 100 + 128 of 254).
pub const LARGE_WARM: usize = 128;

/// The variants the large burst runs, in order.
pub const LARGE_VARIANTS: [Variant; 7] = [
    Variant::Hereabouts,
    Variant::HereaboutsPoolAgent,
    Variant::HereaboutsSlice,
    Variant::HereaboutsAgent,
    Variant::HereaboutsWarm,
    Variant::Whereabouts,
    Variant::WhereaboutsFast,
];

impl Bench {
    pub async fn large(&self, variant: Variant, round: usize) -> anyhow::Result<RoundResult> {
        let sliced = matches!(
            variant,
            Variant::HereaboutsSlice | Variant::HereaboutsAgent | Variant::HereaboutsWarm | Variant::WhereaboutsFast
        );
        let mut ipam = json!({"range": LARGE_RANGE, "enable_overlapping_ranges": true});
        if sliced {
            ipam["node_slice_size"] = json!(LARGE_SLICE);
        }
        if variant == Variant::HereaboutsWarm {
            ipam["warm_addresses"] = json!(LARGE_WARM);
        }
        let mut r = self.round(variant.plugin(), "large", ipam).await?;
        let nodes: Vec<String> = (0..LARGE_NODES).map(|i| format!("node-{i}")).collect();
        let (adds, parallel) = (self.sizes.large_adds, self.sizes.large_parallel);
        let ops: Vec<Op> =
            (0..adds).map(|i| Op::add(format!("r{round}-p{i}"), nodes[i % LARGE_NODES].clone())).collect();
        if variant == Variant::HereaboutsWarm {
            let b = WarmBurst { what: "large burst", round, nodes: &nodes, warm: LARGE_WARM, ops: &ops, parallel };
            return self.warm_burst(&mut r, b).await;
        }
        let agents = match variant {
            Variant::HereaboutsAgent | Variant::HereaboutsPoolAgent => {
                // with an identity, the slice-mode agents claim their nodes' slices ahead from the round's NAD, as
                // Wf's slices are assigned before its burst
                let identity = self.cluster.kubeconfig(hereabouts_tests::Identity::Admin, &r.ns);
                let agents = Agents::start(
                    &self.cluster.dir().join(format!("agents-{}", r.ns)),
                    &nodes,
                    &identity,
                    (variant == Variant::HereaboutsAgent).then_some(identity.as_path()),
                    None,
                )
                .await?;
                r.agents = Some(agents.dir.clone());
                Some(agents)
            }
            _ => None,
        };
        let ahead = match variant {
            Variant::HereaboutsAgent => {
                let (ahead, held, took) = self.slices_ahead(&r, &nodes, LARGE_SLICES).await?;
                self.note(format!(
                    "large burst, slices + agent: {held} of {LARGE_NODES} nodes held a slice claimed ahead {took:.2} s \
                     after the round's NAD was created (claims ahead stop once half the range is claimed)"
                ));
                Some(ahead)
            }
            _ => None,
        };
        let slices = match variant {
            Variant::WhereaboutsFast => Some(self.whereabouts_slices(&r, LARGE_RANGE, LARGE_SLICE, &nodes).await?),
            _ => None,
        };
        let before = self.snapshot().await;
        let limits = self.limits();
        let outs = invoke::parallel(&r, &ops, parallel, limits).await;
        let wall = limits.t0.elapsed().as_secs_f64();
        let res = self.finish(&r, &outs, wall, &before, false).await;
        if let Some(mib) = agents.and_then(Agents::stop) {
            self.note(format!(
                "large burst: the agents' peak resident memory, the largest of {LARGE_NODES}: {mib:.1} MiB"
            ));
        }
        if let Some(slices) = slices {
            slices.stop(&self.admin, &r.ns).await;
        }
        if let Some(ahead) = ahead {
            ahead.stop(&self.admin, &r.ns).await;
        }
        res
    }
}
