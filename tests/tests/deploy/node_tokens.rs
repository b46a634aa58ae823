//! Each host's CNI token confined to its node, with the chart applied as shipped (its default render, every
//! object: the Roles, the bindings, the two ValidatingAdmissionPolicies) to this module's own control plane.
//! Each host is a [`NodeHost`]: a Node, the DaemonSet pod on it, and `install-cni --once` run with that pod's
//! token, so the plugin runs with the kubeconfig a real host gets.
//!
//! What a node may do is what its plugin does (ADD, DEL, claiming a slice, borrowing from another node's slice, a
//! new sandbox keeping its attachment's address, releasing what Whereabouts wrote); what it may not is the same
//! writes for another node, sent through the plugin's own store and as plain patches. Pods, reservations and
//! pools all live in kube-system, where the chart's Roles are: each test has its own network name, range and
//! Node names.
//!
//! On a control plane of this module's own: it writes kube-system, creates Nodes and applies the chart's
//! cluster-wide policies and ClusterRoles, which other tests' static identities must not meet. The tests that
//! turn a value-gated ClusterRole on hold [`VALUES`] exclusively and put the default back.

use std::net::IpAddr;
use std::time::Duration;

use hereabouts_ipam::crd::{IpAllocation, IpPool, NodeSlicePool, OverlappingRangeIpReservation};
use hereabouts_ipam::store::{
    AsRead, Claim, Failure, KubeStore, Patched, PoolStore, ReservationStore, SliceStore, StoreError,
};
use hereabouts_tests::host_token::{NodeHost, mint_cni_token};
use hereabouts_tests::objects::{mk_entry, mk_pod, mk_reservation};
use hereabouts_tests::plugin::{Invocation, Output};
use hereabouts_tests::provider::{ProviderOptions, ReferenceProvider};
use hereabouts_tests::{Identity, TestCluster, deploy, wait};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, UserInfo};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::RwLock;

/// Where the chart puts everything, and so the pools.
const KS: &str = deploy::NAMESPACE;

/// Held shared by every test while the default render is in force, exclusively by one that applies another.
static VALUES: RwLock<()> = RwLock::const_new(());

fn cluster() -> &'static TestCluster {
    TestCluster::own(module_path!())
}

/// Applies `render` as shipped and waits until the CNI's Role and the node policy are in force (a write of a token
/// bound to no Node is refused by the policy) and the token policy too (a request from a node's DaemonSet pod for
/// another Node's token is refused by it, before the API server would look the Node up).
async fn in_force(admin: &Client, render: &[Value]) {
    deploy::apply_chart(admin, render).await;
    let unbound = cluster().client(Identity::Cni).await;
    let pools = Api::<IpPool>::namespaced(unbound, KS);
    let probe = hereabouts_tests::objects::mk_pool("policy-probe", "198.18.255.0/30").namespace(KS).build();
    let dry = PostParams { dry_run: true, ..Default::default() };
    let last = std::sync::Mutex::new(String::new());
    let refused = wait::until(Duration::from_secs(30), "the node policy in force", || async {
        let answer = format!("{:?}", pools.create(&dry, &probe).await);
        let done = answer.contains("bound to no Node");
        *last.lock().unwrap() = answer;
        done.then_some(())
    })
    .await;
    refused.unwrap_or_else(|e| panic!("{e}: {}", last.lock().unwrap()));

    let admin_pods = Api::<Pod>::namespaced(admin.clone(), KS);
    let probe_pod = match admin_pods.get_opt("policy-probe").await.unwrap() {
        Some(pod) => pod,
        None => mk_pod(KS, "policy-probe").service_account(deploy::NODE_ACCOUNT).node("probe-node").create(admin).await,
    };
    let token = deploy::token_for(admin, KS, deploy::NODE_ACCOUNT, Some(&probe_pod)).await;
    let from_node = cluster().client_with_token(&token).await;
    let refused = wait::until(Duration::from_secs(30), "the token policy in force", || async {
        let answer = format!("{:?}", mint_cni_token(&from_node, KS, Some(("Node", "no-such-node"))).await);
        let done = answer.contains("must be bound to Node probe-node");
        *last.lock().unwrap() = answer;
        done.then_some(())
    })
    .await;
    refused.unwrap_or_else(|e| panic!("{e}: {}", last.lock().unwrap()));
}

/// The default render in force, held shared.
async fn shipped() -> (Client, tokio::sync::RwLockReadGuard<'static, ()>) {
    let guard = VALUES.read().await;
    let admin = cluster().admin().await;
    in_force(&admin, &deploy::manifest()).await;
    (admin, guard)
}

/// Who the API server takes `client`'s token for.
async fn whoami(client: &Client) -> Result<UserInfo, kube::Error> {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    Ok(review.status.and_then(|s| s.user_info).unwrap_or_default())
}

fn node_of(user: &UserInfo) -> Option<String> {
    user.extra.as_ref()?.get("authentication.kubernetes.io/node-name")?.first().cloned()
}

/// A host's store: the plugin's own guarded writes, with the host's token.
async fn store(host: &NodeHost) -> KubeStore {
    KubeStore::new(host.client().await, KS)
}

/// Asserts that `result` is the node policy's refusal naming `node`, and returns its message.
fn refused<T: std::fmt::Debug>(result: Result<T, StoreError>, node: &str, what: &str) -> String {
    match result {
        Err(e) if e.failure == Failure::Refused(403) && e.message.contains(&format!("node {node} may ")) => e.message,
        other => panic!("{what}: expected the node policy's refusal for {node}, got {other:?}"),
    }
}

/// Asserts that a plain API call was refused by the node policy for `node`.
fn denied<T: std::fmt::Debug>(result: Result<T, kube::Error>, node: &str, what: &str) {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(&format!("node {node} may ")) => {}
        other => panic!("{what}: expected the node policy's refusal for {node}, got {other:?}"),
    }
}

async fn pools(admin: &Client, range: &str) -> Vec<IpPool> {
    let all = Api::<IpPool>::namespaced(admin.clone(), KS).list(&ListParams::default()).await.unwrap().items;
    let net: ipnet::IpNet = range.parse().unwrap();
    all.into_iter().filter(|p| p.spec.range.parse::<ipnet::IpNet>().is_ok_and(|r| net.contains(&r.network()))).collect()
}

/// Every entry in the pools of `range`: (pool, offset, entry).
async fn entries(admin: &Client, range: &str) -> Vec<(String, u128, IpAllocation)> {
    let mut out = Vec::new();
    for pool in pools(admin, range).await {
        let name = pool.metadata.name.clone().unwrap();
        for (offset, entry) in pool.spec.allocations {
            out.push((name.clone(), offset.parse().unwrap(), entry));
        }
    }
    out
}

/// The entry of pod `pod` (of kube-system) in the pools of `range`.
async fn entry_of(admin: &Client, range: &str, pod: &str) -> (String, u128, IpAllocation) {
    let podref = format!("{KS}/{pod}");
    let found: Vec<_> = entries(admin, range).await.into_iter().filter(|(_, _, e)| e.podref == podref).collect();
    assert_eq!(found.len(), 1, "one entry of {podref} in {range}: {found:?}");
    found.into_iter().next().unwrap()
}

async fn reservations(admin: &Client, network: &str) -> Vec<OverlappingRangeIpReservation> {
    let all = Api::<OverlappingRangeIpReservation>::namespaced(admin.clone(), KS).list(&ListParams::default()).await;
    all.unwrap().items.into_iter().filter(|r| r.metadata.name.as_deref().unwrap_or("").starts_with(network)).collect()
}

fn label(r: &OverlappingRangeIpReservation) -> Option<&str> {
    r.metadata.labels.as_ref()?.get(hereabouts_ipam::store::NODE_LABEL).map(String::as_str)
}

/// An invocation of `command` for pod `pod` of kube-system with container `container`, with `config` (a host's:
/// its flat file names its kubeconfig and node).
async fn run(config: &Value, command: &'static str, pod: &str, container: &str) -> Output {
    Invocation::new(command, config, KS, pod, container).run().await
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

// ---------------------------------------------------------------------------------------------------------------
// The token

/// install-cni on node A writes a token the API server takes for node A; the DaemonSet pod's token of node A can
/// mint node A's token only: not node B's, not one bound to nothing or to a pod. An administrator, who is on no
/// node, still can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_cni_on_a_node_mints_only_that_nodes_token() {
    let (admin, _guard) = shipped().await;
    let a = NodeHost::install(cluster(), KS, "mint-a").await;
    let b = NodeHost::install(cluster(), KS, "mint-b").await;
    let me = whoami(&a.client().await).await.expect("the host's token authenticates");
    assert_eq!(me.username.as_deref(), Some(deploy::sa_user(KS, deploy::CNI_NAME).as_str()));
    assert_eq!(node_of(&me).as_deref(), Some("mint-a"), "bound to its Node: {me:?}");
    assert_eq!(node_of(&whoami(&b.client().await).await.unwrap()).as_deref(), Some("mint-b"));

    // install-cni of node A's pod, told it runs on node B
    let out = a.install_cni("mint-b");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "install-cni minted another node's token:\n{stderr}");
    assert!(stderr.contains("must be bound to Node mint-a"), "the refusal names the node:\n{stderr}");
    assert_eq!(node_of(&whoami(&a.client().await).await.unwrap()).as_deref(), Some("mint-a"), "the kubeconfig stays");

    let from_a = a.pod_client().await;
    let pod = format!("hereabouts-{}", a.node);
    for bound in [Some(("Node", "mint-b")), None, Some(("Pod", pod.as_str()))] {
        match mint_cni_token(&from_a, KS, bound).await {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("must be bound to Node mint-a") => {}
            other => panic!("node A's pod minting a token bound to {bound:?}: {other:?}"),
        }
    }
    let own = mint_cni_token(&from_a, KS, Some(("Node", "mint-a"))).await.expect("its own node's token");
    assert!(!own.is_empty());
    mint_cni_token(&admin, KS, None).await.expect("an administrator is on no node and is not confined");
}

/// A token of hereabouts-cni bound to no Node (what install-cni wrote before it bound them) is refused every
/// write, though it still reads; a node's token reads no pod, namespace or Node, and creates no Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bound_to_no_node_writes_nothing_and_no_token_reads_a_pod() {
    let (admin, _guard) = shipped().await;
    let host = NodeHost::install(cluster(), KS, "unbound-a").await;
    let range = "198.18.100.0/24";
    let config = host.netconf("unbound", json!({"range": range, "network_name": "unbound"}));

    // the same host with a token bound to nothing in its kubeconfig
    let unbound = mint_cni_token(&admin, KS, None).await.unwrap();
    let text = std::fs::read_to_string(host.kubeconfig()).unwrap().replace(&host.token(), &unbound);
    std::fs::write(host.kubeconfig(), text).unwrap();
    let add = run(&config, "ADD", "web", "c1").await;
    assert!(!add.success, "an unbound token allocated: {}", add.stdout);
    assert!(add.stdout.contains("bound to no Node"), "the CNI error names the policy: {}", add.stdout);
    assert!(entries(&admin, range).await.is_empty() && reservations(&admin, "unbound").await.is_empty());
    let status = run(&config, "STATUS", "", "").await;
    assert!(status.success, "reads are not confined: {}\n{}", status.stdout, status.stderr);

    // the node-bound token: pools yes, pods no
    assert!(host.install_cni(&host.node).status.success());
    assert_eq!(run(&config, "ADD", "web", "c1").await.ips(), [ip("198.18.100.1")]);
    let cni = host.client().await;
    let pod = format!("hereabouts-{}", host.node);
    let forbidden = |r: Result<_, kube::Error>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: {other:?}"),
    };
    forbidden(Api::<Pod>::namespaced(cni.clone(), KS).get(&pod).await.map(drop), "get its own DaemonSet pod");
    forbidden(Api::<Pod>::namespaced(cni.clone(), "default").get("web").await.map(drop), "get a pod elsewhere");
    forbidden(Api::<Pod>::all(cni.clone()).list(&ListParams::default().limit(1)).await.map(drop), "list pods");
    forbidden(Api::<Namespace>::all(cni.clone()).get(KS).await.map(drop), "get a namespace");
    forbidden(Api::<Node>::all(cni.clone()).get(&host.node).await.map(drop), "get its own Node");
    let event = Event {
        metadata: kube::api::ObjectMeta { generate_name: Some("probe-".into()), ..Default::default() },
        involved_object: Default::default(),
        ..Default::default()
    };
    forbidden(Api::<Event>::namespaced(cni, KS).create(&PostParams::default(), &event).await.map(drop), "an Event");
    assert!(run(&config, "DEL", "web", "c1").await.success);
    assert!(entries(&admin, range).await.is_empty());
}

// ---------------------------------------------------------------------------------------------------------------
// Pools and reservations

/// Nodes A and B allocate in one pool (with a reuse cooldown, so releases write records). B can neither release
/// A's address — not with a DEL naming A's container, nor with the plugin's guarded removal — nor rewrite A's entry
/// for another pod, nor add an entry in A's name, nor write a release record of an entry it does not remove, nor
/// change the pool; it cannot delete A's reservation or create one in A's name. A and B each release their own
/// (B's GC, then A's DEL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_writes_only_its_own_entries_and_reservations() {
    let (admin, _guard) = shipped().await;
    let a = NodeHost::install(cluster(), KS, "entries-a").await;
    let b = NodeHost::install(cluster(), KS, "entries-b").await;
    let range = "198.18.101.0/24";
    let ipam = json!({"range": range, "network_name": "entries", "reuse_cooldown_seconds": 1});
    let (on_a, on_b) = (a.netconf("entries", ipam.clone()), b.netconf("entries", ipam));
    assert_eq!(run(&on_a, "ADD", "pod-a", "ca").await.ips(), [ip("198.18.101.1")]);
    assert_eq!(run(&on_b, "ADD", "pod-b", "cb").await.ips(), [ip("198.18.101.2")]);
    let (pool, offset_a, held_a) = entry_of(&admin, range, "pod-a").await;
    assert_eq!(held_a.node.as_deref(), Some("entries-a"));

    // a DEL on B for A's container: DEL never fails, but releases nothing of A's
    let del = run(&on_b, "DEL", "pod-a", "ca").await;
    assert!(del.success, "{}", del.stderr);
    assert!(del.stderr.contains("node entries-b may only remove"), "the refusal is logged:\n{}", del.stderr);
    assert_eq!(entry_of(&admin, range, "pod-a").await.2, held_a, "A's entry stays");
    assert_eq!(reservations(&admin, "entries").await.len(), 2, "A's reservation stays");

    let as_b = store(&b).await;
    let what = "B removes A's entry";
    refused(as_b.remove_allocation(&pool, offset_a, &held_a, None).await, "entries-b", what);
    let mut stolen = held_a.clone();
    (stolen.podref, stolen.id, stolen.node) = (format!("{KS}/intruder"), "ci".into(), Some("entries-b".into()));
    let what = "B rewrites A's entry for another pod";
    refused(as_b.replace_allocation(&pool, offset_a, &held_a, &stolen).await, "entries-b", what);
    let mut forged = held_a.clone();
    (forged.podref, forged.id) = (format!("{KS}/forged"), "cf".into());
    let what = "B adds an entry in A's name";
    refused(as_b.add_allocation(&pool, 9, &forged, &AsRead::default()).await, "entries-b", what);
    let pools_as_b = Api::<IpPool>::namespaced(b.client().await, KS);
    let json_patch = |ops: Value| Patch::Json::<()>(serde_json::from_value(ops).unwrap());
    let record = json_patch(
        json!([{"op": "add", "path": format!("/spec/released/{offset_a}"), "value": "2020-01-01T00:00:00Z"}]),
    );
    denied(pools_as_b.patch(&pool, &PatchParams::default(), &record).await, "entries-b", "a record of A's entry");
    let range_change = json_patch(json!([{"op": "replace", "path": "/spec/range", "value": "198.18.102.0/24"}]));
    denied(pools_as_b.patch(&pool, &PatchParams::default(), &range_change).await, "entries-b", "the pool's range");

    let theirs = reservations(&admin, "entries").await;
    let of_a = theirs.iter().find(|r| label(r) == Some("entries-a")).expect("A's reservation, labelled A");
    let name_a = of_a.metadata.name.clone().unwrap();
    let what = "B deletes A's reservation";
    refused(as_b.delete_reservation(&name_a, &hereabouts_ipam::store::Version::of(of_a)).await, "entries-b", what);
    let claim = Claim { spec: of_a.spec.clone(), node: "entries-a".into(), at: k8s_openapi::jiff::Timestamp::now() };
    let what = "B creates a reservation in A's name";
    refused(as_b.create_reservation("entries-198.18.101.77", &claim).await, "entries-b", what);

    // GC on B with no attachment left, once the entries are older than any ADD: B's own entry goes, A's stays
    let aged = (k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(600)).to_string();
    let all: serde_json::Map<String, Value> =
        [offset_a, 2].iter().map(|o| (o.to_string(), json!({"allocated": aged}))).collect();
    let age = Patch::Merge(json!({"spec": {"allocations": all}}));
    Api::<IpPool>::namespaced(admin.clone(), KS).patch(&pool, &PatchParams::default(), &age).await.unwrap();
    let mut gc = on_b.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    let out = run(&gc, "GC", "", "").await;
    assert!(out.success, "GC: {}\n{}", out.stdout, out.stderr);
    let left: Vec<String> = entries(&admin, range).await.into_iter().map(|(_, _, e)| e.podref).collect();
    assert_eq!(left, [format!("{KS}/pod-a")], "GC on B released B's entry only: {}", out.stderr);

    // each releases its own, the release records and all
    assert!(run(&on_a, "DEL", "pod-a", "ca").await.success);
    assert!(run(&on_b, "DEL", "pod-b", "cb").await.success);
    assert!(entries(&admin, range).await.is_empty(), "both released");
    assert!(reservations(&admin, "entries").await.is_empty(), "both reservations released");
    let released = pools(&admin, range).await[0].spec.released.clone().unwrap_or_default();
    assert_eq!(released.keys().collect::<Vec<_>>(), ["1", "2"], "each release recorded its address");

    // S7 of the fourth review: a record ahead of the clock (its releaser's clock ran fast) is moved to now by the
    // next ADD of the pool, whichever node's; the shipped policy refused it (403), so the address cooled for the
    // skew on top of the cooldown. Moved later, it is still refused.
    let future = "2099-01-01T00:00:00Z";
    let ahead = Patch::Merge(json!({"spec": {"released": {offset_a.to_string(): future}}}));
    Api::<IpPool>::namespaced(admin.clone(), KS).patch(&pool, &PatchParams::default(), &ahead).await.unwrap();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    as_b.retime_release(&pool, offset_a, future, &now).await.unwrap_or_else(|e| panic!("B moves it to now: {e}"));
    let released = pools(&admin, range).await[0].spec.released.clone().unwrap_or_default();
    assert_eq!(released.get(&offset_a.to_string()).map(String::as_str), Some(now.as_str()));
    let what = "B moves a record later";
    refused(as_b.retime_release(&pool, offset_a, &now, "2100-01-01T00:00:00Z").await, "entries-b", what);
}

/// S6 of the fourth review, as docs/security.md ("Not promised") now says it: the policy does not stop a node from
/// releasing another node's live pod in two writes — take the entry (and the reservation) over in its own name for
/// the same pod and interface, as a pod recreated on this node does, then remove it as its own. A rewrite for
/// another pod stays refused (the test above). If a change of the policy ever closes this, this test fails, and
/// the doc is to be made stronger with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_can_release_another_nodes_pod_in_two_writes_as_the_security_doc_says() {
    let (admin, _guard) = shipped().await;
    let a = NodeHost::install(cluster(), KS, "twostep-a").await;
    let b = NodeHost::install(cluster(), KS, "twostep-b").await;
    let range = "198.18.203.0/24";
    let on_a = a.netconf("twostep", json!({"range": range, "network_name": "twostep"}));
    assert_eq!(run(&on_a, "ADD", "pod-a", "ca").await.ips(), [ip("198.18.203.1")]);
    let (pool, offset, held) = entry_of(&admin, range, "pod-a").await;
    let as_b = store(&b).await;

    let mut taken = held.clone();
    taken.node = Some("twostep-b".into());
    as_b.replace_allocation(&pool, offset, &held, &taken).await.expect("B takes A's entry over for the same pod");
    as_b.remove_allocation(&pool, offset, &taken, None).await.expect("and removes it, now its own");
    assert!(entries(&admin, range).await.is_empty(), "pod-a's address is free while pod-a runs on A");

    let reservation = reservations(&admin, "twostep").await.pop().expect("pod-a's reservation");
    let claim =
        Claim { spec: reservation.spec.clone(), node: "twostep-b".into(), at: k8s_openapi::jiff::Timestamp::now() };
    as_b.take_over_reservation(&reservation, &claim).await.expect("B takes A's reservation over");
    let relabelled = reservations(&admin, "twostep").await.pop().unwrap();
    assert_eq!(label(&relabelled), Some("twostep-b"));
    let name = relabelled.metadata.name.clone().unwrap();
    as_b.delete_reservation(&name, &hereabouts_ipam::store::Version::of(&relabelled)).await.expect("and deletes it");
    assert!(reservations(&admin, "twostep").await.is_empty());
}

/// A replacing pool's first claim marks the pool it replaces (`hereabouts.cni.cncf.io/replaced`, S2 of the fourth
/// review), with the host's token: the policy lets a node add the mark, not change or remove it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_marks_a_replaced_pool_once() {
    let (admin, _guard) = shipped().await;
    let a = NodeHost::install(cluster(), KS, "mark-a").await;
    let range = "198.18.204.0/30";
    let on_a = a.netconf("mark", json!({"range": range, "network_name": "mark"}));
    assert_eq!(run(&on_a, "ADD", "pod-a", "ca").await.ips(), [ip("198.18.204.1")]);
    let pool = pools(&admin, range).await.pop().unwrap();
    let name = pool.metadata.name.clone().unwrap();
    let as_a = store(&a).await;
    let annotated = pool.metadata.annotations.is_some();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let mark = hereabouts_ipam::store::guard::mark_replaced(annotated, &now);
    let (marked, _) = as_a.apply_pool_patch(&name, "mark replaced", &mark).await.expect("A marks the pool");
    assert_eq!(marked, hereabouts_ipam::store::Patched::Applied);
    let read = pools(&admin, range).await.pop().unwrap();
    assert_eq!(hereabouts_ipam::store::replaced_at(&read).map(|t| t.to_string()), Some(now.clone()));
    let pools_as_a = Api::<IpPool>::namespaced(a.client().await, KS);
    let key = hereabouts_ipam::store::REPLACED_ANNOTATION;
    let moved = Patch::Merge(json!({"metadata": {"annotations": {key: "2099-01-01T00:00:00Z"}}}));
    denied(pools_as_a.patch(&name, &PatchParams::default(), &moved).await, "mark-a", "the mark moved");
    let removed = Patch::Merge(json!({"metadata": {"annotations": {key: null}}}));
    denied(pools_as_a.patch(&name, &PatchParams::default(), &removed).await, "mark-a", "the mark removed");
    assert!(run(&on_a, "DEL", "pod-a", "ca").await.success);
}

/// A pool is born with what it replaces pending (`hereabouts.cni.cncf.io/replaces-pending`), and the ADD that
/// finds one settles it, first the pending pools of a higher name that overlap it (which then name it). Here the
/// /29's and the /30's pools were made at once (by the admin: pending, naming neither the other), and node A's ADD
/// of the /29 settles both with the host's token. Once settled, what a pool replaces is no node's to change, nor
/// may it be pending again. With the policy of before (the pending mark could not go), A's ADD was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_settles_what_a_pending_pool_replaces_and_nothing_after() {
    let (admin, _guard) = shipped().await;
    let a = NodeHost::install(cluster(), KS, "settle-a").await;
    let (wide, narrow) = ("198.18.205.0/29", "198.18.205.0/30");
    let name = |range: &str| hereabouts_ipam::names::pool_name("settle", range.parse().unwrap());
    let pools_api = Api::<IpPool>::namespaced(admin.clone(), KS);
    for (range, usable) in [(wide, 6), (narrow, 2)] {
        let pool_name = name(range);
        let made_at_once = hereabouts_ipam::store::NewPool {
            network_name: "settle",
            config_name: "settle",
            pending: true,
            ..hereabouts_ipam::store::NewPool::new(&pool_name, range, usable)
        };
        pools_api.create(&PostParams::default(), &made_at_once.object()).await.unwrap();
    }
    let on_a =
        a.netconf("settle", json!({"range": wide, "network_name": "settle", "enable_overlapping_ranges": false}));
    assert_eq!(run(&on_a, "ADD", "pod-a", "ca").await.ips(), [ip("198.18.205.1")]);
    let read = |range: &str| {
        let (api, name) = (pools_api.clone(), name(range));
        async move { api.get(&name).await.unwrap() }
    };
    let (w, n) = (read(wide).await, read(narrow).await);
    for pool in [&w, &n] {
        assert!(!hereabouts_ipam::store::replaces_pending(pool), "{:?} settled", pool.metadata.name);
    }
    assert_eq!(hereabouts_ipam::store::overlaps_of(&n), [name(wide)], "the higher name names the lower");
    assert!(hereabouts_ipam::store::overlaps_of(&w).is_empty(), "and is not named by it");

    let pools_as_a = Api::<IpPool>::namespaced(a.client().await, KS);
    let overlaps = hereabouts_ipam::store::OVERLAPS_ANNOTATION;
    let renamed = Patch::Merge(json!({"metadata": {"annotations": {overlaps: name(narrow)}}}));
    denied(pools_as_a.patch(&name(wide), &PatchParams::default(), &renamed).await, "settle-a", "named once settled");
    let pending = hereabouts_ipam::store::PENDING_ANNOTATION;
    let again = Patch::Merge(json!({"metadata": {"annotations": {pending: "true"}}}));
    denied(pools_as_a.patch(&name(wide), &PatchParams::default(), &again).await, "settle-a", "pending again");
    assert!(run(&on_a, "DEL", "pod-a", "ca").await.success);
}

/// The warm reserve's hand-over, as the agent writes it with the host's token: node A turns the entry and the
/// reservation of its own reserve into a pod's; node B can do neither with A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_hands_over_only_its_own_warm_reserve() {
    use hereabouts_ipam::warm;
    let (admin, _guard) = shipped().await;
    let a = NodeHost::install(cluster(), KS, "warm-a").await;
    let b = NodeHost::install(cluster(), KS, "warm-b").await;
    let range = "198.18.104.0/28";
    let ipam = json!({"range": range, "network_name": "warmp", "node_slice_size": "/29", "warm_addresses": 1});
    let stdin = a.netconf("warmp", ipam).to_string();
    let args = format!("K8S_POD_NAMESPACE={KS};K8S_POD_NAME=pod-a");
    let cfg =
        hereabouts_ipam::config::load(&hereabouts_ipam::config::Input { stdin: stdin.as_bytes(), cni_args: &args })
            .expect("the config");
    let hereabouts_ipam::config::Mode::Slices(mode) = cfg.mode.clone() else { panic!("slice mode") };
    let budget = hereabouts_ipam::budget::Budget::new(Duration::from_secs(30));
    let slot = warm::fill(&store(&a).await, &cfg, &mode, "warm-a", "warm-1", &budget).await.expect("A's warm slot");
    let held = &slot.held[0];
    let token = warm::podref("warm-a");
    let (pool, offset, entry) = entries(&admin, range).await.into_iter().find(|(_, _, e)| e.podref == token).unwrap();
    assert_eq!((pool.as_str(), offset), (held.pool.as_str(), held.offset));

    let as_b = store(&b).await;
    let mut stolen = entry.clone();
    (stolen.podref, stolen.id, stolen.ifname, stolen.node) =
        (format!("{KS}/intruder"), "ci".into(), "net1".into(), Some("warm-b".into()));
    refused(as_b.replace_allocation(&pool, offset, &entry, &stolen).await, "warm-b", "B hands A's warm entry over");
    let name = held.reservation.clone().expect("a reservation");
    let current = as_b.get_reservation(&name).await.unwrap().expect("A's warm reservation");
    let claim = Claim {
        spec: hereabouts_ipam::crd::OverlappingRangeIpReservationSpec {
            containerid: "ci".into(),
            ifname: "net1".into(),
            podref: format!("{KS}/intruder"),
            ipamclaim: None,
        },
        node: "warm-b".into(),
        at: k8s_openapi::jiff::Timestamp::now(),
    };
    let what = "B hands A's warm reservation over";
    refused(as_b.take_over_reservation(&current, &claim).await, "warm-b", what);

    let take = warm::Take {
        reserve: "warmp".into(),
        network: cfg.name.clone(),
        kubeconfig: a.kubeconfig(),
        node: "warm-a".into(),
        slot: slot.clone(),
        podref: format!("{KS}/pod-a"),
        poduid: None,
        container: "ca".into(),
        ifname: "net1".into(),
        at: k8s_openapi::jiff::Timestamp::now().to_string(),
    };
    let outcome = warm::hand_over(&store(&a).await, std::slice::from_ref(&take), &budget).await;
    assert!(outcome.iter().all(Result::is_ok), "A hands its own over: {outcome:?}");
    let (_, _, handed) = entry_of(&admin, range, "pod-a").await;
    assert_eq!((handed.id.as_str(), handed.node.as_deref()), ("ca", Some("warm-a")));
    let reserved = reservations(&admin, "warmp").await;
    assert!(reserved.iter().any(|r| r.spec.podref == format!("{KS}/pod-a") && label(r) == Some("warm-a")));
    assert!(
        run(
            &a.netconf("warmp", json!({"range": range, "network_name": "warmp", "node_slice_size": "/29"})),
            "DEL",
            "pod-a",
            "ca"
        )
        .await
        .success
    );
    assert!(entries(&admin, range).await.is_empty(), "released");
}

/// Slice mode, a /28 in two /29 slices: B and C each claim one, so A borrows a free address of one of theirs,
/// its entry and reservation in its own name, and releases it again. B can give C's slice neither to itself nor
/// back to free, nor give a free one to A, nor remove A's borrowed entry from B's own slice pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_moves_only_its_own_slices_and_borrows_in_its_own_name() {
    let (admin, _guard) = shipped().await;
    let [a, b, c] = [
        NodeHost::install(cluster(), KS, "slices-a").await,
        NodeHost::install(cluster(), KS, "slices-b").await,
        NodeHost::install(cluster(), KS, "slices-c").await,
    ];
    let range = "198.18.103.0/28";
    let ipam = json!({"range": range, "network_name": "slices", "node_slice_size": "/29"});
    let config = |h: &NodeHost| h.netconf("slices", ipam.clone());
    run(&config(&b), "ADD", "pod-b", "cb").await.result();
    run(&config(&c), "ADD", "pod-c", "cc").await.result();
    run(&config(&a), "ADD", "pod-a", "ca").await.result();
    let (pool, offset_a, borrowed) = entry_of(&admin, range, "pod-a").await;
    assert_eq!(borrowed.node.as_deref(), Some("slices-a"), "the borrower's entry records the borrower");
    let lender = if pool.contains("slices-b") { &b } else { &c };
    assert!(pool.contains(&lender.node), "borrowed from another node's slice pool: {pool}");
    let reservation = reservations(&admin, "slices").await;
    assert!(reservation.iter().any(|r| r.spec.podref.ends_with("/pod-a") && label(r) == Some("slices-a")));

    let slice_pools = Api::<NodeSlicePool>::namespaced(admin.clone(), KS).list(&ListParams::default()).await;
    let nsp = slice_pools.unwrap().items.into_iter().find(|p| p.spec.range == range).expect("the NodeSlicePool");
    let nsp_name = nsp.metadata.name.clone().unwrap();
    let slices = nsp.status.clone().unwrap().allocations;
    let of_c = slices.iter().position(|s| s.node_name == "slices-c").expect("C's slice");
    let as_b = store(&b).await;
    let what = "B takes C's slice";
    refused(as_b.move_slice(&nsp_name, of_c, &slices[of_c], "slices-b").await, "slices-b", what);
    refused(as_b.move_slice(&nsp_name, of_c, &slices[of_c], "").await, "slices-b", "B frees C's slice");
    let what = "B removes A's borrowed entry";
    refused(as_b.remove_allocation(&pool, offset_a, &borrowed, None).await, "slices-b", what);
    let of_b = slices.iter().position(|s| s.node_name == "slices-b").expect("B's slice");
    let what = "B gives its own slice to A";
    refused(as_b.move_slice(&nsp_name, of_b, &slices[of_b], "slices-a").await, "slices-b", what);
    assert_eq!(as_b.move_slice(&nsp_name, of_b, &slices[of_b], "").await.unwrap(), Patched::Applied, "B frees its own");
    let freed = &Api::<NodeSlicePool>::namespaced(admin.clone(), KS).get(&nsp_name).await.unwrap();
    let after = freed.status.clone().unwrap().allocations;
    assert_eq!(after[of_b].node_name, "", "freed");
    assert_eq!(as_b.move_slice(&nsp_name, of_b, &after[of_b], "slices-b").await.unwrap(), Patched::Applied, "and back");

    let del = run(&config(&a), "DEL", "pod-a", "ca").await;
    assert!(del.success, "{}", del.stderr);
    let left: Vec<String> = entries(&admin, range).await.into_iter().map(|(_, _, e)| e.podref).collect();
    assert_eq!(left.len(), 2, "A's borrowed entry released, B's and C's kept: {left:?}");
    assert!(!left.iter().any(|p| p.ends_with("/pod-a")));
    assert!(!reservations(&admin, "slices").await.iter().any(|r| r.spec.podref.ends_with("/pod-a")));
}

/// Adaptive slices with each node's own token: A's ADD cuts its first slice out of a free one (the policy lets a
/// node's cut through); B can cut neither a free slice for A, nor A's slice, nor a free one into parts that overlap
/// or lie outside it; B's own cut of a free slice goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cuts_only_free_slices_and_only_for_itself() {
    let (admin, _guard) = shipped().await;
    let [a, b] = [NodeHost::install(cluster(), KS, "cuts-a").await, NodeHost::install(cluster(), KS, "cuts-b").await];
    let range = "198.18.112.0/27";
    let ipam = json!({"range": range, "network_name": "cuts", "node_slice_size": "/28", "min_node_slice_size": "/30"});
    let got = run(&a.netconf("cuts", ipam.clone()), "ADD", "pod-a", "ca").await;
    assert!(got.success, "A's ADD, its first slice cut with its own token: {}\n{}", got.stdout, got.stderr);
    let slice_pools = Api::<NodeSlicePool>::namespaced(admin.clone(), KS).list(&ListParams::default()).await;
    let nsp = slice_pools.unwrap().items.into_iter().find(|p| p.spec.range == range).expect("the NodeSlicePool");
    let name = nsp.metadata.name.clone().unwrap();
    let slices = nsp.status.clone().unwrap().allocations;
    let of_a = slices.iter().position(|s| s.node_name == "cuts-a").expect("A's slice");
    assert!(slices[of_a].slice_range.ends_with("/30"), "{slices:?}");
    let free =
        slices.iter().position(|s| s.node_name.is_empty() && s.slice_range.ends_with("/28")).expect("a free /28");
    let block: ipnet::IpNet = slices[free].slice_range.parse().unwrap();
    let parts: Vec<ipnet::IpNet> = block.subnets(30).unwrap().collect();
    let (first, rest) = (parts[0].to_string(), vec![format!("{}/29", parts[2].network()), parts[1].to_string()]);
    let as_b = store(&b).await;
    let cut = |to: &'static str, kept: String, rest: Vec<String>, at: usize| {
        let (as_b, name, slice) = (&as_b, &name, slices[at].clone());
        async move { as_b.split_slice(name, at, &slice, to, &kept, &rest).await }
    };
    refused(cut("cuts-a", first.clone(), rest.clone(), free).await, "cuts-b", "B cuts a free slice for A");
    let a_slice: ipnet::IpNet = slices[of_a].slice_range.parse().unwrap();
    let halves: Vec<String> = a_slice.subnets(31).unwrap().map(|h| h.to_string()).collect();
    refused(cut("cuts-b", halves[0].clone(), vec![halves[1].clone()], of_a).await, "cuts-b", "B cuts A's slice");
    let overlapping = vec![format!("{}/29", block.network())];
    refused(cut("cuts-b", first.clone(), overlapping, free).await, "cuts-b", "B cuts into overlapping parts");
    refused(cut("cuts-b", "198.18.113.0/30".into(), Vec::new(), free).await, "cuts-b", "B cuts a part outside");
    let applied = cut("cuts-b", first.clone(), rest, free).await.unwrap();
    assert_eq!(applied, Patched::Applied, "B cuts a free slice for itself");
    let after = Api::<NodeSlicePool>::namespaced(admin.clone(), KS).get(&name).await.unwrap();
    let listed = after.status.unwrap().allocations;
    assert!(listed.iter().any(|s| s.slice_range == first && s.node_name == "cuts-b"), "{listed:?}");
    assert_eq!(listed.len(), slices.len() + 2, "{listed:?}");
}

/// A pod recreated under the same name on node B while node A still records its address (A died before any DEL)
/// keeps the address: B rewrites the entry and takes the reservation over, each into its own name. Afterwards A can
/// remove neither; and no node takes over another pod's entry or reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_recreated_on_another_node_keeps_its_address_and_nothing_else_moves() {
    let (admin, _guard) = shipped().await;
    let a = NodeHost::install(cluster(), KS, "moved-a").await;
    let b = NodeHost::install(cluster(), KS, "moved-b").await;
    let range = "198.18.104.0/24";
    let ipam = json!({"range": range, "network_name": "moved"});
    let (on_a, on_b) = (a.netconf("moved", ipam.clone()), b.netconf("moved", ipam));
    assert_eq!(run(&on_a, "ADD", "web-0", "c-old").await.ips(), [ip("198.18.104.1")]);
    assert_eq!(run(&on_a, "ADD", "other", "c-other").await.ips(), [ip("198.18.104.2")]);

    assert_eq!(run(&on_b, "ADD", "web-0", "c-new").await.ips(), [ip("198.18.104.1")], "the same address");
    let (pool, offset, moved) = entry_of(&admin, range, "web-0").await;
    assert_eq!((moved.id.as_str(), moved.node.as_deref()), ("c-new", Some("moved-b")));
    let held = reservations(&admin, "moved").await;
    let web = held.iter().find(|r| r.spec.podref.ends_with("/web-0")).unwrap();
    assert_eq!((web.spec.containerid.as_str(), label(web)), ("c-new", Some("moved-b")));

    // A, back, cannot remove what is B's now (it could only claim the same pod again, which is what B did: the
    // policy cannot see where a pod runs); B cannot take A's other pod
    let as_a = store(&a).await;
    refused(as_a.remove_allocation(&pool, offset, &moved, None).await, "moved-a", "A removes B's entry");
    let what = "A deletes B's reservation";
    refused(
        as_a.delete_reservation(web.metadata.name.as_ref().unwrap(), &hereabouts_ipam::store::Version::of(web)).await,
        "moved-a",
        what,
    );
    let (_, other_offset, other) = entry_of(&admin, range, "other").await;
    let mut taken = other.clone();
    (taken.podref, taken.id, taken.node) = (format!("{KS}/web-0"), "c-new".into(), Some("moved-b".into()));
    let what = "B rewrites another pod's entry";
    refused(store(&b).await.replace_allocation(&pool, other_offset, &other, &taken).await, "moved-b", what);
    let theirs = held.iter().find(|r| r.spec.podref.ends_with("/other")).unwrap();
    let mut claim_spec = theirs.spec.clone();
    (claim_spec.podref, claim_spec.containerid) = (format!("{KS}/web-0"), "c-new".into());
    let claim = Claim { spec: claim_spec, node: "moved-b".into(), at: k8s_openapi::jiff::Timestamp::now() };
    let what = "B takes over another pod's reservation";
    refused(store(&b).await.take_over_reservation(theirs, &claim).await, "moved-b", what);

    assert!(run(&on_b, "DEL", "web-0", "c-new").await.success);
    assert!(run(&on_a, "DEL", "other", "c-other").await.success);
    assert!(entries(&admin, range).await.is_empty() && reservations(&admin, "moved").await.is_empty());
}

/// Whereabouts records no node on its entries and labels no reservation: after the switch-over, the node running
/// such a pod releases both with its DEL. But no node writes an entry or a reservation without its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_without_a_node_are_released_by_a_node_but_never_written_by_one() {
    let (admin, _guard) = shipped().await;
    let host = NodeHost::install(cluster(), KS, "nodeless-a").await;
    let range = "198.18.105.0/24";
    let config = host.netconf("nodeless", json!({"range": range, "network_name": "nodeless"}));
    let pool_name = hereabouts_ipam::names::pool_name("nodeless", range.parse().unwrap());
    // as Whereabouts leaves them: an entry without node, a reservation without label
    let pool = hereabouts_tests::objects::mk_pool(&pool_name, range)
        .namespace(KS)
        .entry(3, mk_entry("cw", &format!("{KS}/legacy")).ifname("net1"))
        .build();
    Api::<IpPool>::namespaced(admin.clone(), KS).create(&PostParams::default(), &pool).await.unwrap();
    let reservation =
        mk_reservation("nodeless-198.18.105.3", &format!("{KS}/legacy")).container("cw").ifname("net1").build();
    let reservations_api = Api::<OverlappingRangeIpReservation>::namespaced(admin.clone(), KS);
    reservations_api.create(&PostParams::default(), &reservation).await.unwrap();

    let del = run(&config, "DEL", "legacy", "cw").await;
    assert!(del.success, "{}", del.stderr);
    assert!(entries(&admin, range).await.is_empty(), "the node-less entry is released: {}", del.stderr);
    assert!(reservations(&admin, "nodeless").await.is_empty(), "and its reservation: {}", del.stderr);

    let as_a = store(&host).await;
    let nodeless = IpAllocation { node: None, ..mk_entry("cx", &format!("{KS}/sneaky")).ifname("net1").build() };
    let what = "an entry that records no node";
    refused(as_a.add_allocation(&pool_name, 5, &nodeless, &AsRead::default()).await, "nodeless-a", what);
    let mut unlabelled = mk_reservation("nodeless-198.18.105.5", &format!("{KS}/sneaky")).container("cx").build();
    unlabelled.metadata.namespace = Some(KS.into());
    let created = reservations_api.create(&PostParams::default(), &unlabelled).await;
    assert!(created.is_ok(), "an administrator may: {created:?}");
    reservations_api.delete("nodeless-198.18.105.5", &Default::default()).await.unwrap();
    let as_node = Api::<OverlappingRangeIpReservation>::namespaced(host.client().await, KS);
    unlabelled.metadata.resource_version = None;
    denied(as_node.create(&PostParams::default(), &unlabelled).await, "nodeless-a", "an unlabelled reservation");
}

// ---------------------------------------------------------------------------------------------------------------
// The rights only a value grants

/// Applies the chart rendered with `value` exclusively, runs `job`, and puts the default back.
async fn with_value<F, Fut>(value: &str, job: F)
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let _guard = VALUES.write().await;
    let admin = cluster().admin().await;
    in_force(&admin, &deploy::render(&[value])).await;
    job(admin.clone()).await;
    in_force(&admin, &deploy::manifest()).await;
}

/// A config that chooses ranges per pod reads the pod: by default the host's token may not, and the ADD fails
/// naming the chart's value; with `cni.rangeChoice` the same ADD works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_choice_reads_pods_only_with_its_value() {
    let range = "198.18.106.0/24";
    let ipam = json!({"pod_ranges": true, "network_name": "choice", "ipRanges": [{"range": range, "name": "blue"}]});
    {
        let (admin, _guard) = shipped().await;
        let host = NodeHost::install(cluster(), KS, "choice-a").await;
        mk_pod(KS, "chooser").node(&host.node).annotation("hereabouts.cni.cncf.io/ranges", "blue").create(&admin).await;
        let add = run(&host.netconf("choice", ipam.clone()), "ADD", "chooser", "c1").await;
        assert_eq!(add.error_code(), 103, "{}", add.stdout);
        assert!(add.stdout.contains(hereabouts_ipam::claim::RANGES_VALUE), "names the value: {}", add.stdout);
        assert!(entries(&admin, range).await.is_empty());
    }
    with_value(deploy::CNI_RANGES_VALUE, |admin| async move {
        let host = NodeHost::install(cluster(), KS, "choice-b").await;
        let add = run(&host.netconf("choice", ipam.clone()), "ADD", "chooser", "c2").await;
        assert_eq!(add.ips(), [ip("198.18.106.1")], "{}", add.stderr);
        assert!(run(&host.netconf("choice", ipam), "DEL", "chooser", "c2").await.success);
        assert!(entries(&admin, range).await.is_empty());
    })
    .await;
}

/// IaaS provider mode with candidates of mixed classes warns with an Event on the pod: by default the host's token
/// may not create it (the ADD goes on, the warning is logged); with `cni.providerEvents` the Event is there. The
/// ADD's sub-interface record, in its own name, passes the node policy either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_warning_event_needs_its_value() {
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let section = json!({"url": provider.url(), "ca_file": provider.ca_file(), "parent_interface": "lo"});
    let ranges = json!([{"range": "198.18.107.0/24", "iaas_provider": false}, {"range": "198.18.108.0/28"}]);
    let ipam = json!({"ipRanges": ranges, "iaas_provider": section, "network_name": "iaas-events"});
    let events_on = |admin: Client, pod: &'static str| async move {
        let api = Api::<Event>::namespaced(admin, KS);
        api.list(&ListParams::default().fields(&format!("involvedObject.name={pod}"))).await.unwrap().items
    };
    {
        let (admin, _guard) = shipped().await;
        let host = NodeHost::install(cluster(), KS, "events-a").await;
        let add = run(&host.netconf("iaas-events", ipam.clone()), "ADD", "warned-1", "c1").await;
        assert_eq!(add.ips(), [ip("198.18.108.1")], "{}", add.stderr);
        assert!(add.stderr.contains("could not put the Warning Event on the pod"), "{}", add.stderr);
        assert!(add.stderr.contains("forbidden"), "{}", add.stderr);
        assert!(events_on(admin.clone(), "warned-1").await.is_empty(), "no Event without the value");
        let (pool, offset, _) = entry_of(&admin, "198.18.108.0/28", "warned-1").await;
        let recorded = Api::<IpPool>::namespaced(admin, KS).get(&pool).await.unwrap().spec.sub_interfaces;
        assert_eq!(recorded[&offset.to_string()].node, "events-a", "the sub-interface record, in its own name");
    }
    with_value(deploy::CNI_EVENTS_VALUE, |admin| async move {
        let host = NodeHost::install(cluster(), KS, "events-b").await;
        let add = run(&host.netconf("iaas-events", ipam), "ADD", "warned-2", "c2").await;
        assert_eq!(add.ips().len(), 1, "{}", add.stderr);
        let events = events_on(admin, "warned-2").await;
        assert_eq!(events.len(), 1, "the Warning Event with the value: {events:?}\n{}", add.stderr);
        assert_eq!(events[0].reason.as_deref(), Some(hereabouts_ipam::provider::IGNORED_CANDIDATES_REASON));
    })
    .await;
}

/// The node policy at slice mode's largest NodeSlicePool: a node's claim of one of 8,192 slices (a /17 in /30s),
/// and its cut of a free slice of 8,192 (adaptive), pass. Comparing every entry with every other ran out of CEL's
/// cost budget from about 1,000 slices: the claim on a /20 in /30s was refused until the ADD's time ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_claims_and_cuts_in_the_largest_node_slice_pool() {
    let (_admin, _guard) = shipped().await;
    let a = NodeHost::install(cluster(), KS, "big-a").await;
    for (network, range, size, min) in
        [("bigfixed", "198.19.0.0/17", "/30", None), ("bigcut", "198.19.128.0/17", "/19", Some("/30"))]
    {
        let mut ipam = json!({"range": range, "network_name": network, "node_slice_size": size});
        if let Some(min) = min {
            ipam["min_node_slice_size"] = json!(min);
        }
        // the adaptive network's NodeSlicePool starts with four /19s: cut down to the smallest, a node's cuts add
        // entries; here each cut is of a free /19, and 8,192 entries are listed only at the end of a long life,
        // so the fixed network stands for the large list
        let out = run(&a.netconf(network, ipam), "ADD", &format!("pod-{network}"), &format!("c-{network}")).await;
        assert!(out.success, "{network}: {}\n{}", out.stdout, out.stderr);
    }
}
