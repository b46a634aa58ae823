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
            tokio::spawn(watch_node(reserves.clone(), client.clone(), node.to_string()));
            tokio::spawn(retire_unwanted(reserves.clone(), client));
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

/// How often the agent gives back the reserves no config asks for any more ([`Reserves::retire_unwanted`]).
const RETIRE_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// Every [`RETIRE_EVERY`] (the first a minute after start), reads every NetworkAttachmentDefinition and gives back
/// the node's warm slots no config of them asks for: `warm_addresses` removed or 0, the definition deleted, or the
/// reserve's key changed. Nothing when the definitions cannot be listed.
async fn retire_unwanted(reserves: Reserves<Shared<KubeStore>>, client: kube::Client) {
    let nads: Api<kube::api::DynamicObject> = Api::all_with(client, &hereabouts_ipam::crd::nad_resource());
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    // the pools are searched for strays only when what is wanted changed (and at start): a LIST of every pool
    // from every node every pass would cost the API server more than the strays it finds
    // (and after a pass that gave something back: a fill under way then may have landed since)
    let mut searched_for: Option<hereabouts_ipam::warm::Wanted> = None;
    let mut gave_back = false;
    loop {
        let listed_at = tokio::time::Instant::now();
        match nads.list(&Default::default()).await {
            Ok(list) => {
                let wanted = wanted_of(&list.items);
                let search = gave_back || searched_for.as_ref() != Some(&wanted);
                let given = reserves.retire_unwanted(&wanted, listed_at, search).await;
                searched_for = Some(wanted);
                gave_back = given > 0;
                if given > 0 {
                    tracing::info!(slots = given, "warm slots no config asks for given back");
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot list NetworkAttachmentDefinitions: no warm slot given back"),
        }
        tokio::time::sleep(RETIRE_EVERY).await;
    }
}

/// The reserves the definitions' configs ask for: each hereabouts config (under either name: a chart installed as
/// Whereabouts serves `"type": "whereabouts"`) of slice mode with `warm_addresses`, loaded as an ADD would load it.
fn wanted_of(nads: &[kube::api::DynamicObject]) -> hereabouts_ipam::warm::Wanted {
    let mut wanted = hereabouts_ipam::warm::Wanted::default();
    for nad in nads {
        let Some(text) = nad.data.pointer("/spec/config").and_then(serde_json::Value::as_str) else { continue };
        let Ok(config) = serde_json::from_str::<serde_json::Value>(text) else { continue };
        let name = nad.metadata.name.clone().unwrap_or_default();
        for (_, mut plugin) in hereabouts_ipam::config::ipam_plugins(&config, &["hereabouts", "whereabouts"]) {
            if let Some(plugin) = plugin.as_object_mut() {
                plugin.entry("name").or_insert_with(|| serde_json::Value::String(name.clone()));
            }
            let stdin = plugin.to_string();
            let input = hereabouts_ipam::config::Input { stdin: stdin.as_bytes(), cni_args: "" };
            let Ok(cfg) = hereabouts_ipam::config::load(&input) else { continue };
            if let hereabouts_ipam::config::Mode::Slices(mode) = &cfg.mode
                && let Some(kubeconfig) = mode.kube.kubeconfig.as_deref()
            {
                wanted.add(kubeconfig, &cfg, mode);
            }
        }
    }
    wanted
}

/// `Err` naming it when the cluster runs Whereabouts' reconciler, or when that cannot be read.
async fn whereabouts_reconciler(client: kube::Client) -> Result<(), String> {
    match hereabouts_ipam::warm::whereabouts_reconciler(&client).await {
        Ok(None) => Ok(()),
        Ok(Some(found)) => Err(format!("{found}, which would free the node's warm addresses")),
        Err((what, e)) => Err(format!("cannot tell whether Whereabouts' reconciler runs ({what}: {e})")),
    }
}
