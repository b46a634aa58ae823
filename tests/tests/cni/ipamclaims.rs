//! Persistent addresses for VMs (IPAMClaim), the compiled plugin and reconciler against the test API server, with
//! the IPAMClaim CRD from its upstream module (`hack/testenv.sh`).
//!
//! The test plays KubeVirt, which the test control plane does not run: for a network whose config has
//! `allowPersistentIPs` it creates the VM's IPAMClaim, then the VM's pods (virt-launcher), each naming the claim in
//! its network selection element (`ipam-claim-reference`), as KubeVirt's ipam-extensions webhook writes it. A live
//! migration is a second pod of the same claim started while the first still runs; a restart, a new pod once the
//! others are gone.

use std::net::IpAddr;
use std::time::Duration;

use hereabouts_ipam::crd::{IpamClaim, IpamClaimSpec};
use hereabouts_tests::ctl::ctl;
use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
use hereabouts_tests::objects::mk_pod;
use hereabouts_tests::plugin::{Invocation, Output, netconf};
use hereabouts_tests::reconciler::{PodFixture, Reconciler, ReconcilerOptions};
use hereabouts_tests::{Identity, rbac, runtime, testenv, wait};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

const RANGE: &str = "198.18.154.0/28";
const POOL: &str = "198.18.154.0-28";

struct Vm {
    fx: PodFixture,
    config: Value,
}

impl Vm {
    /// A namespace with the IPAMClaim CRD installed, and network `vmnet` allowing persistent IPs, whose plugin
    /// talks to the API server as the admin.
    async fn new(prefix: &str) -> Self {
        let fx = PodFixture::new(prefix, RANGE).await;
        runtime::install_nad_crd(&fx.admin, &testenv::tool("ipamclaims-crd.yaml")).await.unwrap();
        let kubeconfig = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
        let mut config = netconf("1.0.0", "vmnet", &kubeconfig, json!({"range": RANGE}));
        config["allowPersistentIPs"] = json!(true);
        Self { fx, config }
    }

    /// The plugin talks to the API server through `kubeconfig` from now on.
    fn through(&mut self, kubeconfig: &std::path::Path) {
        self.config["ipam"]["kubernetes"]["kubeconfig"] = json!(kubeconfig);
    }

    fn claims(&self) -> Api<IpamClaim> {
        Api::namespaced(self.fx.admin.clone(), &self.fx.ns)
    }

    /// KubeVirt's part: the VM's claim, for network `vmnet`, interface `net1`.
    async fn claim(&self, name: &str) {
        let claim = IpamClaim::new(name, IpamClaimSpec { network: "vmnet".into(), interface: "net1".into() });
        // the CRD was just established: its first create may race the discovery of the new API
        wait::until(Duration::from_secs(10), "the IPAMClaim to be created", || async {
            self.claims().create(&PostParams::default(), &claim).await.ok()
        })
        .await
        .unwrap();
    }

    /// The claim's `status.ips` and `status.ownerPod.name`.
    async fn status(&self, name: &str) -> (Vec<String>, String) {
        let status = self.claims().get(name).await.unwrap().status.unwrap_or_default();
        (status.ips, status.owner_pod.map(|o| o.name).unwrap_or_default())
    }

    /// A virt-launcher pod `name` on `node` whose network selection element names `claim` (none: a plain pod).
    async fn pod(&self, name: &str, node: &str, claim: Option<&str>) -> String {
        let mut pod = mk_pod(&self.fx.ns, name).node(node);
        if let Some(claim) = claim {
            let networks = json!([{"name": "vmnet", "interface": "net1", "ipam-claim-reference": claim}]);
            pod = pod.annotation(hereabouts_ipam::claim::NETWORKS_ANNOTATION, networks.to_string());
        }
        pod.create(&self.fx.admin).await.metadata.uid.unwrap()
    }

    async fn cni(&self, verb: &'static str, pod: &str, uid: &str, node: &str) -> Output {
        let mut inv =
            Invocation::new(verb, &self.config, &self.fx.ns, pod, &format!("c-{uid}")).with_env("NODENAME", node);
        inv.args.push_str(&format!(";K8S_POD_UID={uid}"));
        inv.run().await
    }

    async fn add(&self, pod: &str, uid: &str, node: &str) -> IpAddr {
        self.cni("ADD", pod, uid, node).await.ips()[0]
    }

    /// The pool's entries of claim `claim`, as (offset, podref).
    async fn claimed(&self, claim: &str) -> Vec<(String, String)> {
        let pool = self.fx.pool(POOL).await;
        pool.spec
            .allocations
            .into_iter()
            .filter(|(_, e)| e.ipamclaim.as_deref() == Some(claim))
            .map(|(k, e)| (k, e.podref))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_keeps_its_address_across_a_migration_and_a_restart_until_its_claim_is_deleted() {
    let mut t = Vm::new("claims").await;
    let proxy = FaultProxy::start(t.fx.cluster).await;
    t.through(&proxy.kubeconfig(t.fx.cluster, Identity::Admin, &t.fx.ns));
    let ns = t.fx.ns.clone();
    t.claim("vm1.vmnet").await;

    let ua = t.pod("launcher-a", "node-a", Some("vm1.vmnet")).await;
    // the answer to the claim's first status write is lost after the server applied it
    proxy.add_rule(Rule::nth(Verb::Patch, "ipamclaims/status", 1, Action::DropResponse));
    let ip = t.add("launcher-a", &ua, "node-a").await;
    assert_eq!(t.status("vm1.vmnet").await, (vec![format!("{ip}/28")], "launcher-a".to_string()));
    let up = t.pod("plain", "node-a", None).await;
    assert_ne!(t.add("plain", &up, "node-a").await, ip, "a pod without a claim gets another address");

    let opts = ReconcilerOptions { cron: "*/2 * * * * *".into(), ..ReconcilerOptions::new("node-a", &ns) };
    let reconciler = Reconciler::start(t.fx.cluster, &opts).await;

    // live migration: the target pod on node-b while the source runs; the answer to its pool patch is lost
    let ub = t.pod("launcher-b", "node-b", Some("vm1.vmnet")).await;
    proxy.add_rule(Rule::nth(Verb::Patch, "ippools", 1, Action::DropResponse));
    assert_eq!(t.add("launcher-b", &ub, "node-b").await, ip, "the migration's target gets the VM's address");
    assert!(proxy.seen().iter().filter(|s| s.action.is_some()).count() >= 2, "{:?}", proxy.seen());
    assert_eq!(t.claimed("vm1.vmnet").await.len(), 1, "one entry for the claim");
    assert_eq!(t.claimed("vm1.vmnet").await[0].1, format!("{ns}/launcher-b"));
    assert_eq!(t.status("vm1.vmnet").await.1, "launcher-b");

    // the source goes (DEL, pod deleted), then the VM stops: DEL and the reconciler keep the claim's address
    assert!(t.cni("DEL", "launcher-a", &ua, "node-a").await.success);
    t.fx.delete("launcher-a").await;
    assert!(t.cni("DEL", "launcher-b", &ub, "node-b").await.success);
    t.fx.delete("launcher-b").await;
    // the plain pod, deleted without DEL, is the control: the reconciler releases its address
    t.fx.delete("plain").await;
    wait::until(Duration::from_secs(30), "the reconciler to release the plain pod's address", || async {
        (!t.fx.holders(POOL).await.contains(&format!("{ns}/plain"))).then_some(())
    })
    .await
    .unwrap();
    reconciler.wait_for_more("hereabouts_reconcile_runs_total", 2.0).await;
    assert_eq!(t.claimed("vm1.vmnet").await.len(), 1, "the claim's address outlives its pods");
    let admin = t.fx.cluster.kubeconfig(Identity::Admin, &ns);
    let said = ctl(&admin, &ns, &["ipam", "release", "--ip", &ip.to_string()]).await.stdout;
    assert!(said.contains("an IPAMClaim's address: the claim exists"), "{said}");
    let said = ctl(&admin, &ns, &["ipam", "show", "--ip", &ip.to_string()]).await.stdout;
    assert!(said.contains(&format!("held by {ns}/launcher-b")) && said.contains("IPAMClaim vm1.vmnet's"), "{said}");

    // the VM starts again: its new pod gets the address
    let uc = t.pod("launcher-c", "node-a", Some("vm1.vmnet")).await;
    assert_eq!(t.add("launcher-c", &uc, "node-a").await, ip, "the restarted VM's pod");
    assert!(t.fx.reservations().await.contains(&format!("{ns}/launcher-c")), "{:?}", t.fx.reservations().await);

    // the VM is deleted: KubeVirt deletes its pod and its claim; then the reconciler gives the address back
    assert!(t.cni("DEL", "launcher-c", &uc, "node-a").await.success);
    t.fx.delete("launcher-c").await;
    t.claims().delete("vm1.vmnet", &DeleteParams::default()).await.unwrap();
    // the entry first, its reservation after it
    wait::until(Duration::from_secs(30), "the reconciler to release the deleted claim's address", || async {
        (t.claimed("vm1.vmnet").await.is_empty() && t.fx.reservations().await.is_empty()).then_some(())
    })
    .await
    .unwrap();
}

/// The plugin's identity reads pods and IPAMClaims and writes claim status only with the chart's
/// `cni.persistentIPs`: without it, an ADD fails naming the ClusterRole and the value and leaves nothing behind;
/// with it, the ADD records the address on the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cni_identity_needs_the_ipamclaims_cluster_role() {
    let mut t = Vm::new("claims-rbac").await;
    rbac::grant_to(t.fx.admin.clone(), &t.fx.ns, "cni", Identity::Cni, rbac::cni_rules()).await;
    t.through(&t.fx.cluster.kubeconfig(Identity::Cni, &t.fx.ns));
    t.claim("vm2.vmnet").await;
    let uid = t.pod("launcher", "node-a", Some("vm2.vmnet")).await;
    let refused = t.cni("ADD", "launcher", &uid, "node-a").await;
    assert!(!refused.success, "{}", refused.stdout);
    for said in [hereabouts_tests::deploy::CNI_CLAIMS_NAME, hereabouts_tests::deploy::CNI_CLAIMS_VALUE, "forbidden"] {
        assert!(refused.stdout.contains(said), "{said} in {}", refused.stdout);
    }
    assert!(t.fx.reservations().await.is_empty(), "nothing written");
    rbac::grant_cni_claims(&t.fx.admin).await;
    let ip = t.add("launcher", &uid, "node-a").await;
    assert_eq!(t.status("vm2.vmnet").await.0, [format!("{ip}/28")]);
}
