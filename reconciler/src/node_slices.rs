//! The leader as the node-slice controller ([`Keeper`]): which Nodes exist, and which of them get a slice without
//! asking, come from the API server here. By default no node is given one: a node running hereabouts claims its
//! own on its first ADD, so slices go only to nodes that run the network. A mixed fleet, whose Whereabouts CNI in
//! fast IPAM never claims one, names its nodes with `--assign-slices-to` (a label selector); those are watched, and
//! a Node that joins gets its slice when it appears, not at the next pass.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use hereabouts_ipam::crd::NodeSlicePool;
use hereabouts_ipam::slices::keep::{Keeper, Kept};
use hereabouts_ipam::store::{Store, StoreError};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{ListParams, PartialObjectMeta};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::leader::Leadership;

/// Why a pass could not be made.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    #[error("node list failed")]
    Nodes(#[source] kube::Error),
    #[error("node slice pool list failed")]
    Store(#[source] StoreError),
}

/// The keeper and where its Nodes come from.
#[derive(Debug)]
pub struct SliceKeeper<S> {
    pub keeper: Keeper<S>,
    pub nodes: Api<Node>,
    /// The label selector of the Nodes given a slice without asking; `None`: none is.
    pub assign_to: Option<String>,
}

impl<S: Store> SliceKeeper<S> {
    pub fn new(store: S, nodes: Api<Node>, grace: Duration, assign_to: Option<String>) -> Self {
        Self { keeper: Keeper::new(store, grace), nodes, assign_to }
    }

    /// One pass over every NodeSlicePool of the namespace.
    pub async fn pass(&mut self) -> Result<Kept, KeepError> {
        let live = self.names(&ListParams::default()).await?;
        let assign = match &self.assign_to {
            Some(selector) => self.names(&ListParams::default().labels(selector)).await?,
            None => BTreeSet::new(),
        };
        self.keeper.pass(&live, &assign).await.map_err(KeepError::Store)
    }

    async fn names(&self, params: &ListParams) -> Result<BTreeSet<String>, KeepError> {
        let listed = self.nodes.list_metadata(params).await.map_err(KeepError::Nodes)?;
        Ok(listed.items.into_iter().filter_map(|n| n.metadata.name).collect())
    }
}

/// Makes a pass every `every` while this instance leads, and at once when a Node to assign slices to appears,
/// until `shutdown`. A failing pass is logged when it first fails (or fails differently), not on every try.
pub async fn run<S: Store>(
    mut keeper: SliceKeeper<S>,
    leadership: Leadership,
    every: Duration,
    passes: prometheus_client::metrics::counter::Counter,
    shutdown: CancellationToken,
) {
    let joined = Arc::new(Notify::new());
    if let Some(selector) = keeper.assign_to.clone() {
        let nodes: Api<PartialObjectMeta<Node>> = Api::all(keeper.nodes.clone().into_client());
        let config = watcher::Config::default().labels(&selector);
        tokio::spawn(watch_new("node", nodes, config, joined.clone(), shutdown.clone()));
        // a NodeSlicePool a node's first ADD just created has slices to give too
        let listings: Api<PartialObjectMeta<NodeSlicePool>> =
            Api::namespaced(keeper.nodes.clone().into_client(), keeper.keeper.store.namespace());
        tokio::spawn(watch_new(
            "node slice pool",
            listings,
            watcher::Config::default(),
            joined.clone(),
            shutdown.clone(),
        ));
    }
    let mut failing: Option<String> = None;
    // something appeared that this instance could not act on yet (not the leader yet): look again shortly
    let mut pending = false;
    loop {
        let retry = async {
            if pending {
                tokio::time::sleep(Duration::from_millis(500)).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            turn = leadership.next_turn(every, &shutdown) => if !turn { return },
            () = joined.notified() => pending = true,
            () = retry => {}
        }
        if !leadership.is_leader() {
            continue;
        }
        pending = false;
        let outcome = keeper.pass().await;
        passes.inc();
        match outcome {
            Ok(kept) => {
                failing = None;
                // a slice a node claimed between the read and the move: the next pass decides again, soon
                pending = kept.deferred > 0;
                if kept != Kept::default() {
                    tracing::info!(
                        assigned = kept.assigned,
                        freed = kept.freed,
                        returned = kept.returned,
                        joined = kept.joined,
                        unowned = kept.unowned,
                        deferred = kept.deferred,
                        "node slices kept"
                    );
                }
            }
            Err(e) => {
                let message = crate::error_chain(&e);
                if failing.as_deref() != Some(message.as_str()) {
                    tracing::warn!(error = %message, "node slice pass failed; retrying");
                    failing = Some(message);
                }
            }
        }
    }
}

/// Wakes the keeper when an object `api` and `config` select appears that was not there before (a Node that
/// joins, a NodeSlicePool just created).
async fn watch_new<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
    joined: Arc<Notify>,
    shutdown: CancellationToken,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    // logged when it starts failing, not on every retry
    let mut failing = false;
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut listing: BTreeSet<String> = BTreeSet::new();
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            event = events.next() => event,
        };
        let event = match event {
            None => return,
            Some(Err(e)) => {
                if !failing {
                    tracing::warn!(error = %crate::error_chain(&e), "{what} watch failed; retrying (joins wait for the next pass)");
                }
                failing = true;
                continue;
            }
            Some(Ok(event)) => event,
        };
        failing = false;
        match event {
            watcher::Event::Init => listing.clear(),
            watcher::Event::InitApply(object) => {
                listing.extend(object.meta().name.clone());
            }
            watcher::Event::InitDone => {
                let new = listing.iter().any(|n| !known.contains(n));
                known = std::mem::take(&mut listing);
                if new {
                    joined.notify_one();
                }
            }
            watcher::Event::Apply(object) => {
                if let Some(name) = object.meta().name.clone()
                    && known.insert(name)
                {
                    joined.notify_one();
                }
            }
            watcher::Event::Delete(object) => {
                if let Some(name) = &object.meta().name {
                    known.remove(name);
                }
            }
        }
    }
}
