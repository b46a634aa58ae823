//! What the release rules ask of the cluster besides the store: the pod an entry names, read fresh (the Node, for
//! a warm entry), and Events on pods. [`KubeCluster`] is the API server; tests and `kubectl hereabouts` give
//! their own.

use std::future::Future;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client};

use super::rules::{NodeView, PodView, StatefulSetView, podref_parts};

/// The annotation a mirror pod carries: the kubelet's UID of the static pod it mirrors.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// An Event about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// Whether it warns.
    pub warning: bool,
    /// `AddressReleased`, `AddressReleaseFailed`, `ReservationRestored`, `AddressConflict`.
    pub reason: &'static str,
    /// What happened, for people.
    pub note: String,
}

/// Pods, Nodes and Events.
pub trait Cluster: Send + Sync {
    /// The pod `podref` names, as the API server has it now (not a cache: a cache may be stale).
    fn pod(&self, podref: &str) -> impl Future<Output = Result<PodView, String>> + Send;

    /// The StatefulSet `name` in `namespace`, as the API server has it now; `None` when it does not exist. Read
    /// only for sticky entries.
    fn statefulset(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<StatefulSetView>, String>> + Send;

    /// The addresses the IPAMClaim `name` in `namespace` records (`status.ips`), as the API server has it now;
    /// `None` when the claim does not exist. Read only for entries of a claim.
    fn ipamclaim(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Vec<String>>, String>> + Send;

    /// Whether the Node `name` exists, as the API server has it now (not a cache). Read only for warm entries.
    fn node(&self, name: &str) -> impl Future<Output = Result<NodeView, String>> + Send;

    /// Tells the pod `podref` (UID `uid`, when known) what happened, best effort. A `podref` that names no pod (a
    /// warm entry's) is told nothing.
    fn publish(&self, podref: &str, uid: Option<&str>, notice: Notice) -> impl Future<Output = ()> + Send;
}

/// The API server's pods and an Event recorder.
pub struct KubeCluster {
    client: Client,
    recorder: Recorder,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// Pods read and Events recorded through `client`.
    pub fn new(client: Client, recorder: Recorder) -> Self {
        Self { client, recorder }
    }
}

/// What a pod looks like to the rules.
pub fn view_of(pod: &Pod) -> PodView {
    PodView::Present {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        finished: is_finished(pod),
        mirror: pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
    }
}

/// Phase Succeeded or Failed.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Reads the StatefulSet `name` in `namespace` (metadata and spec are all the rules need).
/// The addresses the IPAMClaim `name` in `namespace` records, or `None` when it does not exist (a cluster without
/// the IPAMClaim CRD has none: its 404 says so).
pub async fn read_ipamclaim(client: &Client, namespace: &str, name: &str) -> Result<Option<Vec<String>>, String> {
    let api: Api<crate::crd::IpamClaim> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(found) => Ok(found.map(|c| c.status.map(|s| s.ips).unwrap_or_default())),
        // without the CRD the API server answers a plain 404 ("page not found"), which `get_opt` does not read as
        // a missing object: no claim exists there either
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(format!("get ipamclaim {namespace}/{name}: {e}")),
    }
}

pub async fn read_statefulset(client: &Client, namespace: &str, name: &str) -> Result<Option<StatefulSetView>, String> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    let found = Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| format!("get statefulset {namespace}/{name}: {e}"))?;
    Ok(found.map(|set| {
        let spec = &set.spec;
        StatefulSetView {
            replicas: spec.replicas.unwrap_or(1),
            start: spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0),
            deleting: set.metadata.deletion_timestamp.is_some(),
        }
    }))
}

/// Whether the Node `name` exists (its metadata is all that says so).
pub async fn read_node(client: &Client, name: &str) -> Result<NodeView, String> {
    let found =
        Api::<Node>::all(client.clone()).get_metadata_opt(name).await.map_err(|e| format!("get node {name}: {e}"))?;
    Ok(if found.is_some() { NodeView::Present } else { NodeView::Missing })
}

impl Cluster for KubeCluster {
    async fn pod(&self, podref: &str) -> Result<PodView, String> {
        let Some((ns, name)) = podref_parts(podref) else { return Ok(PodView::Missing) };
        let pod = Api::<Pod>::namespaced(self.client.clone(), ns).get_opt(name).await.map_err(|e| e.to_string())?;
        Ok(pod.as_ref().map_or(PodView::Missing, view_of))
    }

    async fn statefulset(&self, namespace: &str, name: &str) -> Result<Option<StatefulSetView>, String> {
        read_statefulset(&self.client, namespace, name).await
    }

    async fn ipamclaim(&self, namespace: &str, name: &str) -> Result<Option<Vec<String>>, String> {
        read_ipamclaim(&self.client, namespace, name).await
    }

    async fn node(&self, name: &str) -> Result<NodeView, String> {
        read_node(&self.client, name).await
    }

    async fn publish(&self, podref: &str, uid: Option<&str>, notice: Notice) {
        let Some((namespace, name)) = podref_parts(podref) else { return };
        let pod = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: uid.map(str::to_string),
            ..Default::default()
        };
        let event = Event {
            type_: if notice.warning { EventType::Warning } else { EventType::Normal },
            reason: notice.reason.into(),
            note: Some(notice.note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &pod).await {
            tracing::debug!(%podref, error = %e, "publishing the event failed");
        }
    }
}
