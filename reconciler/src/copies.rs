//! The agent's copies of what its node's ADDs plan on: per kubeconfig, a watch of the pools named as this node's
//! pools of a slice and of the NodeSlicePools, fed into that kubeconfig's [`Shared`] store. With them an
//! attachment's first ADD on the node plans without a read, however long the agent was idle and however many
//! entries the pools hold; the guards still decide, so a copy that lags only costs a refused write and a read.
//! Nothing else trusts them: an ADD that may find its own earlier entry reads (docs/design.md, "The node agent").

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use hereabouts_ipam::crd::{IpPool, NodeSlicePool};
use hereabouts_ipam::names;
use hereabouts_ipam::store::{KubeStore, PoolStore as _, Shared};
use kube::Api;
use kube::runtime::watcher::{self, Event};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use hereabouts_ipam::verbs::Host as _;

use crate::agent::AgentHost;

/// Pools per list page: a page is decoded whole before the pools of other nodes are dropped, and that peak stays
/// resident (a slice pool of 250 entries is ~40 kB of JSON).
const POOL_PAGE: u32 = 8;

/// The longest wait between two attempts to watch again after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Follows the pools of `node` and the NodeSlicePools through `kubeconfig`'s client (made again when the file
/// changes: install-cni rotates the token in it) for as long as the process runs; `synced` turns true once both
/// watches have listed everything, and false while they list again.
pub(crate) async fn follow(host: AgentHost, kubeconfig: PathBuf, node: Arc<str>, synced: watch::Sender<bool>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match host.connect(&kubeconfig).await {
            Ok(store) => {
                let (error, was_synced) = watch_once(&store, &node, &synced, &host.copied).await;
                let _ = synced.send(false);
                if was_synced {
                    backoff = Duration::from_secs(1);
                }
                tracing::warn!(kubeconfig = %kubeconfig.display(), error = %error,
                    "agent: the watch of the node's pools failed; its copies stay as they were until it lists again");
            }
            Err(e) => tracing::warn!(kubeconfig = %kubeconfig.display(), error = %e,
                "agent: cannot connect to watch the node's pools"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One watch of each kind through `store`'s client until either fails: the error, and whether both had listed.
async fn watch_once(
    store: &Shared<KubeStore>,
    node: &str,
    synced: &watch::Sender<bool>,
    copied: &Counter,
) -> (String, bool) {
    let client = store.inner().client().clone();
    let namespace = store.namespace().to_string();
    let pools = watcher::watcher(
        Api::<IpPool>::namespaced(client.clone(), &namespace),
        watcher::Config::default().page_size(POOL_PAGE),
    )
    .map(Seen::Pool);
    let slices = watcher::watcher(Api::<NodeSlicePool>::namespaced(client, &namespace), watcher::Config::default())
        .map(Seen::Slices);
    let mut events = std::pin::pin!(futures::stream::select(pools, slices));
    let (mut pools_listed, mut slices_listed) = (false, false);
    while let Some(seen) = events.next().await {
        match seen {
            Seen::Pool(Err(e)) | Seen::Slices(Err(e)) => return (e.to_string(), pools_listed && slices_listed),
            Seen::Pool(Ok(event)) => match event {
                Event::Apply(pool) | Event::InitApply(pool) if of_node(&pool, node) => {
                    store.observe_pool(&pool);
                    copied.inc();
                }
                Event::Delete(pool) => store.observe_pool_deleted(&pool),
                Event::Init => pools_listed = false,
                Event::InitDone => pools_listed = true,
                Event::Apply(_) | Event::InitApply(_) => {}
            },
            Seen::Slices(Ok(event)) => match event {
                Event::Apply(slices) | Event::InitApply(slices) => {
                    store.observe_slices(&slices);
                    copied.inc();
                }
                Event::Delete(slices) => store.observe_slices_deleted(&slices),
                Event::Init => slices_listed = false,
                Event::InitDone => slices_listed = true,
            },
        }
        synced.send_if_modified(|now| {
            let listed = pools_listed && slices_listed;
            std::mem::replace(now, listed) != listed
        });
    }
    ("the watch ended".into(), pools_listed && slices_listed)
}

/// Whether `pool` is named as `node`'s pool of a slice (its range).
fn of_node(pool: &IpPool, node: &str) -> bool {
    let (Some(name), Ok(range)) = (pool.metadata.name.as_deref(), pool.spec.range.parse::<ipnet::IpNet>()) else {
        return false;
    };
    names::may_be_slice_pool_of(name, node, range.trunc())
}

enum Seen {
    Pool(Result<Event<IpPool>, watcher::Error>),
    Slices(Result<Event<NodeSlicePool>, watcher::Error>),
}
