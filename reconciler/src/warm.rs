//! The agent's side of the warm reserve ([`hereabouts_ipam::warm`]): its reserves over the live store, and the
//! fleet check that refuses a reserve where Whereabouts' reconciler runs.

use std::path::Path;
use std::sync::Arc;

use hereabouts_ipam::store::{KubeStore, Shared};
use hereabouts_ipam::warm::Reserves;
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

/// `Err` naming it when the cluster runs Whereabouts' reconciler, or when that cannot be read.
async fn whereabouts_reconciler(client: kube::Client) -> Result<(), String> {
    match hereabouts_ipam::warm::whereabouts_reconciler(&client).await {
        Ok(None) => Ok(()),
        Ok(Some(found)) => Err(format!("{found}, which would free the node's warm addresses")),
        Err((what, e)) => Err(format!("cannot tell whether Whereabouts' reconciler runs ({what}: {e})")),
    }
}
