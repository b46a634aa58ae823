//! Sticky StatefulSet addresses, the compiled plugin and reconciler against the test API server: a StatefulSet's
//! pod deleted and recreated under its name gets its address back; a scaled-down ordinal's and a deleted
//! StatefulSet's addresses are released by the reconciler; a range without the key behaves as before.
//!
//! The test control plane runs no controller-manager: the test plays the StatefulSet controller (creates the pods
//! with their owner reference, deletes them, scales), which is all the plugin and the reconciler see of it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use hereabouts_tests::ctl::ctl;
use hereabouts_tests::objects::mk_pod;
use hereabouts_tests::plugin::{Invocation, netconf};
use hereabouts_tests::reconciler::{PodFixture, Reconciler, ReconcilerOptions};
use hereabouts_tests::{Identity, wait};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NODE: &str = "sticky-node";

struct Sts {
    fx: PodFixture,
    sticky: Value,
    plain: Value,
}

impl Sts {
    async fn new() -> Self {
        let fx = PodFixture::new("sticky", "198.18.150.0/28").await;
        let kubeconfig = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
        let sticky =
            netconf("1.0.0", "sticky", &kubeconfig, json!({"range": "198.18.150.0/28", "sticky_statefulset": true}));
        let plain = netconf("1.0.0", "plain", &kubeconfig, json!({"range": "198.18.151.0/28"}));
        Self { fx, sticky, plain }
    }

    async fn statefulset(&self, replicas: i32) -> String {
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let template = mk_pod(&self.fx.ns, "web").node(NODE).build();
        let set = StatefulSet {
            metadata: ObjectMeta { name: Some("web".into()), ..Default::default() },
            spec: StatefulSetSpec {
                replicas: Some(replicas),
                selector: LabelSelector { match_labels: Some(labels.clone()), ..Default::default() },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta { labels: Some(labels), ..Default::default() }),
                    spec: template.spec,
                },
                ..Default::default()
            },
            ..Default::default()
        };
        let api = Api::<StatefulSet>::namespaced(self.fx.admin.clone(), &self.fx.ns);
        api.create(&PostParams::default(), &set).await.unwrap().metadata.uid.unwrap()
    }

    /// Pod `name`, owned by StatefulSet `web` (UID `owner`) when given, on [`NODE`].
    async fn pod(&self, name: &str, owner: Option<&str>) -> String {
        let pod = mk_pod(&self.fx.ns, name).node(NODE);
        let pod = match owner {
            Some(uid) => pod.owned_by_statefulset("web", uid),
            None => pod,
        };
        pod.create(&self.fx.admin).await.metadata.uid.unwrap()
    }

    async fn cni(&self, verb: &'static str, config: &Value, pod: &str, uid: &str) -> hereabouts_tests::plugin::Output {
        let mut inv = Invocation::new(verb, config, &self.fx.ns, pod, &format!("c-{uid}")).with_env("NODENAME", NODE);
        inv.args.push_str(&format!(";K8S_POD_UID={uid}"));
        inv.run().await
    }

    async fn add(&self, config: &Value, pod: &str, uid: &str) -> IpAddr {
        self.cni("ADD", config, pod, uid).await.ips()[0]
    }

    /// The runtime's DEL, then the pod object goes (as a graceful deletion ends).
    async fn delete(&self, config: &Value, pod: &str, uid: &str) {
        assert!(self.cni("DEL", config, pod, uid).await.success, "DEL {pod}");
        self.fx.delete(pod).await;
    }

    /// Pool `name`'s entries, as (podref, statefulset).
    async fn entries(&self, pool: &str) -> BTreeMap<String, (String, Option<String>)> {
        let pool = self.fx.pool(pool).await;
        pool.spec.allocations.into_iter().map(|(k, e)| (k, (e.podref, e.statefulset))).collect()
    }

    async fn until_gone(&self, pool: &str, offset: &str, what: &str) {
        wait::until(Duration::from_secs(30), what, || async {
            (!self.entries(pool).await.contains_key(offset)).then_some(())
        })
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_pod_keeps_its_address_until_its_ordinal_or_its_statefulset_is_gone() {
    let t = Sts::new().await;
    let (sticky_pool, plain_pool) = ("198.18.150.0-28", "198.18.151.0-28");
    let owner = t.statefulset(2).await;
    let (u0, u1) = (t.pod("web-0", Some(&owner)).await, t.pod("web-1", Some(&owner)).await);
    let a0 = t.add(&t.sticky, "web-0", &u0).await;
    let a1 = t.add(&t.sticky, "web-1", &u1).await;
    let p0 = t.add(&t.plain, "web-0", &u0).await;
    // a pod no StatefulSet owns, in the sticky range: an ordinary entry
    let uo = t.pod("loner-0", None).await;
    let lone = t.add(&t.sticky, "loner-0", &uo).await;
    assert_eq!(
        (a0, a1, lone, p0),
        (
            "198.18.150.1".parse().unwrap(),
            "198.18.150.2".parse().unwrap(),
            "198.18.150.3".parse().unwrap(),
            "198.18.151.1".parse().unwrap()
        )
    );
    let ns = &t.fx.ns;
    let entries = t.entries(sticky_pool).await;
    assert_eq!(entries["1"], (format!("{ns}/web-0"), Some("web".to_string())));
    assert_eq!(entries["3"], (format!("{ns}/loner-0"), None), "no owner, nothing recorded");
    assert_eq!(t.entries(plain_pool).await["1"].1, None, "a range without the key records nothing");

    let opts = ReconcilerOptions { cron: "*/2 * * * * *".into(), ..ReconcilerOptions::new(NODE, ns) };
    let reconciler = Reconciler::start(t.fx.cluster, &opts).await;

    // web-0 is deleted (a rolling update, an eviction): DEL keeps the sticky entry, gives back the plain one
    assert!(t.cni("DEL", &t.sticky, "web-0", &u0).await.success);
    assert!(t.cni("DEL", &t.plain, "web-0", &u0).await.success);
    assert!(t.entries(sticky_pool).await.contains_key("1"), "DEL left the sticky entry");
    assert!(!t.entries(plain_pool).await.contains_key("1"), "DEL released the plain one");
    t.fx.delete("web-0").await;
    // the reconciler, which releases a deleted pod's address, keeps it: the loner (no DEL) is its control
    t.fx.delete("loner-0").await;
    t.until_gone(sticky_pool, "3", "the reconciler to release the loner's address").await;
    reconciler.wait_for_more("hereabouts_reconcile_runs_total", 2.0).await; // two more cron passes
    assert_eq!(t.entries(sticky_pool).await["1"].0, format!("{ns}/web-0"), "kept for web-0's next incarnation");
    // the operator tool applies the same rule
    let admin = t.fx.cluster.kubeconfig(Identity::Admin, ns);
    let said = ctl(&admin, ns, &["ipam", "release", "--ip", "198.18.150.1"]).await.stdout;
    eprintln!("ipam release --ip: {said}");
    assert!(said.contains("a sticky StatefulSet address: its StatefulSet still wants the pod's ordinal"), "{said}");
    let said = ctl(&admin, ns, &["ipam", "show", "--ip", "198.18.150.1"]).await.stdout;
    eprintln!("ipam show --ip: {said}");
    assert!(said.contains(&format!("held by {ns}/web-0")) && said.contains("sticky for StatefulSet web"), "{said}");

    // web-0 comes back under its name, with a new UID: same address, the entry now its own
    let u0b = t.pod("web-0", Some(&owner)).await;
    assert_eq!(t.add(&t.sticky, "web-0", &u0b).await, a0, "the recreated pod gets its address back");
    let pool = t.fx.pool(sticky_pool).await;
    assert_eq!(pool.spec.allocations["1"].poduid.as_deref(), Some(u0b.as_str()));
    assert!(t.fx.reservations().await.iter().any(|r| r.ends_with("/web-0")), "{:?}", t.fx.reservations().await);

    // scale-down to 1: web-1's ordinal is no longer wanted; the reconciler releases it when the pod goes
    let scale = json!({"spec": {"replicas": 1}});
    Api::<StatefulSet>::namespaced(t.fx.admin.clone(), ns)
        .patch("web", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .unwrap();
    t.delete(&t.sticky, "web-1", &u1).await;
    t.until_gone(sticky_pool, "2", "the reconciler to release the scaled-down web-1's address").await;
    assert!(t.entries(sticky_pool).await.contains_key("1"), "web-0 keeps its address");

    // the StatefulSet is deleted (no garbage collector here: the test deletes its pod too)
    Api::<StatefulSet>::namespaced(t.fx.admin.clone(), ns).delete("web", &DeleteParams::default()).await.unwrap();
    t.delete(&t.sticky, "web-0", &u0b).await;
    t.until_gone(sticky_pool, "1", "the reconciler to release web-0's address once its StatefulSet is gone").await;
    assert_eq!(t.fx.reservations().await.len(), 0, "{:?}", t.fx.reservations().await);
    let log = reconciler.logs();
    assert!(log.contains("pod_deleted"), "{log}");
}

/// Six pods of a StatefulSet added at once, then all replaced at once (DEL, delete, recreate, ADD) while the
/// reconciler runs, through a proxy that loses the answers of some pool patches and reservation writes after the
/// server applied them: each pod gets its own address back, none is held twice; after a scale-down to three, the
/// reconciler releases exactly the three ordinals no longer wanted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replacements_under_lost_answers_keep_each_pod_its_own_address() {
    use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
    let mut t = Sts::new().await;
    let proxy = FaultProxy::start(t.fx.cluster).await;
    let kubeconfig = proxy.kubeconfig(t.fx.cluster, Identity::Admin, &t.fx.ns);
    t.sticky = netconf("1.0.0", "sticky", &kubeconfig, json!({"range": "198.18.152.0/28", "sticky_statefulset": true}));
    let pool = "198.18.152.0-28";
    let owner = t.statefulset(6).await;
    let names: Vec<String> = (0..6).map(|i| format!("web-{i}")).collect();
    let mut uids = Vec::new();
    for name in &names {
        uids.push(t.pod(name, Some(&owner)).await);
    }
    let first: Vec<IpAddr> =
        futures::future::join_all(names.iter().zip(&uids).map(|(n, u)| t.add(&t.sticky, n, u))).await;
    let opts = ReconcilerOptions::new(NODE, &t.fx.ns);
    let _reconciler = Reconciler::start(t.fx.cluster, &opts).await;

    proxy.add_rule(Rule {
        verb: Verb::Patch,
        resource: "ippools".into(),
        nth: 2,
        times: 3,
        action: Action::DropResponse,
    });
    proxy.add_rule(Rule::nth(Verb::Patch, "overlappingrangeipreservations", 2, Action::DropResponse));
    proxy.add_rule(Rule::nth(Verb::Get, "pods", 3, Action::Status(503, "test: unavailable".into())));
    let replaced = futures::future::join_all(names.iter().zip(&uids).enumerate().map(|(i, (name, uid))| {
        let (t, owner) = (&t, &owner);
        async move {
            // the replacements start spread over 150 ms, overlapping as a rolling update's would
            tokio::time::sleep(Duration::from_millis(30 * i as u64)).await;
            assert!(t.cni("DEL", &t.sticky, name, uid).await.success, "DEL {name}");
            t.fx.delete(name).await;
            let again = t.pod(name, Some(owner)).await;
            (t.add(&t.sticky, name, &again).await, again)
        }
    }))
    .await;
    let lost = proxy.seen().iter().filter(|s| s.action.is_some()).count();
    eprintln!("{lost} faults fired");
    assert!(lost >= 4, "{:?}", proxy.seen());
    for (i, (ip, _)) in replaced.iter().enumerate() {
        assert_eq!(*ip, first[i], "{} got its address back", names[i]);
    }
    let held = t.fx.pool(pool).await.spec.allocations;
    assert_eq!(held.len(), 6, "one entry per pod: {held:?}");

    // scale to 3: web-3..5 go; their addresses are released, web-0..2 keep theirs
    let scale = json!({"spec": {"replicas": 3}});
    Api::<StatefulSet>::namespaced(t.fx.admin.clone(), &t.fx.ns)
        .patch("web", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .unwrap();
    for i in 3..6 {
        t.delete(&t.sticky, &names[i], &replaced[i].1).await;
    }
    wait::until(Duration::from_secs(30), "the scaled-down ordinals' release", || async {
        (t.fx.pool(pool).await.spec.allocations.len() == 3).then_some(())
    })
    .await
    .unwrap();
    let kept: std::collections::BTreeSet<String> =
        t.fx.pool(pool).await.spec.allocations.values().map(|e| e.podref.clone()).collect();
    assert_eq!(kept, names[..3].iter().map(|n| format!("{}/{n}", t.fx.ns)).collect());
}
