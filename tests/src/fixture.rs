//! [`CniFixture`]: a fresh namespace, the CNI's rights granted to the CNI identity there, and a kubeconfig
//! for that identity whose context names the namespace — what a node's CNI plugin gets from `install-cni`.

use std::path::PathBuf;
use std::time::Duration;

use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::Value;

use crate::plugin::{Invocation, Output, netconf};
use crate::{Identity, TestCluster, rbac, wait};

/// One test's namespace and CNI identity.
pub struct CniFixture {
    pub cluster: &'static TestCluster,
    pub ns: String,
    pub kubeconfig: PathBuf,
    pub admin: Client,
}

impl std::fmt::Debug for CniFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CniFixture").field("ns", &self.ns).field("kubeconfig", &self.kubeconfig).finish_non_exhaustive()
    }
}

impl CniFixture {
    /// A namespace named after `prefix` in which the restricted identity has exactly the CNI's rights, on the
    /// test binary's shared control plane.
    pub async fn new(prefix: &str) -> Self {
        Self::on(TestCluster::get(), prefix).await
    }

    /// [`CniFixture::new`] on `cluster` (e.g. a control plane of the test's own, [`TestCluster::own`]).
    pub async fn on(cluster: &'static TestCluster, prefix: &str) -> Self {
        let ns = cluster.namespace(prefix).await;
        let admin = cluster.admin().await;
        // the namespaced Role, and the ClusterRole's events right within this namespace (where the test pods are)
        let rules = [rbac::cni_rules(), rbac::cni_event_rules()].concat();
        rbac::grant_to(admin.clone(), &ns, "hereabouts-cni", Identity::Cni, rules).await;
        let restricted = Api::<IpPool>::namespaced(cluster.client(Identity::Cni).await, &ns);
        wait::until(Duration::from_secs(10), "the CNI role binding to apply", || async {
            restricted.list(&ListParams::default()).await.ok()
        })
        .await
        .unwrap();
        let kubeconfig = cluster.kubeconfig(Identity::Cni, &ns);
        Self { cluster, ns, kubeconfig, admin }
    }

    /// A network config named `name` whose ipam section is `ipam` plus this fixture's kubeconfig.
    pub fn netconf(&self, cni_version: &str, name: &str, ipam: Value) -> Value {
        netconf(cni_version, name, &self.kubeconfig, ipam)
    }

    /// An invocation of `command` for pod `pod` of this namespace with container `container_id`.
    pub fn invocation(&self, command: &'static str, config: &Value, pod: &str, container_id: &str) -> Invocation {
        Invocation::new(command, config, &self.ns, pod, container_id)
    }

    /// ADD for `pod` with container `c-<pod>` on `node` (`NODENAME`).
    pub async fn add_on(&self, config: &Value, node: &str, pod: &str) -> Output {
        self.invocation("ADD", config, pod, &format!("c-{pod}")).with_env("NODENAME", node).run().await
    }

    /// DEL for `pod` with container `c-<pod>` on `node`.
    pub async fn del_on(&self, config: &Value, node: &str, pod: &str) -> Output {
        self.invocation("DEL", config, pod, &format!("c-{pod}")).with_env("NODENAME", node).run().await
    }

    /// ADD for `pod` with container `container_id`.
    pub async fn add(&self, config: &Value, pod: &str, container_id: &str) -> Output {
        self.invocation("ADD", config, pod, container_id).run().await
    }

    /// DEL for `pod` with container `container_id`.
    pub async fn del(&self, config: &Value, pod: &str, container_id: &str) -> Output {
        self.invocation("DEL", config, pod, container_id).run().await
    }

    /// The pools of the namespace, read as admin.
    pub async fn pools(&self) -> Vec<IpPool> {
        Api::<IpPool>::namespaced(self.admin.clone(), &self.ns).list(&ListParams::default()).await.unwrap().items
    }

    /// The pool `name`, read as admin; panics when it does not exist.
    pub async fn pool(&self, name: &str) -> IpPool {
        Api::<IpPool>::namespaced(self.admin.clone(), &self.ns)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("pool {name} in {}: {e}", self.ns))
    }

    /// The reservations of the namespace, read as admin.
    pub async fn reservations(&self) -> Vec<OverlappingRangeIpReservation> {
        Api::<OverlappingRangeIpReservation>::namespaced(self.admin.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    /// How many pools and reservations the namespace holds: what a refused invocation must leave unchanged.
    pub async fn object_count(&self) -> (usize, usize) {
        (self.pools().await.len(), self.reservations().await.len())
    }
}
