//! The agent's side of the warm reserve ([`hereabouts_ipam::warm`]): its reserves over the live store, and the
//! fleet check that refuses a reserve where Whereabouts' reconciler runs.

use std::path::Path;
use std::sync::Arc;

use hereabouts_ipam::store::{KubeStore, Shared};
use hereabouts_ipam::warm::Reserves;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::PodSpec;
use kube::Api;

pub use hereabouts_ipam::warm::DEFAULT_DIR;

/// The reserves of `node`, journal in `dir`. The fleet check reads with `fleet` (the agent's own identity), else
/// with the client of the first reserve's kubeconfig. Takes replayed from the journal are handed over through
/// their kubeconfigs' clients as soon as those connect.
pub fn open(node: &str, dir: &Path, fleet: Option<kube::Client>) -> Reserves<Shared<KubeStore>> {
    let own = fleet.clone();
    let check: hereabouts_ipam::warm::FleetCheck<Shared<KubeStore>> = Arc::new(move |store: Shared<KubeStore>| {
        let client = own.clone().unwrap_or_else(|| store.inner().client().clone());
        Box::pin(whereabouts_reconciler(client))
    });
    let reserves = Reserves::open(node, dir, check);
    match fleet {
        Some(client) => {
            tokio::spawn(watch_node(reserves.clone(), client, node.to_string()));
        }
        None => tracing::warn!(
            "the agent has no identity of its own: it does not watch its Node, and a reserve stays in use while the \
             Node object is gone"
        ),
    }
    let replay = reserves.clone();
    tokio::spawn(async move {
        for kubeconfig in replay.unknown_kubeconfigs() {
            let mut backoff = std::time::Duration::from_millis(200);
            loop {
                match hereabouts_ipam::store::connect(&kubeconfig).await {
                    Ok((client, namespace)) => {
                        replay.know(&kubeconfig, Shared::new(KubeStore::new(client, &namespace)));
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(kubeconfig = %kubeconfig.display(), error = %e,
                            "warm hand-over cannot connect yet");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(std::time::Duration::from_secs(10));
                    }
                }
            }
        }
    });
    reserves
}

/// How often the agent reads its Node: well within the reconciler's grace period (60 s by default), which a Node
/// must stay missing for before the reconciler gives its reserve back.
const NODE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Tells `reserves`, every [`NODE_EVERY`], whether the Node `node` exists; a read that fails changes nothing.
async fn watch_node(reserves: Reserves<Shared<KubeStore>>, client: kube::Client, node: String) {
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client);
    loop {
        match nodes.get_metadata_opt(&node).await {
            Ok(found) => reserves.node_seen(found.is_some()),
            Err(e) => tracing::debug!(%node, error = %e, "cannot read the Node; the warm reserve stays as it is"),
        }
        tokio::time::sleep(NODE_EVERY).await;
    }
}

/// `Err` naming it when the cluster runs Whereabouts' reconciler (its `ip-control-loop` in a DaemonSet, or its
/// older `ip-reconciler` CronJob), or when that cannot be read.
async fn whereabouts_reconciler(client: kube::Client) -> Result<(), String> {
    let mentions = |spec: Option<&PodSpec>| {
        spec.is_some_and(|spec| {
            spec.containers.iter().any(|c| {
                let words = c.command.iter().chain(c.args.iter()).flatten();
                words.into_iter().any(|w| w.contains("ip-control-loop") || w.contains("ip-reconciler"))
            })
        })
    };
    let cannot = |what: &str, e: kube::Error| format!("cannot tell whether Whereabouts' reconciler runs ({what}: {e})");
    let sets = Api::<DaemonSet>::all(client.clone())
        .list(&Default::default())
        .await
        .map_err(|e| cannot("list DaemonSets", e))?;
    for set in &sets {
        if mentions(set.spec.template.spec.as_ref()) {
            return Err(format!(
                "DaemonSet {}/{} runs Whereabouts' reconciler, which would free the node's warm addresses",
                set.metadata.namespace.as_deref().unwrap_or_default(),
                set.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    let jobs = Api::<CronJob>::all(client).list(&Default::default()).await.map_err(|e| cannot("list CronJobs", e))?;
    for job in &jobs {
        let template = job.spec.job_template.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        if mentions(template) {
            return Err(format!(
                "CronJob {}/{} runs Whereabouts' reconciler, which would free the node's warm addresses",
                job.metadata.namespace.as_deref().unwrap_or_default(),
                job.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    Ok(())
}
