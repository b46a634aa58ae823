//! The node loop: watches this node's Pods only (field selector `spec.nodeName`) and gives back what a pod held
//! once it is deleted or finished. After every (re)list it resyncs: entries recorded on this node whose pod is no
//! longer there were missed while the watch was down, and are judged too.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt as _;
use hereabouts_ipam::crd::IpPool;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::Store as Cache;
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::decide::Keep;
use crate::release::{Considered, Releaser, entries, is_finished};

/// What the loop remembers of one pod of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Known {
    uid: String,
    finished: bool,
}

fn podref(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn known(pod: &Pod) -> Known {
    Known { uid: pod.metadata.uid.clone().unwrap_or_default(), finished: is_finished(pod) }
}

/// Runs until `shutdown`.
pub async fn run(
    releaser: Arc<Releaser>,
    pods: Api<Pod>,
    pools: Cache<IpPool>,
    node: String,
    shutdown: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = watcher::watcher(pods, config).default_backoff().boxed();
    let mut on_node: HashMap<String, Known> = HashMap::new();
    let mut listing: HashMap<String, Known> = HashMap::new();
    let mut recheck: Option<Instant> = None;
    loop {
        let recheck_due = async {
            match recheck {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            () = recheck_due => {
                recheck = resync(&releaser, &pools, &node, &on_node).await;
                continue;
            }
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Err(e)) => {
                // not ready while the watch fails: releases would then wait for the next relist
                releaser.health.ready.store(false, Ordering::Relaxed);
                tracing::warn!(error = %e, "pod watch failed; retrying");
            }
            Some(Ok(Event::Init)) => listing.clear(),
            Some(Ok(Event::InitApply(pod))) => {
                listing.insert(podref(&pod), known(&pod));
            }
            Some(Ok(Event::InitDone)) => {
                on_node = std::mem::take(&mut listing);
                if pools.wait_until_ready().await.is_err() {
                    return;
                }
                recheck = resync(&releaser, &pools, &node, &on_node).await;
                releaser.health.ready.store(true, Ordering::Relaxed);
            }
            Some(Ok(Event::Apply(pod))) => {
                releaser.health.ready.store(true, Ordering::Relaxed);
                let info = known(&pod);
                let key = podref(&pod);
                let newly_finished =
                    info.finished && on_node.get(&key).is_none_or(|k| !k.finished || k.uid != info.uid);
                on_node.insert(key.clone(), info.clone());
                if newly_finished {
                    release_pod(&releaser, &pools, &key, &info.uid).await;
                }
            }
            Some(Ok(Event::Delete(pod))) => {
                releaser.health.ready.store(true, Ordering::Relaxed);
                let key = podref(&pod);
                on_node.remove(&key);
                release_pod(&releaser, &pools, &key, &known(&pod).uid).await;
            }
        }
    }
}

/// Gives back every entry naming `podref`, told that the pod with `uid` is gone or finished.
async fn release_pod(releaser: &Releaser, pools: &Cache<IpPool>, podref: &str, uid: &str) {
    let state = pools.state();
    let mut views = HashMap::new();
    for (pool, offset, held) in entries(&state, |a| a.podref == podref) {
        releaser.consider(pool, offset, held, Some(uid), &mut views).await;
    }
}

/// Judges every entry recorded on this node whose pod is not, or no longer, a live pod of this node. Returns when
/// to look again, if some entry was too fresh to judge.
async fn resync(
    releaser: &Releaser,
    pools: &Cache<IpPool>,
    node: &str,
    on_node: &HashMap<String, Known>,
) -> Option<Instant> {
    let state = pools.state();
    let suspicious = |a: &hereabouts_ipam::crd::IpAllocation| {
        a.node.as_deref() == Some(node)
            && match on_node.get(&a.podref) {
                None => true,
                Some(k) => k.finished || a.poduid.as_deref().is_some_and(|u| u != k.uid),
            }
    };
    let mut views = HashMap::new();
    let mut fresh = false;
    for (pool, offset, held) in entries(&state, suspicious) {
        let outcome = releaser.consider(pool, offset, held, None, &mut views).await;
        fresh |= matches!(outcome, Considered::Kept(Keep::Fresh) | Considered::Failed);
    }
    fresh.then(|| Instant::now() + releaser.grace.max(Duration::from_secs(1)))
}
