//! The node loop: watches this node's Pods only (field selector `spec.nodeName`) and gives back what a pod held
//! once it is deleted or finished; in the cluster scope (the controller Deployment), every node's Pods, and only
//! while its instance leads. A release that fails, or that meets an entry too fresh to judge, goes into a
//! retry queue with backoff instead of waiting for the cron. After every (re)list, and periodically, it resyncs:
//! entries recorded on this node whose pod is no longer there, and this node's reservations that no entry
//! accounts for, are judged too.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt as _;
use hereabouts_ipam::claim::understand;
use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_ipam::store::{NETWORK_ANNOTATION, Store};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::Store as Cache;
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use hereabouts_ipam::reconcile::rules::{Index, Keep, KnownPod, suspicious};
use hereabouts_ipam::reconcile::{Cluster, Considered, Releaser, ReservationOutcome, Views, entries, is_finished};

use crate::http::Health;
use crate::leader::Leadership;

/// The longest a failed release waits before it is tried again.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

fn podref(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn known(pod: &Pod) -> KnownPod {
    KnownPod { uid: pod.metadata.uid.clone().unwrap_or_default(), finished: is_finished(pod) }
}

/// A gone pod whose release must be tried again.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Retry {
    podref: String,
    uid: String,
    attempt: u32,
}

/// Releases to try again, by when.
#[derive(Debug, Default)]
struct Retries {
    due: BTreeMap<(Instant, u64), Retry>,
    seq: u64,
}

impl Retries {
    fn schedule(&mut self, retry: Retry, after: Duration) {
        self.seq += 1;
        self.due.insert((Instant::now() + after, self.seq), retry);
    }

    fn next_due(&self) -> Option<Instant> {
        self.due.keys().next().map(|(at, _)| *at)
    }

    fn take_due(&mut self) -> Vec<Retry> {
        let now = Instant::now();
        let later = self.due.split_off(&(now, u64::MAX));
        std::mem::replace(&mut self.due, later).into_values().collect()
    }
}

/// The backoff before attempt `attempt` (from 1) of a failed release: 1 s, 2 s, 4 s, ... up to 5 min.
fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1 << attempt.min(9)).min(MAX_BACKOFF)
}

/// What the node loop works from: the caches of every pool and of this node's reservations.
pub struct NodeLoop<S, C> {
    pub releaser: Arc<Releaser<S, C, Arc<Health>>>,
    pub pools: Cache<IpPool>,
    pub reservations: Cache<OverlappingRangeIpReservation>,
    /// The node whose pods it watches; `None`: every node's.
    pub node: Option<String>,
    /// How often the node's entries and reservations are looked at even without an event.
    pub resync_every: Duration,
    /// When given, it releases nothing while this instance does not hold the Lease (it keeps watching, and its
    /// first resync as the leader catches up with what went meanwhile).
    pub leadership: Option<Leadership>,
}

impl<S, C> std::fmt::Debug for NodeLoop<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLoop").field("node", &self.node).finish_non_exhaustive()
    }
}

impl<S: Store, C: Cluster> NodeLoop<S, C> {
    /// Runs until `shutdown`.
    pub async fn run(self, pods: Api<Pod>, shutdown: CancellationToken) {
        let config = match &self.node {
            Some(node) => watcher::Config::default().fields(&format!("spec.nodeName={node}")),
            None => watcher::Config::default(),
        };
        let mut events = watcher::watcher(pods, config).default_backoff().boxed();
        let mut on_node: HashMap<String, KnownPod> = HashMap::new();
        let mut listing: HashMap<String, KnownPod> = HashMap::new();
        let mut synced = false;
        let mut retries = Retries::default();
        let mut resync_at: Option<Instant> = None;
        let health = &self.releaser.tally;
        loop {
            let next = [retries.next_due(), resync_at].into_iter().flatten().min();
            let wake = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let event = tokio::select! {
                () = shutdown.cancelled() => return,
                () = wake => {
                    for retry in retries.take_due() {
                        self.release_pod(retry, &mut retries).await;
                    }
                    if synced && resync_at.is_some_and(|at| at <= Instant::now()) {
                        resync_at = Some(self.resync(&on_node).await);
                    }
                    continue;
                }
                // a follower looks again as soon as it leads
                () = self.leads_again(), if synced && !self.acts() => {
                    resync_at = Some(self.resync(&on_node).await);
                    continue;
                }
                event = events.next() => event,
            };
            match event {
                None => return,
                Some(Err(e)) => {
                    // not ready while the watch fails: releases would then wait for the next relist
                    health.ready.store(false, Ordering::Relaxed);
                    tracing::warn!(error = %e, "pod watch failed; retrying");
                }
                Some(Ok(Event::Init)) => listing.clear(),
                Some(Ok(Event::InitApply(pod))) => {
                    listing.insert(podref(&pod), known(&pod));
                }
                Some(Ok(Event::InitDone)) => {
                    on_node = std::mem::take(&mut listing);
                    if self.pools.wait_until_ready().await.is_err()
                        || self.reservations.wait_until_ready().await.is_err()
                    {
                        return;
                    }
                    synced = true;
                    resync_at = Some(self.resync(&on_node).await);
                    health.ready.store(true, Ordering::Relaxed);
                }
                Some(Ok(Event::Apply(pod))) => {
                    health.ready.store(true, Ordering::Relaxed);
                    let info = known(&pod);
                    let key = podref(&pod);
                    let newly_finished =
                        info.finished && on_node.get(&key).is_none_or(|k| !k.finished || k.uid != info.uid);
                    on_node.insert(key.clone(), info.clone());
                    if newly_finished {
                        self.release_pod(Retry { podref: key, uid: info.uid, attempt: 0 }, &mut retries).await;
                    }
                }
                Some(Ok(Event::Delete(pod))) => {
                    health.ready.store(true, Ordering::Relaxed);
                    let key = podref(&pod);
                    on_node.remove(&key);
                    let uid = known(&pod).uid;
                    self.release_pod(Retry { podref: key, uid, attempt: 0 }, &mut retries).await;
                }
            }
        }
    }

    /// Whether it may release now: always, but in the cluster scope only while this instance leads.
    fn acts(&self) -> bool {
        self.leadership.as_ref().is_none_or(Leadership::is_leader)
    }

    /// Returns once this instance leads (never without an election).
    async fn leads_again(&self) {
        loop {
            if self.leadership.as_ref().is_some_and(Leadership::is_leader) {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Gives back every entry naming the pod of `retry`, told that the pod with its UID is gone or finished;
    /// what fails or is too fresh to judge is scheduled again. A follower releases nothing: the leader's loop
    /// sees the same events, and its resyncs what it missed.
    async fn release_pod(&self, retry: Retry, retries: &mut Retries) {
        if !self.acts() {
            return;
        }
        let Some(pools) = self.understood(|p| p.spec.allocations.values().any(|a| a.podref == retry.podref)).await
        else {
            retries.schedule(Retry { attempt: retry.attempt + 1, ..retry.clone() }, backoff(retry.attempt + 1));
            return;
        };
        let mut views = Views::new();
        let mut again = None;
        for (pool, offset, held) in entries(&pools, |a| a.podref == retry.podref) {
            match self.releaser.consider(pool, offset, held, Some(&retry.uid), &mut views).await {
                Considered::Failed => again = Some(backoff(retry.attempt + 1)),
                Considered::Kept(Keep::Fresh) => again = again.or(Some(self.releaser.grace)),
                _ => {}
            }
        }
        if let Some(after) = again {
            self.releaser.tally.metrics.retries.inc();
            tracing::debug!(podref = %retry.podref, attempt = retry.attempt + 1, ?after, "release scheduled again");
            retries.schedule(Retry { attempt: retry.attempt + 1, ..retry }, after);
        }
    }

    /// The watched pools that `wanted` selects, each read with its network: a slice pool Whereabouts made (no
    /// network annotation) is understood through the NodeSlicePools, listed after the pools were read. `None` when
    /// they cannot be listed: a release is then tried again later rather than judged on a misread name.
    async fn understood(&self, wanted: impl Fn(&IpPool) -> bool) -> Option<Vec<IpPool>> {
        let mut pools: Vec<IpPool> = self.pools.state().iter().filter(|p| wanted(p)).map(|p| (**p).clone()).collect();
        let annotated =
            |p: &IpPool| p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(NETWORK_ANNOTATION));
        if pools.iter().all(annotated) {
            return Some(pools);
        }
        match self.releaser.store.list_node_slices().await {
            Ok(listed) => {
                understand(&mut pools, &listed);
                Some(pools)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the NodeSlicePools to read Whereabouts' slice pools; later");
                None
            }
        }
    }

    /// Judges every entry recorded on this node whose pod is not, or no longer, a live pod of this node, and
    /// this node's reservations. Returns when to look again.
    async fn resync(&self, on_node: &HashMap<String, KnownPod>) -> Instant {
        if !self.acts() {
            return Instant::now() + self.resync_every;
        }
        self.releaser.tally.metrics.node_resyncs.inc();
        let Some(pools) = self.understood(|_| true).await else {
            return Instant::now() + self.releaser.grace.max(Duration::from_secs(1));
        };
        let mut views = Views::new();
        let mut soon = false;
        let looked_at = |a: &hereabouts_ipam::crd::IpAllocation| match &self.node {
            Some(node) => suspicious(a, node, on_node),
            // every node's: each entry judged as its own node's loop would, against every live pod
            None => a.node.as_deref().is_some_and(|node| suspicious(a, node, on_node)),
        };
        for (pool, offset, held) in entries(&pools, looked_at) {
            let outcome = self.releaser.consider(pool, offset, held, None, &mut views).await;
            soon |= matches!(outcome, Considered::Kept(Keep::Fresh) | Considered::Failed);
        }
        let index = Index::new(&pools);
        for reservation in self.reservations.state() {
            let outcome = self.releaser.consider_reservation(&reservation, &index).await;
            soon |= outcome == ReservationOutcome::Failed;
        }
        let after = if soon { self.releaser.grace.max(Duration::from_secs(1)) } else { self.resync_every };
        Instant::now() + after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(30), MAX_BACKOFF);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_come_due_in_order() {
        let mut retries = Retries::default();
        let r = |p: &str| Retry { podref: p.into(), uid: "u".into(), attempt: 1 };
        retries.schedule(r("b"), Duration::from_secs(2));
        retries.schedule(r("a"), Duration::from_secs(1));
        assert!(retries.take_due().is_empty());
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(retries.take_due(), [r("a")]);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(retries.take_due(), [r("b")]);
        assert_eq!(retries.next_due(), None);
    }
}
