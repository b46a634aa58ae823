//! The workloads. Each round runs in a fresh namespace with the same identity, range and options for both
//! plugins; the API server's counters are read just before and just after the measured invocations.

mod agents;
mod burst;
pub mod ceiling;
mod churn;
mod fill;
pub mod fit;
mod growth;
pub mod large;
mod nodeslice;
mod startup;
mod warm;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use hereabouts_tests::{Identity, TestCluster};
use kube::Client;
use serde_json::{Value, json};

pub use burst::{W1S_SLICE, W1S_WARM};
pub use ceiling::CeilingRow;
pub use fill::FillResult;
pub use growth::{W3_RANGE, W3S_PER_SLICE, W3S_RANGE, W3S_SLICE};

use crate::args::{Plugin, Sizes};
use crate::invoke::{Limits, OpResult, Round};
use crate::metrics::{api_counters, delta};
use crate::results::{RoundResult, summarise};

pub struct Bench {
    pub cluster: &'static TestCluster,
    pub admin: Client,
    pub programs: HashMap<Plugin, PathBuf>,
    pub round_timeout: Duration,
    pub op_timeout: Duration,
    pub sizes: Sizes,
    /// What the run had to do differently from what the table's titles say (printed under the table).
    pub notes: std::sync::Mutex<Vec<String>>,
}

impl Bench {
    /// A fresh namespace and the network config of `plugin` for it: same identity, range and options for both.
    async fn round(&self, plugin: Plugin, prefix: &str, ipam: Value) -> anyhow::Result<Round> {
        let ns = self.cluster.namespace(&format!("{prefix}-{}", &plugin.name()[..1])).await;
        let kubeconfig = self.cluster.kubeconfig(Identity::Admin, &ns);
        let mut full = json!({"type": plugin.name(), "kubernetes": {"kubeconfig": kubeconfig}});
        if let (Some(full), Some(extra)) = (full.as_object_mut(), ipam.as_object()) {
            full.extend(extra.clone());
        }
        if plugin == Plugin::Whereabouts {
            // Whereabouts refuses to run without a flat file; give it one beside the kubeconfig.
            let flat = self.cluster.dir().join(format!("whereabouts-{ns}.conf"));
            std::fs::write(
                &flat,
                json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": kubeconfig}}).to_string(),
            )?;
            full["configuration_path"] = json!(flat);
        }
        let config = json!({"cniVersion": "1.0.0", "name": "bench", "type": "macvlan", "ipam": full}).to_string();
        Ok(Round { ns, config, program: self.programs[&plugin].clone(), agents: None })
    }

    fn limits(&self) -> Limits {
        Limits::start(self.round_timeout, self.op_timeout)
    }

    async fn snapshot(&self) -> BTreeMap<String, f64> {
        api_counters(&self.cluster.metrics().await)
    }

    /// The round's result: its invocations, the counters' change over them, and the checks of the objects.
    async fn finish(
        &self,
        r: &Round,
        outs: &[OpResult],
        wall: f64,
        before: &BTreeMap<String, f64>,
        churn: bool,
    ) -> anyhow::Result<RoundResult> {
        let after = self.snapshot().await;
        let mut res = summarise(outs, wall, delta(before, &after));
        crate::verify::verify(&self.admin, r, outs, &mut res, churn).await?;
        Ok(res)
    }

    pub fn note(&self, text: String) {
        eprintln!("bench: note: {text}");
        let mut notes = self.notes.lock().unwrap();
        if !notes.contains(&text) {
            notes.push(text);
        }
    }
}
