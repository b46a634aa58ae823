//! Whether Whereabouts' reconciler runs in the cluster: it would free a node's warm entries as entries of no pod,
//! so no node keeps a reserve where it does. The node agent asks before its first reserve; the benchmark too.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::PodSpec;
use kube::Api;
use kube::api::ListParams;

/// What names Whereabouts' reconciler (its DaemonSet's `ip-control-loop`, or its older `ip-reconciler` CronJob:
/// a container whose command or args mention one), if one exists; `Err` when DaemonSets or CronJobs cannot be
/// listed, with what failed.
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
        format!("{kind} {ns}/{name} runs Whereabouts' reconciler")
    };
    let lp = ListParams::default();
    let sets = Api::<DaemonSet>::all(client.clone()).list(&lp).await.map_err(|e| ("list DaemonSets", e))?;
    if let Some(set) = sets.items.iter().find(|s| mentions(s.spec.template.spec.as_ref())) {
        return Ok(Some(named("DaemonSet", &set.metadata)));
    }
    let jobs = Api::<CronJob>::all(client.clone()).list(&lp).await.map_err(|e| ("list CronJobs", e))?;
    let template = |j: &CronJob| j.spec.job_template.spec.as_ref().and_then(|s| s.template.spec.as_ref()).cloned();
    Ok(jobs.items.iter().find(|j| mentions(template(j).as_ref())).map(|j| named("CronJob", &j.metadata)))
}
