//! What an ADD reads of its pod and node besides the pools: for ranges chosen per pod, the pod's and its
//! namespace's annotation and the node's labels; for a sticky range, the StatefulSet that controls the pod. The
//! choice itself is [`RangeSelection::choose`]'s. A config that uses none of this reads nothing.

use crate::budget::Budget;
use crate::config::{IpamConfig, RANGES_ANNOTATION, RangeFacts, RangeSelection};
use crate::error::IpamError;
use crate::store::{CoreObject, CoreStore, ObjectMeta, StoreError};

/// The ClusterRole that grants the CNI plugin what a range choice reads (deploy/, the chart).
pub const RANGES_CLUSTER_ROLE: &str = "hereabouts-cni-ranges";
/// The chart's value that adds [`RANGES_CLUSTER_ROLE`]; off by default, since it lets every host read every pod.
pub const RANGES_VALUE: &str = "cni.rangeChoice=true";
/// The ClusterRole that grants the CNI plugin what persistent addresses read and write (pods, IPAMClaims).
pub const IPAMCLAIMS_CLUSTER_ROLE: &str = "hereabouts-cni-ipamclaims";
/// The chart's value that adds [`IPAMCLAIMS_CLUSTER_ROLE`]; off by default.
pub const IPAMCLAIMS_VALUE: &str = "cni.persistentIPs=true";

/// What this ADD (or CHECK) of pod `cfg.pod` on `node` chose: the indices of the ranges of `cfg` it uses, and the
/// StatefulSet that controls the pod (sticky ranges). `None` when `selection` chooses nothing, so every range is
/// used.
pub(crate) async fn choose_ranges(
    store: &impl CoreStore,
    cfg: &IpamConfig,
    selection: &RangeSelection,
    node: &str,
    pod: &PodOnce,
    budget: &Budget,
) -> Result<Option<(Vec<usize>, Option<String>)>, IpamError> {
    if !selection.is_active() {
        return Ok(None);
    }
    let mut facts = RangeFacts::default();
    if selection.reads_pod() {
        let pod = pod.get(store, cfg, budget, refused_read).await?;
        if selection.sticky.contains(&true) {
            facts.statefulset = pod.and_then(|meta| statefulset_of(meta, &cfg.pod.name));
        }
        if selection.by_pod {
            facts.pod = pod.and_then(annotation);
            if !facts.pod.as_deref().is_some_and(|v| RangeSelection::decides(v, &cfg.name)) {
                let ns = read(store, CoreObject::Namespace, "", &cfg.pod.namespace, budget).await?;
                facts.namespace = ns.as_ref().and_then(annotation);
            }
        }
    }
    if selection.reads_node() {
        let meta = read(store, CoreObject::Node, "", node, budget).await?;
        facts.node_labels = meta.map(|m| m.labels.unwrap_or_default());
    }
    let keep = selection.choose(cfg, node, &facts).map_err(IpamError::Choice)?;
    tracing::debug!(
        ranges = %keep.iter().map(|i| cfg.ranges[*i].cidr().to_string()).collect::<Vec<_>>().join(","),
        pod_annotation = facts.pod.as_deref().unwrap_or(""),
        statefulset = facts.statefulset.as_deref().unwrap_or(""),
        namespace_annotation = facts.namespace.as_deref().unwrap_or(""),
        "ranges chosen"
    );
    Ok(Some((keep, facts.statefulset)))
}

/// The StatefulSet that controls the pod, if one does and the pod is named `<statefulset>-<ordinal>` as its pods
/// are (the reconciler finds the ordinal in the name).
fn statefulset_of(meta: &ObjectMeta, pod: &str) -> Option<String> {
    let owner = meta.owner_references.as_ref()?.iter().find(|o| {
        o.controller == Some(true) && o.kind == "StatefulSet" && o.api_version.split('/').next() == Some("apps")
    })?;
    statefulset_ordinal(pod, &owner.name).map(|_| owner.name.clone())
}

/// The ordinal of pod `pod` as a pod of StatefulSet `statefulset` (`<statefulset>-<ordinal>`, no leading zero).
pub fn statefulset_ordinal(pod: &str, statefulset: &str) -> Option<i32> {
    let digits = pod.strip_prefix(statefulset)?.strip_prefix('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}

/// The metadata of the invocation's pod, read once whoever asks first (ranges chosen per pod, a sticky range, the
/// IPAMClaim in its network selection elements, its preferred address): one GET however many of them a config uses.
#[derive(Debug, Default)]
pub(crate) struct PodOnce(tokio::sync::OnceCell<Option<ObjectMeta>>);

impl PodOnce {
    /// The pod's metadata (`None`: no such pod), read now if no one has; a failure is `hint`'s, naming the grant
    /// its caller's feature needs, and is not kept.
    pub async fn get(
        &self,
        store: &impl CoreStore,
        cfg: &IpamConfig,
        budget: &Budget,
        hint: impl FnOnce(&str, crate::budget::RetryError<StoreError>) -> IpamError,
    ) -> Result<Option<&ObjectMeta>, IpamError> {
        let (namespace, name) = (&cfg.pod.namespace, &cfg.pod.name);
        let read = self
            .0
            .get_or_try_init(|| async {
                let what = format!("pod {namespace}/{name}: get");
                budget
                    .retry(StoreError::is_transient, || store.core_metadata(CoreObject::Pod, namespace, name))
                    .await
                    .map_err(|e| hint(&what, e))
            })
            .await?;
        Ok(read.as_ref())
    }
}

fn annotation(meta: &ObjectMeta) -> Option<String> {
    meta.annotations.as_ref()?.get(RANGES_ANNOTATION).cloned()
}

async fn read(
    store: &impl CoreStore,
    kind: CoreObject,
    namespace: &str,
    name: &str,
    budget: &Budget,
) -> Result<Option<ObjectMeta>, IpamError> {
    let what = match kind {
        CoreObject::Pod => format!("{} {namespace}/{name}: get", kind.kind()),
        _ => format!("{} {name}: get", kind.kind()),
    };
    budget
        .retry(StoreError::is_transient, || store.core_metadata(kind, namespace, name))
        .await
        .map_err(|e| refused_read(&what, e))
}

/// The failure of the read `what` of a pod, namespace or node, saying which grant a refusal (403) wants.
pub(super) fn refused_read(what: &str, err: crate::budget::RetryError<StoreError>) -> IpamError {
    match IpamError::from_retry(what, err) {
        IpamError::Store(e) if e.status_code() == Some(403) => IpamError::Refused {
            what: what.to_string(),
            message: format!(
                "{}; ranges chosen per pod or node, sticky StatefulSet addresses and a preferred address read pods, \
                 namespaces and nodes: bind the CNI's ServiceAccount to the ClusterRole {RANGES_CLUSTER_ROLE} (the \
                 chart's value {RANGES_VALUE})",
                e.message
            ),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn owned_by(kind: &str, api_version: &str, name: &str, controller: bool) -> ObjectMeta {
        let owner = OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            controller: Some(controller),
            block_owner_deletion: None,
        };
        ObjectMeta { owner_references: Some(vec![owner]), ..Default::default() }
    }

    #[test]
    fn only_a_controlling_statefulset_of_the_pods_name_is_the_owner() {
        assert_eq!(statefulset_of(&owned_by("StatefulSet", "apps/v1", "web", true), "web-3"), Some("web".into()));
        assert_eq!(
            statefulset_of(&owned_by("StatefulSet", "apps/v1", "web", false), "web-3"),
            None,
            "not the controller"
        );
        assert_eq!(statefulset_of(&owned_by("ReplicaSet", "apps/v1", "web", true), "web-3"), None);
        assert_eq!(
            statefulset_of(&owned_by("StatefulSet", "example.com/v1", "web", true), "web-3"),
            None,
            "another group"
        );
        for name in ["web-", "web-x", "webby-3", "db-0", "web-01"] {
            assert_eq!(statefulset_of(&owned_by("StatefulSet", "apps/v1", "web", true), name), None, "{name}");
        }
        assert_eq!(statefulset_of(&ObjectMeta::default(), "web-0"), None);
    }
}
