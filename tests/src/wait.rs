//! Waiting for something to happen — the API server to show a condition, a process to act, a route to appear —
//! by polling it with a deadline, and failing with what did not happen: never a sleep that hopes it happened.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::bail;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

/// Polls `check` every 100 ms until it returns `Some`, or fails after `timeout` naming `what`.
pub async fn until<T, F, Fut>(timeout: Duration, what: &str, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    until_every(timeout, Duration::from_millis(100), what, check).await
}

/// [`until`], polling every `interval`: for what must be seen within a few milliseconds of happening (a
/// claim made while the routing daemons are paused).
pub async fn until_every<T, F, Fut>(
    timeout: Duration,
    interval: Duration,
    what: &str,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// Waits until the CRD `name` reports the `Established` condition.
pub async fn crd_established(api: &Api<CustomResourceDefinition>, name: &str) -> anyhow::Result<()> {
    until(Duration::from_secs(30), &format!("CRD {name} to be established"), || async {
        let crd = api.get(name).await.ok()?;
        let established = crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
        established.then_some(())
    })
    .await
}

/// Waits until the resources of `crd` list without error: after a CRD is replaced the API server rebuilds their
/// storage and, though the CRD stays Established, answers 429 "storage is (re)initializing" for a moment.
pub async fn crd_served(client: &kube::Client, crd: &CustomResourceDefinition) -> anyhow::Result<()> {
    let version = crd.spec.versions.iter().find(|v| v.storage).map(|v| v.name.clone()).unwrap_or_default();
    let names = &crd.spec.names;
    let resource = kube::discovery::ApiResource {
        group: crd.spec.group.clone(),
        version: version.clone(),
        api_version: format!("{}/{version}", crd.spec.group),
        kind: names.kind.clone(),
        plural: names.plural.clone(),
    };
    let api = Api::<kube::core::DynamicObject>::all_with(client.clone(), &resource);
    until(Duration::from_secs(30), &format!("{} to be served", names.plural), || async {
        api.list(&kube::api::ListParams::default().limit(1)).await.ok().map(|_| ())
    })
    .await
}
