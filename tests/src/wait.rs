//! Polling until the API server shows a condition.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::bail;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

/// Polls `check` every 100 ms until it returns `Some`, or fails after `timeout` naming `what`.
pub async fn until<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<T>
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
        tokio::time::sleep(Duration::from_millis(100)).await;
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
