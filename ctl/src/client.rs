//! A client under kubectl's kubeconfig rules, the namespace of the pools, and pods as the rules see them.

use anyhow::Context as _;
use hereabouts_ipam::reconcile::rules::{PodView, podref_parts, sticky_wanted};
use hereabouts_ipam::reconcile::{read_statefulset, view_of};
use hereabouts_ipam::store::DEFAULT_NAMESPACE;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::KubeFlags;

/// A client, and the pool namespace: `--namespace`, else the context's namespace, else kube-system (where the
/// CNI plugin's kubeconfig points by default).
pub async fn connect(flags: &KubeFlags) -> anyhow::Result<(Client, String)> {
    let options = KubeConfigOptions { context: flags.context.clone(), ..KubeConfigOptions::default() };
    let (config, context_namespace) = match &flags.kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).with_context(|| format!("read kubeconfig {}", path.display()))?;
            let namespace = context_namespace(&kubeconfig, flags.context.as_deref());
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?;
            (config, namespace)
        }
        None => {
            let namespace = Kubeconfig::read().ok().and_then(|k| context_namespace(&k, flags.context.as_deref()));
            let config = match flags.context {
                Some(_) => kube::Config::from_kubeconfig(&options).await.context("kubeconfig")?,
                None => kube::Config::infer()
                    .await
                    .context("no kubeconfig (--kubeconfig, KUBECONFIG, ~/.kube/config) and not in a cluster")?,
            };
            (config, namespace)
        }
    };
    let namespace = flags.namespace.clone().or(context_namespace).unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
    let client = Client::try_from(config).context("build the client")?;
    Ok((client, namespace))
}

/// The namespace `context` (else the current one) names, if any.
fn context_namespace(kubeconfig: &Kubeconfig, context: Option<&str>) -> Option<String> {
    let name = context.or(kubeconfig.current_context.as_deref())?;
    kubeconfig.contexts.iter().find(|c| c.name == name)?.context.as_ref()?.namespace.clone()
}

/// The pod `podref` names as the API server has it now, as the reconciler's rules see it.
pub async fn pod_view(client: &Client, podref: &str) -> anyhow::Result<PodView> {
    let Some((ns, name)) = podref_parts(podref) else { return Ok(PodView::Missing) };
    let pod = kube::Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .with_context(|| format!("get pod {podref}"))?;
    Ok(pod.as_ref().map_or(PodView::Missing, view_of))
}

/// Whether `entry` is sticky and its StatefulSet, read now, still wants the pod's ordinal.
pub async fn sticky(client: &Client, entry: &hereabouts_ipam::crd::IpAllocation) -> anyhow::Result<bool> {
    let Some(name) = entry.statefulset.as_deref() else { return Ok(false) };
    let Some((namespace, _)) = podref_parts(&entry.podref) else { return Ok(false) };
    let set = read_statefulset(client, namespace, name).await.map_err(anyhow::Error::msg)?;
    Ok(sticky_wanted(entry, set.as_ref()))
}
