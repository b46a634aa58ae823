//! `lint`: every NetworkAttachmentDefinition whose config (or one plugin of whose list) has an `ipam` of type
//! hereabouts or whereabouts, loaded with hereabouts' own config rules — what hereabouts would refuse, before a
//! switch-over from Whereabouts (which silently accepts some of it).

use std::path::PathBuf;

use anyhow::Context as _;
use hereabouts_ipam::config::{IPAM_TYPES, Input, load_with_paths};
use kube::Api;
use kube::api::ListParams;
use kube::core::DynamicObject;
use serde::Deserialize as _;
use serde_json::Value;

use crate::KubeFlags;

#[derive(clap::Args, Debug)]
pub struct LintArgs {
    /// NetworkAttachmentDefinition manifests (YAML or JSON, several documents each) or network configs to lint
    /// instead of the cluster's.
    #[arg(short = 'f', long = "filename")]
    files: Vec<PathBuf>,
    /// A node's flat file (`hereabouts.conf`) to fill in what the configs leave to it, as the plugin would.
    #[arg(long)]
    flat_file: Option<PathBuf>,
    /// `table` or `json`.
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
    output: String,
}

/// One plugin config and what hereabouts makes of it.
#[derive(Debug, serde::Serialize)]
pub struct Finding {
    /// `namespace/name` of the NetworkAttachmentDefinition, or the file.
    pub source: String,
    /// The plugin's position in a conflist, if it is one.
    pub plugin: Option<usize>,
    /// `None`: loads as hereabouts would.
    pub code: Option<u32>,
    pub message: Option<String>,
}

pub async fn run(flags: &KubeFlags, args: &LintArgs) -> anyhow::Result<bool> {
    let mut configs: Vec<(String, String)> = Vec::new();
    if args.files.is_empty() {
        configs = from_cluster(flags).await?;
    } else {
        for path in &args.files {
            let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
            configs.extend(from_text(&text, &path.display().to_string())?);
        }
    }
    let paths: Vec<PathBuf> = args.flat_file.iter().cloned().collect();
    let mut findings = Vec::new();
    for (source, config) in &configs {
        findings.extend(lint_config(source, config, &paths));
    }
    // the cluster's CRDs drop what some configs need (Whereabouts' schema): say which, whatever the configs
    if args.files.is_empty() {
        let (client, _) = crate::client::connect(flags).await?;
        let drift = crate::check::schema_drift(&client).await.unwrap_or_else(|e| {
            eprintln!("warning: {e:#}: the CRDs' schema is not checked");
            Vec::new()
        });
        for drift in drift {
            let message = crate::check::Finding::SchemaDrift {
                consequences: drift.consequences(),
                crd: drift.crd.clone(),
                pruned: drift.pruned,
                status_subresource: drift.status_subresource,
            }
            .to_string();
            findings.push(Finding {
                source: format!("crd/{}", drift.crd),
                plugin: None,
                code: Some(103),
                message: Some(message),
            });
        }
    }
    let refused = findings.iter().filter(|f| f.code.is_some()).count();
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&findings)?);
    } else {
        for f in &findings {
            let at = f.plugin.map_or_else(String::new, |i| format!(" plugins[{i}]"));
            match (&f.code, &f.message) {
                (Some(code), Some(message)) => println!("{}{at}: refused (code {code}): {message}", f.source),
                _ => println!("{}{at}: ok", f.source),
            }
        }
        println!("{} config(s) of hereabouts or whereabouts, {refused} refused", findings.len());
    }
    Ok(refused == 0)
}

/// `spec.config` of every NetworkAttachmentDefinition: of `--namespace`, else of all namespaces.
async fn from_cluster(flags: &KubeFlags) -> anyhow::Result<Vec<(String, String)>> {
    let (client, _) = crate::client::connect(flags).await?;
    let resource = hereabouts_ipam::crd::nad_resource();
    let api: Api<DynamicObject> = match &flags.namespace {
        Some(ns) => Api::namespaced_with(client, ns, &resource),
        None => Api::all_with(client, &resource),
    };
    let list = api.list(&ListParams::default()).await.context("list NetworkAttachmentDefinitions")?;
    Ok(list
        .items
        .iter()
        .map(|nad| {
            let source = format!(
                "{}/{}",
                nad.metadata.namespace.as_deref().unwrap_or_default(),
                nad.metadata.name.as_deref().unwrap_or_default()
            );
            let config = nad.data["spec"]["config"].as_str().unwrap_or_default().to_string();
            (source, config)
        })
        .collect())
}

/// The configs in a file: each document a NetworkAttachmentDefinition (its `spec.config`) or a network config.
fn from_text(text: &str, file: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let doc = Value::deserialize(doc).with_context(|| format!("{file}: document {i}"))?;
        if doc.is_null() {
            continue;
        }
        if doc["kind"] == "NetworkAttachmentDefinition" {
            let name = doc["metadata"]["name"].as_str().unwrap_or("?");
            let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default");
            let config = doc["spec"]["config"].as_str().unwrap_or_default().to_string();
            out.push((format!("{ns}/{name} ({file})"), config));
        } else {
            out.push((format!("{file} document {i}"), doc.to_string()));
        }
    }
    Ok(out)
}

/// What hereabouts makes of `config`: one finding per hereabouts or whereabouts plugin in it (none when it has
/// none), and one for a config that is not JSON at all.
fn lint_config(source: &str, config: &str, flat_file: &[PathBuf]) -> Vec<Finding> {
    let finding = |plugin, result: Result<(), (u32, String)>| {
        let (code, message) = match result {
            Ok(()) => (None, None),
            Err((code, message)) => (Some(code), Some(message)),
        };
        Finding { source: source.to_string(), plugin, code, message }
    };
    let value: Value = match serde_json::from_str(config) {
        Ok(v) => v,
        Err(e) => return vec![finding(None, Err((6, format!("spec.config is not JSON: {e}"))))],
    };
    hereabouts_ipam::config::ipam_plugins(&value, &IPAM_TYPES)
        .into_iter()
        .map(|(plugin, single)| finding(plugin, load(&single, flat_file)))
        .collect()
}

fn load(config: &Value, flat_file: &[PathBuf]) -> Result<(), (u32, String)> {
    let stdin = config.to_string();
    let input = Input { stdin: stdin.as_bytes(), cni_args: "" };
    load_with_paths(&input, flat_file).map(drop).map_err(|e| (e.code().number(), e.to_string()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn conf(ipam: Value) -> String {
        json!({"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "ipam": ipam}).to_string()
    }

    #[test]
    fn findings_per_plugin_of_ours_only() {
        let good = conf(json!({"type": "whereabouts", "range": "10.0.0.0/24"}));
        assert_eq!(lint_config("a", &good, &[]).iter().map(|f| f.code).collect::<Vec<_>>(), [None]);
        let camel = conf(json!({"type": "whereabouts", "range": "10.0.0.0/24", "rangeStart": "10.0.0.5"}));
        let f = lint_config("b", &camel, &[]);
        assert_eq!(f[0].code, Some(2), "{f:?}");
        assert!(f[0].message.as_deref().unwrap().contains("rangeStart"), "{f:?}");
        let other = conf(json!({"type": "host-local", "subnet": "10.0.0.0/24"}));
        assert!(lint_config("c", &other, &[]).is_empty(), "not ours: nothing to say");
        let list = json!({"cniVersion": "1.0.0", "name": "l", "plugins": [
            {"type": "tuning"},
            {"type": "macvlan", "ipam": {"type": "hereabouts", "range": "10.0.0.0/33"}},
        ]})
        .to_string();
        let f = lint_config("d", &list, &[]);
        assert_eq!((f.len(), f[0].plugin, f[0].code), (1, Some(1), Some(7)), "{f:?}");
        assert_eq!(lint_config("e", "{not json", &[])[0].code, Some(6));
    }

    #[test]
    fn files_hold_nads_or_configs() {
        let text = "kind: NetworkAttachmentDefinition\nmetadata: {name: a, namespace: x}\nspec:\n  config: '{\"cniVersion\":\"1.0.0\"}'\n---\n{\"cniVersion\": \"1.0.0\", \"name\": \"raw\"}\n";
        let got = from_text(text, "f.yaml").unwrap();
        assert_eq!(got[0].0, "x/a (f.yaml)");
        assert_eq!(got[0].1, "{\"cniVersion\":\"1.0.0\"}");
        assert_eq!(got[1].0, "f.yaml document 1");
    }
}
