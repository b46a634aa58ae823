//! [`KubeStore`]: the live store, one API request per call, every guarded write the document [`super::guard`]
//! builds.

use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::Value;

use super::{
    Claim, CoreStore, Created, Deleted, Failure, Patched, PodEvent, PoolStore, ReservationStore, SliceStore,
    StoreError, SubInterfaceStore, Version, guard,
};
use crate::crd::{
    IpAllocation, IpPool, NodeSliceAllocation, NodeSlicePool, NodeSlicePoolSpec, OverlappingRangeIpReservation,
    SubInterfaceRecord,
};

const POOL: &str = "pool";
const RESERVATION: &str = "reservation";
const NODE_SLICES: &str = "nodeslicepool";
const IPAMCLAIM: &str = "ipamclaim";

/// The pools and reservations of one namespace on the API server.
#[derive(Clone)]
pub struct KubeStore {
    client: Client,
    pools: Api<IpPool>,
    reservations: Api<OverlappingRangeIpReservation>,
    slices: Api<NodeSlicePool>,
    namespace: String,
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

impl KubeStore {
    /// A store over `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            pools: Api::namespaced(client.clone(), namespace),
            reservations: Api::namespaced(client.clone(), namespace),
            slices: Api::namespaced(client.clone(), namespace),
            client,
            namespace: namespace.to_string(),
        }
    }

    /// The client it sends through.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// How a failed request failed. etcd refuses an object over its request limit with a 500 whose message says so;
/// the API server's own body limit answers 413.
fn classify(err: &kube::Error) -> (Failure, String) {
    match err {
        kube::Error::Api(status) => {
            let message = format!("{} {}: {}", status.code, status.reason, status.message);
            let failure = match status.code {
                413 => Failure::TooLarge,
                500 if status.message.contains("too large") => Failure::TooLarge,
                // 409 here is a conflict the server gave up retrying (AlreadyExists is handled by the callers)
                409 | 429 => Failure::Unavailable,
                500..=599 => Failure::Ambiguous,
                code => Failure::Refused(code),
            };
            (failure, message)
        }
        kube::Error::SerdeError(e) => (Failure::Malformed, format!("unreadable answer: {e}")),
        kube::Error::BuildRequest(e) => (Failure::Refused(0), format!("cannot build the request: {e}")),
        kube::Error::InferConfig(e) => (Failure::Refused(0), e.to_string()),
        // connection refused or reset, TLS, timeouts, a body cut short: the request may have been applied
        other => (Failure::Ambiguous, other.to_string()),
    }
}

fn error(kind: &'static str, name: &str, op: impl Into<String>, err: kube::Error) -> StoreError {
    let (failure, message) = classify(&err);
    StoreError { source: Some(Box::new(err)), ..StoreError::new(kind, name, op, failure, message) }
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

/// A delete that only applies to the object at `version`.
fn at_version(version: &Version) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: version.resource_version.clone(),
            uid: version.uid.clone(),
        }),
        ..Default::default()
    }
}

impl KubeStore {
    /// Sends the guarded patch `patch` of the object `name` through `api`: a 422 is the server's refusal (a
    /// `test` failed, or a schema or an admission policy refused it), a 404 a missing object.
    async fn guarded<K>(
        api: &Api<K>,
        kind: &'static str,
        name: &str,
        op: String,
        patch: json_patch::Patch,
    ) -> Result<Patched, StoreError>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        Self::guarded_returning(api, kind, name, op, &patch).await.map(|(patched, _)| patched)
    }

    /// [`KubeStore::guarded`], with the object as stored after an applied patch.
    async fn guarded_returning<K>(
        api: &Api<K>,
        kind: &'static str,
        name: &str,
        op: String,
        patch: &json_patch::Patch,
    ) -> Result<(Patched, Option<K>), StoreError>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch.clone())).await {
            Ok(after) => Ok((Patched::Applied, Some(after))),
            Err(kube::Error::Api(status)) if status.code == 422 => Ok((Patched::Refused(status.message), None)),
            Err(e) if is_status(&e, 404) => Ok((Patched::Missing, None)),
            Err(e) => Err(error(kind, name, op, e)),
        }
    }

    /// Sends the merge patch `patch` of the pool `name`.
    async fn merge_pool(&self, name: &str, op: &str, patch: &Value) -> Result<Patched, StoreError> {
        match self.pools.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await {
            Ok(_) => Ok(Patched::Applied),
            Err(e) if is_status(&e, 404) => Ok(Patched::Missing),
            Err(e) => Err(error(POOL, name, op, e)),
        }
    }
}

impl PoolStore for KubeStore {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn get_pool(&self, name: &str) -> Result<Option<IpPool>, StoreError> {
        self.pools.get_opt(name).await.map_err(|e| error(POOL, name, "get", e))
    }

    async fn create_pool(&self, new: &super::NewPool<'_>) -> Result<Created<IpPool>, StoreError> {
        let name = new.name;
        let pool = new.object();
        match self.pools.create(&PostParams::default(), &pool).await {
            Ok(created) => Ok(Created::Created(created)),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(Created::Exists),
            Err(e) => Err(error(POOL, name, "create", e)),
        }
    }

    async fn list_pools(&self) -> Result<Vec<IpPool>, StoreError> {
        let list = self.pools.list(&ListParams::default()).await.map_err(|e| error(POOL, "*", "list", e))?;
        Ok(list.items)
    }

    async fn probe(&self) -> Result<(), StoreError> {
        let params = ListParams::default().limit(1);
        self.pools.list_metadata(&params).await.map(drop).map_err(|e| error(POOL, "*", "list", e))
    }

    async fn add_allocation(
        &self,
        pool: &str,
        offset: u128,
        entry: &IpAllocation,
        read: &super::AsRead,
    ) -> Result<Patched, StoreError> {
        let patch = guard::add_entry(offset, entry, read);
        Self::guarded(&self.pools, POOL, pool, format!("add allocation {offset}"), patch).await
    }

    async fn replace_allocation(
        &self,
        pool: &str,
        offset: u128,
        expected: &IpAllocation,
        entry: &IpAllocation,
    ) -> Result<Patched, StoreError> {
        let patch = guard::replace_entry(offset, expected, entry);
        Self::guarded(&self.pools, POOL, pool, format!("replace allocation {offset}"), patch).await
    }

    async fn remove_allocation(
        &self,
        pool: &str,
        offset: u128,
        held: &IpAllocation,
        record: Option<&super::ReleaseRecord>,
    ) -> Result<Patched, StoreError> {
        if record.is_some_and(|r| !r.map_exists) {
            match self.merge_pool(pool, "make spec.released", &guard::make_released()).await? {
                Patched::Applied => {}
                other => return Ok(other),
            }
        }
        let patch = guard::remove_entry(offset, held, record);
        Self::guarded(&self.pools, POOL, pool, format!("remove allocation {offset}"), patch).await
    }

    async fn set_pool_cooldown(&self, name: &str, seconds: u64) -> Result<Option<IpPool>, StoreError> {
        let patch = guard::set_cooldown(seconds);
        match self.pools.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(pool) => Ok(Some(pool)),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(error(POOL, name, "set reuse cooldown", e)),
        }
    }

    async fn retime_release(&self, name: &str, offset: u128, read: &str, now: &str) -> Result<Patched, StoreError> {
        let patch = guard::retime_release(offset, read, now);
        Self::guarded(&self.pools, POOL, name, format!("retime release {offset}"), patch).await
    }

    async fn apply_pool_patch(
        &self,
        name: &str,
        op: &str,
        patch: &json_patch::Patch,
    ) -> Result<(Patched, Option<IpPool>), StoreError> {
        Self::guarded_returning(&self.pools, POOL, name, op.to_string(), patch).await
    }

    async fn delete_pool(&self, name: &str, version: &Version) -> Result<Deleted, StoreError> {
        match self.pools.delete(name, &at_version(version)).await {
            Ok(_) => Ok(Deleted::Deleted),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Deleted::Missing),
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(Deleted::Changed),
            Err(e) => Err(error(POOL, name, "delete", e)),
        }
    }
}

impl SubInterfaceStore for KubeStore {
    async fn set_sub_interface(
        &self,
        name: &str,
        offset: u128,
        record: &SubInterfaceRecord,
    ) -> Result<Patched, StoreError> {
        let op = format!("record sub-interface {offset}");
        self.merge_pool(name, &op, &guard::record_sub_interface(offset, record)).await
    }

    async fn remove_sub_interface(&self, name: &str, offset: u128, node: &str) -> Result<Patched, StoreError> {
        let patch = guard::remove_sub_interface(offset, node);
        Self::guarded(&self.pools, POOL, name, format!("remove sub-interface {offset}"), patch).await
    }
}

impl ReservationStore for KubeStore {
    async fn get_reservation(&self, name: &str) -> Result<Option<OverlappingRangeIpReservation>, StoreError> {
        self.reservations.get_opt(name).await.map_err(|e| error(RESERVATION, name, "get", e))
    }

    async fn create_reservation(
        &self,
        name: &str,
        claim: &Claim,
    ) -> Result<Created<OverlappingRangeIpReservation>, StoreError> {
        let reservation = super::reservation_object(name, claim);
        match self.reservations.create(&PostParams::default(), &reservation).await {
            Ok(created) => Ok(Created::Created(created)),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(Created::Exists),
            Err(e) => Err(error(RESERVATION, name, "create", e)),
        }
    }

    async fn take_over_reservation(
        &self,
        current: &OverlappingRangeIpReservation,
        claim: &Claim,
    ) -> Result<Patched, StoreError> {
        let name = current.metadata.name.as_deref().unwrap_or_default();
        let patch = guard::take_over(current, claim);
        Self::guarded(&self.reservations, RESERVATION, name, "take over".into(), patch).await
    }

    async fn delete_reservation(&self, name: &str, version: &Version) -> Result<Deleted, StoreError> {
        match self.reservations.delete(name, &at_version(version)).await {
            Ok(_) => Ok(Deleted::Deleted),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Deleted::Missing),
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(Deleted::Changed),
            Err(e) => Err(error(RESERVATION, name, "delete", e)),
        }
    }

    async fn list_reservations(&self, node: Option<&str>) -> Result<Vec<OverlappingRangeIpReservation>, StoreError> {
        let mut params = ListParams::default();
        if let Some(node) = node {
            params = params.labels(&format!("{}={node}", super::NODE_LABEL));
        }
        let list = self.reservations.list(&params).await.map_err(|e| error(RESERVATION, "*", "list", e))?;
        Ok(list.items)
    }
}

impl SliceStore for KubeStore {
    async fn get_node_slices(&self, name: &str) -> Result<Option<NodeSlicePool>, StoreError> {
        self.slices.get_opt(name).await.map_err(|e| error(NODE_SLICES, name, "get", e))
    }

    async fn create_node_slices(
        &self,
        name: &str,
        spec: &NodeSlicePoolSpec,
        slices: &[NodeSliceAllocation],
    ) -> Result<Created<NodeSlicePool>, StoreError> {
        let object = super::node_slices_object(name, spec, slices);
        match self.slices.create(&PostParams::default(), &object).await {
            Ok(created) => Ok(Created::Created(created)),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(Created::Exists),
            Err(e) => Err(error(NODE_SLICES, name, "create", e)),
        }
    }

    async fn move_slice(
        &self,
        name: &str,
        index: usize,
        slice: &NodeSliceAllocation,
        to: &str,
    ) -> Result<Patched, StoreError> {
        let patch = guard::move_slice(index, slice, to);
        let op = format!("move slice {} to {to:?}", slice.slice_range);
        Self::guarded(&self.slices, NODE_SLICES, name, op, patch).await
    }

    async fn split_slice(
        &self,
        name: &str,
        index: usize,
        slice: &NodeSliceAllocation,
        to: &str,
        kept: &str,
        rest: &[String],
    ) -> Result<Patched, StoreError> {
        let patch = guard::split_slice(index, slice, to, kept, rest);
        let op = format!("cut slice {} to {kept} for {to:?}", slice.slice_range);
        Self::guarded(&self.slices, NODE_SLICES, name, op, patch).await
    }

    async fn join_slices(
        &self,
        name: &str,
        i: usize,
        a: &NodeSliceAllocation,
        j: usize,
        b: &NodeSliceAllocation,
        parent: &str,
    ) -> Result<Patched, StoreError> {
        let patch = guard::join_slices(i, a, j, b, parent);
        let op = format!("join free slices {} and {} into {parent}", a.slice_range, b.slice_range);
        Self::guarded(&self.slices, NODE_SLICES, name, op, patch).await
    }

    async fn list_node_slices(&self) -> Result<Vec<NodeSlicePool>, StoreError> {
        let list = self.slices.list(&ListParams::default()).await.map_err(|e| error(NODE_SLICES, "*", "list", e))?;
        Ok(list.items)
    }

    async fn keep_node_slices_owners(
        &self,
        name: &str,
        version: &str,
        kept: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    ) -> Result<Patched, StoreError> {
        let patch = guard::keep_owners(version, kept);
        Self::guarded(&self.slices, NODE_SLICES, name, "rewrite owner references".into(), patch).await
    }
}

impl super::IpamClaimStore for KubeStore {
    async fn get_ipamclaim(&self, namespace: &str, name: &str) -> Result<Option<crate::crd::IpamClaim>, StoreError> {
        let api: Api<crate::crd::IpamClaim> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(name).await {
            Ok(found) => Ok(found),
            // the API server's plain 404 when the IPAMClaim CRD is not installed: no claim exists
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(e) => Err(error(IPAMCLAIM, &format!("{namespace}/{name}"), "get", e)),
        }
    }

    async fn set_ipamclaim_status(
        &self,
        current: &crate::crd::IpamClaim,
        status: &crate::crd::IpamClaimStatus,
    ) -> Result<Patched, StoreError> {
        let namespace = current.metadata.namespace.as_deref().unwrap_or_default();
        let name = current.metadata.name.as_deref().unwrap_or_default();
        let api: Api<crate::crd::IpamClaim> = Api::namespaced(self.client.clone(), namespace);
        let patch = guard::claim_status(current, status);
        match api.patch_status(name, &PatchParams::default(), &Patch::<()>::Json(patch)).await {
            Ok(_) => Ok(Patched::Applied),
            Err(kube::Error::Api(status)) if status.code == 422 => Ok(Patched::Refused(status.message)),
            Err(e) if is_status(&e, 404) => Ok(Patched::Missing),
            Err(e) => Err(error(IPAMCLAIM, &format!("{namespace}/{name}"), "write status", e)),
        }
    }
}

impl CoreStore for KubeStore {
    async fn warn_pod(&self, pod: &PodEvent<'_>, reason: &str, message: &str) -> Result<(), StoreError> {
        use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", pod.name)),
                namespace: Some(pod.namespace.to_string()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(pod.namespace.to_string()),
                name: Some(pod.name.to_string()),
                uid: pod.uid.map(str::to_string),
                ..ObjectReference::default()
            },
            type_: Some("Warning".into()),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            source: Some(EventSource { component: Some("hereabouts".into()), host: Some(pod.node.to_string()) }),
            reporting_component: Some("hereabouts".into()),
            reporting_instance: Some(pod.node.to_string()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            ..Event::default()
        };
        let events: Api<Event> = Api::namespaced(self.client.clone(), pod.namespace);
        let what = format!("{}/{}", pod.namespace, pod.name);
        events
            .create(&PostParams::default(), &event)
            .await
            .map(drop)
            .map_err(|e| error("event on pod", &what, "create", e))
    }

    async fn core_metadata(
        &self,
        kind: super::CoreObject,
        namespace: &str,
        name: &str,
    ) -> Result<Option<super::ObjectMeta>, StoreError> {
        use super::CoreObject;
        use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
        // metadata only: a pod's spec can be large, and nothing else of it is read
        let what = match kind {
            CoreObject::Pod => format!("{namespace}/{name}"),
            _ => name.to_string(),
        };
        let got = match kind {
            CoreObject::Pod => Api::<Pod>::namespaced(self.client.clone(), namespace)
                .get_metadata_opt(name)
                .await
                .map(|o| o.map(|m| m.metadata)),
            CoreObject::Namespace => {
                Api::<Namespace>::all(self.client.clone()).get_metadata_opt(name).await.map(|o| o.map(|m| m.metadata))
            }
            CoreObject::Node => {
                Api::<Node>::all(self.client.clone()).get_metadata_opt(name).await.map(|o| o.map(|m| m.metadata))
            }
        };
        got.map_err(|e| error(kind.kind(), &what, "get", e))
    }
}
