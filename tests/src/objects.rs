//! The objects tests write, built in one place — pods, Nodes, pools and their entries, reservations,
//! NetworkAttachmentDefinitions — and reading back what the plugins stored, as admin: who holds what.
//!
//! Each `mk_*` gives the shape most tests want; the builder's methods add what a test needs on top, and `build`
//! (or, for pods and Nodes, `create`) ends it:
//!
//! ```text
//! let pod = mk_pod(&ns, "web-0").node("node-a").owned_by_statefulset("web", &uid).create(&admin).await;
//! let pool = mk_pool("198.18.0.0-24", "198.18.0.0/24").entry(5, mk_entry("c-a", "ns/a").ifname("net1")).build();
//! ```

use std::collections::BTreeSet;

use hereabouts_ipam::crd::{
    IpAllocation, IpPool, IpPoolSpec, OverlappingRangeIpReservation, OverlappingRangeIpReservationSpec,
};
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ObjectMeta, PostParams};
use kube::core::DynamicObject;
use kube::{Api, Client};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------------------------
// Pods

/// A Pod being built; see [`mk_pod`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until built or created"]
pub struct PodBuilder {
    pod: Pod,
}

/// Pod `name` of namespace `ns` with one container `c` of image `pause`: what the CNI plugin and the reconciler
/// read of a pod on the test control plane, where no kubelet runs it. Bound to no node until [`PodBuilder::node`].
pub fn mk_pod(ns: &str, name: &str) -> PodBuilder {
    let pod = Pod {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
        spec: Some(PodSpec {
            containers: vec![Container { name: "c".into(), image: Some("pause".into()), ..Default::default() }],
            ..Default::default()
        }),
        ..Default::default()
    };
    PodBuilder { pod }
}

impl PodBuilder {
    fn spec(&mut self) -> &mut PodSpec {
        self.pod.spec.get_or_insert_with(Default::default)
    }

    /// Bound to `node` (`spec.nodeName`), as the scheduler would bind it.
    pub fn node(mut self, node: &str) -> Self {
        self.spec().node_name = Some(node.into());
        self
    }

    /// With annotation `key` set to `value`.
    pub fn annotation(mut self, key: &str, value: impl Into<String>) -> Self {
        self.pod.metadata.annotations.get_or_insert_with(Default::default).insert(key.into(), value.into());
        self
    }

    /// With `owner` among its owner references.
    pub fn owner(mut self, owner: OwnerReference) -> Self {
        self.pod.metadata.owner_references.get_or_insert_with(Vec::new).push(owner);
        self
    }

    /// Controlled by StatefulSet `set` (UID `uid`, which need not exist), as the StatefulSet controller writes it.
    pub fn owned_by_statefulset(self, set: &str, uid: &str) -> Self {
        self.owner(OwnerReference {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: set.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        })
    }

    /// Running as ServiceAccount `name`.
    pub fn service_account(mut self, name: &str) -> Self {
        self.spec().service_account_name = Some(name.into());
        self
    }

    /// With `container` as its only container, in place of `c`.
    pub fn container(mut self, container: Container) -> Self {
        self.spec().containers = vec![container];
        self
    }

    /// With `terminationGracePeriodSeconds` `secs`.
    pub fn termination_grace(mut self, secs: i64) -> Self {
        self.spec().termination_grace_period_seconds = Some(secs);
        self
    }

    /// The Pod object.
    pub fn build(self) -> Pod {
        self.pod
    }

    /// Creates the pod as `client` and returns it as the API server answered (with its UID); panics naming the pod
    /// when it is refused.
    pub async fn create(self, client: &Client) -> Pod {
        let ns = self.pod.metadata.namespace.clone().unwrap_or_default();
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        Api::<Pod>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &self.pod)
            .await
            .unwrap_or_else(|e| panic!("create pod {ns}/{name}: {e}"))
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Nodes

/// A Node object being built; see [`mk_node`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until built or created"]
pub struct NodeBuilder {
    node: Node,
}

/// Node `name`, with nothing behind it (no kubelet): only its name and labels are read.
pub fn mk_node(name: &str) -> NodeBuilder {
    NodeBuilder {
        node: Node { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() },
    }
}

impl NodeBuilder {
    /// With label `key` set to `value`.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.node.metadata.labels.get_or_insert_with(Default::default).insert(key.into(), value.into());
        self
    }

    /// The Node object.
    pub fn build(self) -> Node {
        self.node
    }

    /// Creates the Node as `client`; panics naming it when it is refused.
    pub async fn create(self, client: &Client) -> Node {
        let name = self.node.metadata.name.clone().unwrap_or_default();
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &self.node)
            .await
            .unwrap_or_else(|e| panic!("create node {name}: {e}"))
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Pools, their entries, reservations

/// An IPPool being built; see [`mk_pool`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until built"]
pub struct PoolBuilder {
    pool: IpPool,
}

/// IPPool `name` (no namespace: the `Api` it is created through gives it one) for `range`, holding nothing.
pub fn mk_pool(name: &str, range: &str) -> PoolBuilder {
    PoolBuilder { pool: IpPool::new(name, IpPoolSpec { range: range.into(), ..Default::default() }) }
}

impl PoolBuilder {
    /// In namespace `ns` (for a write whose `Api` does not say it, or to compare with what was read).
    pub fn namespace(mut self, ns: &str) -> Self {
        self.pool.metadata.namespace = Some(ns.into());
        self
    }

    /// Holding `entry` at `offset` (from the range's network address).
    pub fn entry(mut self, offset: impl ToString, entry: impl Into<IpAllocation>) -> Self {
        self.pool.spec.allocations.insert(offset.to_string(), entry.into());
        self
    }

    /// The IPPool object.
    pub fn build(self) -> IpPool {
        self.pool
    }
}

/// A pool entry being built; see [`mk_entry`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until built"]
pub struct EntryBuilder {
    entry: IpAllocation,
}

/// A pool entry of container `id` for `podref` (`namespace/name`) and nothing else, as Whereabouts writes the
/// least of one.
pub fn mk_entry(id: &str, podref: &str) -> EntryBuilder {
    EntryBuilder { entry: IpAllocation { id: id.into(), podref: podref.into(), ..Default::default() } }
}

impl EntryBuilder {
    /// For interface `ifname` of the pod.
    pub fn ifname(mut self, ifname: &str) -> Self {
        self.entry.ifname = ifname.into();
        self
    }

    /// The entry.
    pub fn build(self) -> IpAllocation {
        self.entry
    }
}

impl From<EntryBuilder> for IpAllocation {
    fn from(builder: EntryBuilder) -> Self {
        builder.build()
    }
}

/// A reservation being built; see [`mk_reservation`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until built"]
pub struct ReservationBuilder {
    reservation: OverlappingRangeIpReservation,
}

/// Reservation `name` (the address, as the plugins name it) held by `podref`, with no container or interface.
pub fn mk_reservation(name: &str, podref: &str) -> ReservationBuilder {
    let spec = OverlappingRangeIpReservationSpec { podref: podref.into(), ..Default::default() };
    ReservationBuilder { reservation: OverlappingRangeIpReservation::new(name, spec) }
}

impl ReservationBuilder {
    /// Of container `id`.
    pub fn container(mut self, id: &str) -> Self {
        self.reservation.spec.containerid = id.into();
        self
    }

    /// For interface `ifname` of the pod.
    pub fn ifname(mut self, ifname: &str) -> Self {
        self.reservation.spec.ifname = ifname.into();
        self
    }

    /// The reservation.
    pub fn build(self) -> OverlappingRangeIpReservation {
        self.reservation
    }
}

// ---------------------------------------------------------------------------------------------------------------
// NetworkAttachmentDefinitions

/// NetworkAttachmentDefinition `name` of namespace `ns` whose `spec.config` is `config`.
pub fn mk_nad(ns: &str, name: &str, config: &Value) -> DynamicObject {
    let mut nad = DynamicObject::new(name, &hereabouts_ipam::crd::nad_resource()).within(ns);
    nad.data = json!({"spec": {"config": config.to_string()}});
    nad
}

// ---------------------------------------------------------------------------------------------------------------
// Reading back

/// The podrefs holding an entry in pool `pool` of `ns`; panics when the pool cannot be read.
pub async fn pool_holders(admin: &Client, ns: &str, pool: &str) -> BTreeSet<String> {
    let pool: IpPool =
        Api::namespaced(admin.clone(), ns).get(pool).await.unwrap_or_else(|e| panic!("pool {pool} in {ns}: {e}"));
    pool.spec.allocations.values().map(|a| a.podref.clone()).collect()
}

/// The podrefs holding a reservation in `ns`.
pub async fn reservation_holders(admin: &Client, ns: &str) -> BTreeSet<String> {
    Api::<OverlappingRangeIpReservation>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("reservations in {ns}: {e}"))
        .items
        .into_iter()
        .map(|r| r.spec.podref)
        .collect()
}
