//! Whether Whereabouts' reconciler runs in the cluster: it would free a node's warm entries as entries of no pod,
//! so no node keeps a reserve where it does. The node agent asks before its first reserve and every minute after
//! ([`super::FLEET_EVERY`]); the benchmark too.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::PodSpec;
use kube::Api;
use kube::api::ListParams;

/// What names Whereabouts' reconciler (its DaemonSet's `ip-control-loop`, its `ip-reconciler` as a Deployment since
/// v0.9.4, `whereabouts-reconciler`, or as the older CronJob: a container whose command or args mention one), every
/// one found, if any; `Err` when DaemonSets, Deployments or CronJobs cannot be listed, with what failed.
pub async fn whereabouts_reconciler(client: &kube::Client) -> Result<Option<String>, (&'static str, kube::Error)> {
    let mentions = |spec: Option<&PodSpec>| {
        spec.is_some_and(|spec| {
            spec.containers.iter().any(|c| {
                let words = c.command.iter().chain(c.args.iter()).flatten();
                words.into_iter().any(|w| w.contains("ip-control-loop") || w.contains("ip-reconciler"))
            })
        })
    };
    let named = |kind: &str, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        let (ns, name) = (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default());
        format!("{kind} {ns}/{name}")
    };
    let lp = ListParams::default();
    let mut found = Vec::new();
    let sets = Api::<DaemonSet>::all(client.clone()).list(&lp).await.map_err(|e| ("list DaemonSets", e))?;
    let sets = sets.items.iter().filter(|s| mentions(s.spec.template.spec.as_ref()));
    found.extend(sets.map(|s| named("DaemonSet", &s.metadata)));
    let deployments = Api::<Deployment>::all(client.clone()).list(&lp).await.map_err(|e| ("list Deployments", e))?;
    let deployments = deployments.items.iter().filter(|d| mentions(d.spec.template.spec.as_ref()));
    found.extend(deployments.map(|d| named("Deployment", &d.metadata)));
    let jobs = Api::<CronJob>::all(client.clone()).list(&lp).await.map_err(|e| ("list CronJobs", e))?;
    let template = |j: &CronJob| j.spec.job_template.spec.as_ref().and_then(|s| s.template.spec.as_ref()).cloned();
    found.extend(jobs.items.iter().filter(|j| mentions(template(j).as_ref())).map(|j| named("CronJob", &j.metadata)));
    Ok((!found.is_empty()).then(|| {
        let verb = if found.len() == 1 { "runs" } else { "run" };
        format!("{} {verb} Whereabouts' reconciler", found.join(", "))
    }))
}
