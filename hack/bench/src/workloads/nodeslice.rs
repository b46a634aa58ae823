//! Whereabouts' fast IPAM needs its node-slice controller: the CNI reads its node's slice from the NodeSlicePool
//! and never claims one. The controller runs as a child process against the test API server, watching the Node
//! objects and a NetworkAttachmentDefinition that carries the round's config, for the length of one round.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hereabouts_ipam::crd::NodeSlicePool;
use hereabouts_tests::{Identity, runtime, testenv};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::core::DynamicObject;
use serde_json::Value;

use super::Bench;
use crate::invoke::Round;
use crate::k8s::{create_node_slice_pool, slices};

/// The NodeSlicePool (and NAD) name: the netconf `name`, as the round's config has no `network_name`.
pub const NODE_SLICES: &str = "bench";

/// How the round's slices were assigned, and what to stop afterwards.
#[derive(Debug)]
pub struct WhereaboutsSlices {
    controller: Option<tokio::process::Child>,
    nad: bool,
}

impl WhereaboutsSlices {
    /// Stops the controller and deletes the round's NAD, so that the next round's controller sees only its own.
    pub async fn stop(mut self, admin: &Client, ns: &str) {
        if let Some(child) = &mut self.controller {
            let _ = child.kill().await;
        }
        if self.nad {
            let _ = nad_api(admin, ns).delete(NODE_SLICES, &DeleteParams::default()).await;
        }
    }
}

fn nad_api(admin: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(admin.clone(), ns, &hereabouts_ipam::crd::nad_resource())
}

impl Bench {
    /// The Node objects `nodes`, for controllers that hand out slices per Node and agents that keep a warm reserve
    /// only while their Node exists.
    pub(super) async fn ensure_nodes(&self, nodes: &[String]) -> anyhow::Result<()> {
        let api = Api::<Node>::all(self.admin.clone());
        for name in nodes {
            let node =
                Node { metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() }, ..Default::default() };
            match api.create(&PostParams::default(), &node).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_already_exists() => {}
                Err(e) => return Err(e).with_context(|| format!("create Node {name}")),
            }
        }
        Ok(())
    }

    /// Every node of `nodes` owns a slice of `range` in the round's NodeSlicePool: assigned by Whereabouts' own
    /// controller, or, when it cannot run here, written as it would have written it (and said in the notes).
    pub async fn whereabouts_slices(
        &self,
        r: &Round,
        range: &str,
        slice: &str,
        nodes: &[String],
    ) -> anyhow::Result<WhereaboutsSlices> {
        self.ensure_nodes(nodes).await?;
        let mut assigned = WhereaboutsSlices { controller: None, nad: false };
        let outcome = self.run_controller(r, nodes, &mut assigned).await;
        match outcome {
            Ok(took) => {
                eprintln!("bench: Whereabouts' node-slice controller assigned {} nodes in {took:.1} s", nodes.len());
                Ok(assigned)
            }
            Err(e) => {
                if let Some(child) = &mut assigned.controller {
                    let _ = child.kill().await;
                }
                assigned.controller = None;
                self.note(format!(
                    "Whereabouts fast IPAM: its node-slice controller did not assign the slices ({e:#}); the bench \
                     wrote the NodeSlicePool as that controller would (every slice listed, nodes assigned \
                     lowest-free in name order)"
                ));
                // whatever the controller wrote before it gave up goes: the bench writes it whole
                let api = Api::<NodeSlicePool>::namespaced(self.admin.clone(), &r.ns);
                if api.get_opt(NODE_SLICES).await?.is_some() {
                    api.delete(NODE_SLICES, &DeleteParams::default()).await?;
                }
                let mut sorted = nodes.to_vec();
                sorted.sort();
                let prefix: u8 = slice.trim_start_matches('/').parse()?;
                let owners: BTreeMap<String, String> = slices(range, prefix)?.into_iter().zip(sorted).collect();
                create_node_slice_pool(&self.admin, &r.ns, NODE_SLICES, range, slice, &owners).await?;
                Ok(assigned)
            }
        }
    }

    /// Starts the controller with a NAD of the round's config; returns once the NodeSlicePool lists every node.
    async fn run_controller(&self, r: &Round, nodes: &[String], slices: &mut WhereaboutsSlices) -> anyhow::Result<f64> {
        let program = testenv::bin_dir().join("whereabouts-nodeslicecontroller");
        if !program.is_file() {
            bail!("{} is missing (hack/testenv.sh builds it)", program.display());
        }
        self.create_round_nad(r).await?;
        slices.nad = true;
        let log = self.cluster.dir().join(format!("nodeslicecontroller-{}.log", r.ns));
        let file = std::fs::File::create(&log)?;
        let t0 = Instant::now();
        slices.controller = Some(
            tokio::process::Command::new(&program)
                .arg(format!("-kubeconfig={}", self.cluster.kubeconfig(Identity::Admin, &r.ns).display()))
                .env("WHEREABOUTS_NAMESPACE", &r.ns)
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("start {}", program.display()))?,
        );
        let api = Api::<NodeSlicePool>::namespaced(self.admin.clone(), &r.ns);
        loop {
            if let Some(child) = &mut slices.controller
                && let Some(status) = child.try_wait()?
            {
                bail!("it exited ({status}); its log: {}", log.display());
            }
            if nodes_listed(&api, nodes).await == nodes.len() {
                return Ok(t0.elapsed().as_secs_f64());
            }
            if t0.elapsed() > Duration::from_secs(60) {
                bail!("no NodeSlicePool listing every node within 60 s; its log: {}", log.display());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The round's NAD for hereabouts' agents, deleted with [`SlicesAhead::stop`] so that later rounds' agents, which
/// watch every namespace, do not claim in this round's network.
#[derive(Debug)]
pub struct SlicesAhead;

impl SlicesAhead {
    pub async fn stop(self, admin: &Client, ns: &str) {
        let _ = nad_api(admin, ns).delete(NODE_SLICES, &DeleteParams::default()).await;
    }
}

impl Bench {
    /// Creates a NAD of the round's config, which hereabouts' agents (given an identity) see and claim their nodes'
    /// slices ahead for, as Whereabouts' controller assigns them for `Wf`; returns once the NodeSlicePool lists a
    /// slice for as many of `nodes` as claim ahead (they do while half of the range's `slices` are free: all of
    /// them, or `slices / 2 + 1`), with that count and the seconds it took.
    pub(super) async fn slices_ahead(
        &self,
        r: &Round,
        nodes: &[String],
        slices: usize,
    ) -> anyhow::Result<(SlicesAhead, usize, f64)> {
        let expected = nodes.len().min(slices / 2 + 1);
        let t0 = Instant::now();
        self.create_round_nad(r).await?;
        let api = Api::<NodeSlicePool>::namespaced(self.admin.clone(), &r.ns);
        loop {
            let held = nodes_listed(&api, nodes).await;
            if held >= expected {
                return Ok((SlicesAhead, held, t0.elapsed().as_secs_f64()));
            }
            if t0.elapsed() > Duration::from_secs(60) {
                SlicesAhead.stop(&self.admin, &r.ns).await;
                bail!("the agents claimed ahead for {held} nodes, not {expected}, within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Bench {
    /// A NAD named [`NODE_SLICES`] carrying the round's config, its CRD installed first when it is not.
    async fn create_round_nad(&self, r: &Round) -> anyhow::Result<()> {
        let crd =
            runtime::nad_crd_path().context("the NetworkAttachmentDefinition CRD is missing (hack/testenv.sh)")?;
        runtime::install_nad_crd(&self.admin, &crd).await?;
        let config: Value = serde_json::from_str(&r.config)?;
        runtime::create_nad(&self.admin, &r.ns, NODE_SLICES, &config).await
    }
}

/// How many of `nodes` the round's NodeSlicePool lists a slice for.
async fn nodes_listed(api: &Api<NodeSlicePool>, nodes: &[String]) -> usize {
    let Ok(Some(pool)) = api.get_opt(NODE_SLICES).await else { return 0 };
    let owners: Vec<&str> =
        pool.status.as_ref().map(|s| s.allocations.iter().map(|a| a.node_name.as_str()).collect()).unwrap_or_default();
    nodes.iter().filter(|n| owners.contains(&n.as_str())).count()
}
