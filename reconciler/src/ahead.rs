//! Slices claimed ahead: the agent watches the NetworkAttachmentDefinitions and, for each network of slice mode
//! whose IPAM is `"type": "hereabouts"`, claims its node's slice and creates the slice's pool as the network appears
//! ([`hereabouts_ipam::verbs::hold_slices`]), as Whereabouts' node-slice controller gives every node a slice. The
//! node's first ADDs of the network then write their entries and nothing else, instead of waiting in turn for the
//! claim's requests. Best effort: a claim ahead that fails or is not made (more than half of the range claimed
//! already) leaves it to the node's first ADD, as without the agent.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use futures::StreamExt as _;
use hereabouts_ipam::config;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;

use crate::agent::AgentHost;

/// Watches every NetworkAttachmentDefinition through `client` (the agent's own identity) for as long as the
/// process runs, and claims ahead for `node` in each hereabouts network of slice mode, once per config.
pub(crate) async fn run(host: AgentHost, client: kube::Client, node: Arc<str>) {
    let nads: Api<DynamicObject> = Api::all_with(client, &hereabouts_ipam::crd::nad_resource());
    // the config each definition was last held for: a definition seen again unchanged (a relist) costs nothing
    let mut done: HashMap<String, String> = HashMap::new();
    let mut warned = false;
    let mut events = std::pin::pin!(watcher::watcher(nads, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        let nad = match event {
            Ok(Event::Apply(nad) | Event::InitApply(nad)) => nad,
            Ok(Event::Delete(nad)) => {
                done.remove(&key(&nad));
                continue;
            }
            Ok(Event::Init | Event::InitDone) => continue,
            Err(e) => {
                // the CRD not installed, or no right to list it: ADDs claim as they would without the agent
                if !warned {
                    tracing::warn!(error = %e, "agent: cannot watch NetworkAttachmentDefinitions; slices are claimed \
                        by the first ADDs instead");
                    warned = true;
                }
                continue;
            }
        };
        let Some(text) = nad.data.pointer("/spec/config").and_then(Value::as_str) else { continue };
        let key = key(&nad);
        if done.get(&key).is_some_and(|seen| seen == text) {
            continue;
        }
        done.insert(key.clone(), text.to_string());
        let name = nad.metadata.name.clone().unwrap_or_default();
        for stdin in ipam_configs(text, &name) {
            let input = config::Input { stdin: stdin.as_bytes(), cni_args: "" };
            let Ok(cfg) = config::load(&input) else {
                tracing::debug!(nad = %key, "agent: a config the loader refuses is not claimed ahead");
                continue;
            };
            if !kubeconfig_readable(&cfg) {
                continue;
            }
            let (host, node, key) = (host.clone(), node.clone(), key.clone());
            // one network's claim does not wait for another's
            tokio::spawn(async move {
                match hereabouts_ipam::verbs::hold_slices(&host, &cfg, &node).await {
                    Ok(held) if held.is_empty() => tracing::debug!(nad = %key, "agent: no slice claimed ahead"),
                    Ok(held) => tracing::info!(nad = %key, network = %cfg.name, slices = ?held,
                        "agent: the node holds its slice ahead of its first ADD"),
                    Err(e) => tracing::warn!(nad = %key, network = %cfg.name, error = %e,
                        "agent: no slice claimed ahead; the node's first ADD claims it"),
                }
            });
        }
    }
}

fn key(nad: &DynamicObject) -> String {
    format!(
        "{}/{}",
        nad.metadata.namespace.as_deref().unwrap_or_default(),
        nad.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether the agent can read the kubeconfig `cfg` names, as it checks before serving an invocation.
fn kubeconfig_readable(cfg: &config::IpamConfig) -> bool {
    match &cfg.mode {
        config::Mode::Slices(s) => s.kube.kubeconfig.as_deref().is_some_and(Path::exists),
        _ => false,
    }
}

/// The network configs a runtime would hand a hereabouts IPAM of the NetworkAttachmentDefinition `name` whose
/// `spec.config` is `text`: the config itself, or each plugin of a list, with the list's name and CNI version, as
/// Multus hands them. Only `"type": "hereabouts"`: a definition naming `whereabouts` may be served by Whereabouts'
/// own binary, whose slices its controller gives.
pub(crate) fn ipam_configs(text: &str, name: &str) -> Vec<String> {
    let Ok(config) = serde_json::from_str::<Value>(text) else { return Vec::new() };
    let mut found = config::ipam_plugins(&config, &["hereabouts"]);
    for (_, plugin) in &mut found {
        if let Some(plugin) = plugin.as_object_mut() {
            plugin.entry("name").or_insert_with(|| Value::String(name.to_string()));
        }
    }
    found.into_iter().map(|(_, plugin)| plugin.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_and_each_plugin_of_a_list_are_handed_as_multus_hands_them() {
        let single = r#"{"cniVersion":"1.0.0","name":"net-a","type":"macvlan",
            "ipam":{"type":"hereabouts","range":"198.18.0.0/24","node_slice_size":"/26"}}"#;
        let found = ipam_configs(single, "nad-a");
        assert_eq!(found.len(), 1);
        let v: Value = serde_json::from_str(&found[0]).unwrap();
        assert_eq!((v["name"].as_str(), v["ipam"]["range"].as_str()), (Some("net-a"), Some("198.18.0.0/24")));

        let list = r#"{"cniVersion":"0.4.0","name":"net-b","plugins":[
            {"type":"macvlan","ipam":{"type":"hereabouts","range":"198.18.1.0/24"}},
            {"type":"tuning"},
            {"type":"bridge","ipam":{"type":"whereabouts","range":"198.18.2.0/24"}}]}"#;
        let found = ipam_configs(list, "nad-b");
        assert_eq!(found.len(), 1, "only hereabouts' own type: {found:?}");
        let v: Value = serde_json::from_str(&found[0]).unwrap();
        assert_eq!((v["name"].as_str(), v["cniVersion"].as_str()), (Some("net-b"), Some("0.4.0")));

        let unnamed = r#"{"cniVersion":"1.0.0","type":"macvlan","ipam":{"type":"hereabouts","range":"198.18.3.0/24"}}"#;
        let v: Value = serde_json::from_str(&ipam_configs(unnamed, "nad-c")[0]).unwrap();
        assert_eq!(v["name"].as_str(), Some("nad-c"));

        assert!(ipam_configs("not json", "x").is_empty());
        assert!(ipam_configs(r#"{"type":"macvlan","ipam":{"type":"host-local"}}"#, "x").is_empty());
    }
}
