//! A client under kubectl's kubeconfig rules, the namespace of the pools, and pods as the rules see them.

use anyhow::Context as _;
use hereabouts_ipam::reconcile::rules::{PodView, podref_parts, sticky_wanted};
use hereabouts_ipam::reconcile::{read_statefulset, view_of};
use hereabouts_ipam::store::{DEFAULT_NAMESPACE, Proxies};
use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use hereabouts_ipam::crd::{IpPool, NodeSlicePool};
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};

use crate::KubeFlags;

/// A client, and the pool namespace: `--namespace`, else the namespace the chart was installed to (that of the one
/// DaemonSet labelled `app.kubernetes.io/name=hereabouts`), else kube-system (the chart's default). Never the
/// context's namespace: the pools live where hereabouts runs, not where the operator last worked.
pub async fn connect(flags: &KubeFlags) -> anyhow::Result<(Client, String)> {
    // checked before kube reads the same variables, so that a bad one is reported as what it is
    let proxies = Proxies::from_env()?;
    let options = KubeConfigOptions { context: flags.context.clone(), ..KubeConfigOptions::default() };
    let config = match &flags.kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => match flags.context {
            Some(_) => kube::Config::from_kubeconfig(&options).await.context("kubeconfig")?,
            None => kube::Config::infer()
                .await
                .context("no kubeconfig (--kubeconfig, KUBECONFIG, ~/.kube/config) and not in a cluster")?,
        },
    };
    let config = route(&proxies, config).await?;
    let client = Client::try_from(config).context("build the client")?;
    let namespace = match &flags.namespace {
        Some(namespace) => namespace.clone(),
        None => installed_namespace(&client).await.unwrap_or_else(|| DEFAULT_NAMESPACE.to_string()),
    };
    Ok((client, namespace))
}

/// Through the proxy kubectl would use (the kubeconfig's `proxy-url`, `HTTPS_PROXY` and `NO_PROXY`). A static
/// build (the workspace's default, as for the node binaries) cannot trust the C library's resolver: its
/// `getaddrinfo` loads the host's NSS modules, which need not match it; so when no proxy applies it resolves the
/// server's name as the CNI plugin does. A build for the laptop's own target (`cargo install --path ctl`) uses the
/// system's, which knows the VPN's split DNS and the like.
#[cfg(target_feature = "crt-static")]
async fn route(proxies: &Proxies, mut config: kube::Config) -> anyhow::Result<kube::Config> {
    proxies.route(&mut config).await?;
    Ok(config)
}

#[cfg(not(target_feature = "crt-static"))]
async fn route(proxies: &Proxies, mut config: kube::Config) -> anyhow::Result<kube::Config> {
    proxies.select(&mut config)?;
    Ok(config)
}

/// The pools of `namespace`, each read with the NodeSlicePools that explain slice pools Whereabouts made.
pub async fn pools_of(client: &Client, namespace: &str) -> anyhow::Result<Vec<IpPool>> {
    pools_with(client, namespace, &crate::check::node_slices(client, namespace).await?).await
}

/// [`pools_of`] with the namespace's NodeSlicePools as already listed.
pub async fn pools_with(client: &Client, namespace: &str, slices: &[NodeSlicePool]) -> anyhow::Result<Vec<IpPool>> {
    let lp = ListParams::default();
    let mut pools = Api::<IpPool>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .with_context(|| format!("list pools in {namespace}"))?
        .items;
    hereabouts_ipam::claim::understand(&mut pools, slices);
    Ok(pools)
}

/// The pools of every namespace, by namespace and name, each namespace's read with its own NodeSlicePools.
pub async fn pools_by_namespace(client: &Client) -> anyhow::Result<BTreeMap<String, Vec<IpPool>>> {
    let lp = ListParams::default();
    let pools = Api::<IpPool>::all(client.clone()).list(&lp).await.context("list pools in every namespace")?;
    let slices =
        Api::<NodeSlicePool>::all(client.clone()).list(&lp).await.context("list NodeSlicePools in every namespace")?;
    let mut by_namespace: BTreeMap<String, Vec<IpPool>> = BTreeMap::new();
    for pool in pools.items {
        by_namespace.entry(pool.metadata.namespace.clone().unwrap_or_default()).or_default().push(pool);
    }
    for (namespace, pools) in &mut by_namespace {
        let own: Vec<NodeSlicePool> =
            slices.items.iter().filter(|s| s.metadata.namespace.as_ref() == Some(namespace)).cloned().collect();
        hereabouts_ipam::claim::understand(pools, &own);
        pools.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }
    Ok(by_namespace)
}

/// The namespace of the chart's DaemonSet, when exactly one namespace has one and this identity may list them.
async fn installed_namespace(client: &Client) -> Option<String> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let params = kube::api::ListParams::default().labels("app.kubernetes.io/name=hereabouts");
    let found = kube::Api::<DaemonSet>::all(client.clone()).list_metadata(&params).await.ok()?;
    let namespaces: std::collections::BTreeSet<String> =
        found.items.into_iter().filter_map(|d| d.metadata.namespace).collect();
    match namespaces.len() {
        1 => namespaces.into_iter().next(),
        0 => None,
        _ => {
            eprintln!(
                "hereabouts runs in several namespaces ({namespaces:?}): using {DEFAULT_NAMESPACE}; -n names one"
            );
            None
        }
    }
}

/// What to say when a namespace holds no pools: where they may be instead.
pub fn no_pools_hint(namespace: &str) -> String {
    format!(
        "no IPPools in namespace {namespace}: hereabouts keeps them in the namespace its chart was installed to \
         (the `namespace` value, kube-system by default); -n names another"
    )
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

/// How many pods a LIST page holds: a namespace of thousands of pods is read in a few requests, none of them large.
const POD_PAGE: u32 = 500;

/// The pods `podrefs` name, as the reconciler's rules see them, read with paged LISTs of their namespaces (one
/// request per 500 pods, not one per pod); a podref whose pod is not listed is [`PodView::Missing`]. Says on
/// stderr which namespace it reads.
pub async fn pod_views<'a>(
    client: &Client,
    podrefs: impl IntoIterator<Item = &'a str>,
) -> anyhow::Result<HashMap<String, PodView>> {
    let wanted: BTreeSet<&str> = podrefs.into_iter().collect();
    let namespaces: BTreeSet<&str> = wanted.iter().filter_map(|p| podref_parts(p).map(|(ns, _)| ns)).collect();
    let mut listed: HashMap<String, PodView> = HashMap::new();
    for (i, namespace) in namespaces.iter().enumerate() {
        let api = Api::<Pod>::namespaced(client.clone(), namespace);
        let mut params = ListParams::default().limit(POD_PAGE);
        let mut pods = 0;
        loop {
            let page = api.list(&params).await.with_context(|| format!("list pods in {namespace}"))?;
            pods += page.items.len();
            for pod in &page.items {
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                listed.insert(format!("{namespace}/{name}"), view_of(pod));
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        eprintln!("checking: namespace {}/{}: {namespace}, {pods} pods", i + 1, namespaces.len());
    }
    Ok(wanted.into_iter().map(|p| (p.to_string(), listed.remove(p).unwrap_or(PodView::Missing))).collect())
}

/// Whether `entry` is sticky and its StatefulSet, read now, still wants the pod's ordinal.
pub async fn sticky(client: &Client, entry: &hereabouts_ipam::crd::IpAllocation) -> anyhow::Result<bool> {
    let Some(name) = entry.statefulset.as_deref() else { return Ok(false) };
    let Some((namespace, _)) = podref_parts(&entry.podref) else { return Ok(false) };
    let set = read_statefulset(client, namespace, name).await.map_err(anyhow::Error::msg)?;
    Ok(sticky_wanted(entry, set.as_ref()))
}

/// Whether `entry` (at `ip`) belongs to an IPAMClaim that still wants it.
pub async fn claimed(
    client: &Client,
    entry: &hereabouts_ipam::crd::IpAllocation,
    ip: Option<std::net::IpAddr>,
) -> anyhow::Result<bool> {
    let Some(name) = entry.ipamclaim.as_deref() else { return Ok(false) };
    let Some((namespace, _)) = podref_parts(&entry.podref) else { return Ok(false) };
    let ips = hereabouts_ipam::reconcile::read_ipamclaim(client, namespace, name).await.map_err(anyhow::Error::msg)?;
    Ok(hereabouts_ipam::reconcile::rules::claim_wants(ips.as_deref(), ip))
}

/// How far this machine's clock may be from the API server's before the ages `kubectl hereabouts` judges (how old an
/// entry or a reservation is) are refused as untrustworthy: NTP keeps machines far closer.
pub const MAX_SKEW: k8s_openapi::jiff::SignedDuration = k8s_openapi::jiff::SignedDuration::from_secs(5);

/// Judges ages on the API server's clock from now on: refuses when this machine's is more than [`MAX_SKEW`] away
/// (a laptop set five minutes fast would take an ADD under way for an abandoned one), else moves
/// `hereabouts_ipam::clock::now` by the difference.
pub async fn on_server_clock(client: &Client) -> anyhow::Result<()> {
    let skew = hereabouts_ipam::clock::server_skew(client).await?;
    trusted_skew(skew)?;
    hereabouts_ipam::clock::set_offset(skew);
    Ok(())
}

/// `skew` (the API server's time less this machine's), if small enough to judge ages by the server's clock.
fn trusted_skew(skew: k8s_openapi::jiff::SignedDuration) -> anyhow::Result<()> {
    if skew.abs() > MAX_SKEW {
        anyhow::bail!(
            "this machine's clock is {:.1} s {} the API server's: ages of entries and reservations would be misjudged; \
             set the clock right (NTP) and run again",
            skew.abs().as_secs_f64(),
            if skew.is_negative() { "ahead of" } else { "behind" }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::SignedDuration;

    use super::*;

    #[test]
    fn a_clock_minutes_off_the_servers_is_refused() {
        let fast = trusted_skew(SignedDuration::from_mins(-5)).unwrap_err().to_string();
        assert!(fast.starts_with("this machine's clock is 300.0 s ahead of the API server's"), "{fast}");
        assert!(trusted_skew(SignedDuration::from_secs(90)).unwrap_err().to_string().contains("s behind"));
        assert!(trusted_skew(SignedDuration::from_millis(1500)).is_ok(), "NTP-close clocks are judged by the server's");
    }
}
