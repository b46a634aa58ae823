//! Judging and giving back one allocation: re-read its pod, [`judge`], reclaim with the guarded patch, then count
//! it and tell the pod's Events.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::crd::{IpAllocation, IpPool};
use hereabouts_ipam::ipam::{Reclaimed, address_of, reclaim};
use hereabouts_ipam::store::Store;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::runtime::events::{Event, EventType, Recorder};

use crate::decide::{Facts, Keep, PodView, Reason, Verdict, judge};
use crate::http::Health;

/// Time one release may take, retries included.
const RELEASE_BUDGET: Duration = Duration::from_secs(30);

/// Everything a release needs; shared by the node loop and the cluster reconcile.
pub struct Releaser {
    pub store: Store,
    pub pods: Api<Pod>,
    pub recorder: Recorder,
    pub health: Arc<Health>,
    pub grace: Duration,
}

impl std::fmt::Debug for Releaser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Releaser").field("store", &self.store).field("grace", &self.grace).finish_non_exhaustive()
    }
}

/// The outcome of considering one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Considered {
    Released(Reason),
    Kept(Keep),
    /// The entry changed under us: someone else released or re-assigned it.
    Changed,
    /// The pod could not be read, or the release failed: try again later.
    Failed,
}

fn split_podref(podref: &str) -> Option<(&str, &str)> {
    podref.split_once('/').filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
}

impl Releaser {
    /// The pod `podref` names, as the API server has it now (not a cache: a cache may be stale).
    pub async fn pod_view(&self, podref: &str) -> Result<PodView, kube::Error> {
        let Some((ns, name)) = split_podref(podref) else { return Ok(PodView::Missing) };
        let pod = Api::<Pod>::namespaced(self.pods.clone().into_client(), ns).get_opt(name).await?;
        Ok(match pod {
            None => PodView::Missing,
            Some(pod) => PodView::Present { finished: is_finished(&pod), uid: pod.metadata.uid.unwrap_or_default() },
        })
    }

    /// Judges the entry `held` at `offset` of `pool` and gives it back if its pod no longer holds it. `gone_uid`
    /// is the UID of a pod seen deleted or finished under that name; `views` caches pod reads within one pass.
    pub async fn consider(
        &self,
        pool: &IpPool,
        offset: u128,
        held: &IpAllocation,
        gone_uid: Option<&str>,
        views: &mut HashMap<String, PodView>,
    ) -> Considered {
        if split_podref(&held.podref).is_none() {
            // not a pod reference we can check: never guess
            return Considered::Kept(Keep::Live);
        }
        let view = match views.get(&held.podref) {
            Some(view) => view.clone(),
            None => match self.pod_view(&held.podref).await {
                Ok(view) => {
                    views.insert(held.podref.clone(), view.clone());
                    view
                }
                Err(e) => {
                    tracing::warn!(podref = %held.podref, error = %e, "cannot read the pod; keeping its address");
                    return Considered::Failed;
                }
            },
        };
        let facts = Facts { pod: &view, gone_uid, now: Timestamp::now(), grace: self.grace };
        let reason = match judge(held, &facts) {
            Verdict::Keep(keep) => return Considered::Kept(keep),
            Verdict::Release(reason) => reason,
        };
        let pool_name = pool.metadata.name.as_deref().unwrap_or_default();
        let ip = address_of(pool, offset).map_or_else(|| format!("offset {offset}"), |ip| ip.to_string());
        let metrics = &self.health.metrics;
        match reclaim(&self.store, pool, offset, held, &Budget::new(RELEASE_BUDGET)).await {
            Ok(Reclaimed::Released) => {
                metrics.count_release(reason.as_str());
                tracing::info!(pool = %pool_name, %ip, podref = %held.podref, reason = reason.as_str(), "released");
                let note = format!("released {ip} (pool {pool_name}, interface {}): {}", held.ifname, reason.as_str());
                self.publish(held, EventType::Normal, "AddressReleased", note).await;
                Considered::Released(reason)
            }
            Ok(Reclaimed::Changed) => {
                metrics.patch_conflicts.inc();
                tracing::debug!(pool = %pool_name, %ip, podref = %held.podref, "entry changed in between; left alone");
                Considered::Changed
            }
            Err(e) => {
                metrics.release_failures.inc();
                tracing::error!(pool = %pool_name, %ip, podref = %held.podref, error = %e, "release failed");
                self.publish(held, EventType::Warning, "AddressReleaseFailed", format!("{ip}: {e}")).await;
                Considered::Failed
            }
        }
    }

    async fn publish(&self, held: &IpAllocation, type_: EventType, reason: &str, note: String) {
        let Some((namespace, name)) = split_podref(&held.podref) else { return };
        let pod = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: held.poduid.clone(),
            ..Default::default()
        };
        let event = Event { type_, reason: reason.into(), note: Some(note), action: "Release".into(), secondary: None };
        if let Err(e) = self.recorder.publish(&event, &pod).await {
            tracing::debug!(podref = %held.podref, error = %e, "publishing the event failed");
        }
    }
}

/// Phase Succeeded or Failed.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Every entry of every pool in `pools` that `wanted` selects, with its offset.
pub fn entries(pools: &[Arc<IpPool>], wanted: impl Fn(&IpAllocation) -> bool) -> Vec<(&IpPool, u128, &IpAllocation)> {
    let mut found = Vec::new();
    for pool in pools {
        for (key, held) in &pool.spec.allocations {
            if let (true, Ok(offset)) = (wanted(held), key.parse()) {
                found.push((pool.as_ref(), offset, held));
            }
        }
    }
    found
}
