//! The network configs a runtime hands an IPAM plugin of a NetworkAttachmentDefinition's `spec.config`: the
//! config itself, or each plugin of a list with the list's `cniVersion` and `name`, as Multus and libcni pass them.

use serde_json::Value;

/// Each plugin of `config` whose `ipam.type` is one of `types`, as the runtime would hand it: with its index in
/// `plugins` (`None`: `config` is a single plugin's).
pub fn ipam_plugins(config: &Value, types: &[&str]) -> Vec<(Option<usize>, Value)> {
    let ours = |plugin: &Value| plugin["ipam"]["type"].as_str().is_some_and(|t| types.contains(&t));
    let Some(plugins) = config["plugins"].as_array() else {
        return if ours(config) { vec![(None, config.clone())] } else { Vec::new() };
    };
    plugins
        .iter()
        .enumerate()
        .filter(|(_, p)| ours(p))
        .map(|(i, plugin)| {
            let mut single = plugin.clone();
            for key in ["cniVersion", "name"] {
                if let Some(v) = config.get(key) {
                    single[key] = v.clone();
                }
            }
            (Some(i), single)
        })
        .collect()
}
