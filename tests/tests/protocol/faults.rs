//! The CNI plugin under the faults a real cluster produces, on the real control plane: a fault-injecting proxy
//! between the plugin and the API server loses answers, resets connections, holds requests while the plugin is
//! killed, and answers with refusals. Each test reproduces a defect seen on 73e4a71 (issue 9's numbers).

use std::collections::BTreeSet;
use std::net::IpAddr;

use hereabouts_ipam::crd::OverlappingRangeIpReservation;
use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::plugin::netconf;
use hereabouts_tests::{Identity, TestCluster};
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};

/// A fixture, plus a proxy whose kubeconfig (admin: these tests are about the protocol, not RBAC) the faulty
/// invocations use.
struct Fx {
    fx: CniFixture,
    proxy: FaultProxy,
}

impl Fx {
    async fn new(prefix: &str) -> Self {
        let fx = CniFixture::new(prefix).await;
        let proxy = FaultProxy::start(TestCluster::get()).await;
        Self { fx, proxy }
    }

    /// A config for `range` whose API requests go through the proxy.
    fn through_proxy(&self, name: &str, ipam: Value) -> Value {
        let kubeconfig = self.proxy.kubeconfig(self.fx.cluster, Identity::Admin, &self.fx.ns);
        netconf("1.0.0", name, &kubeconfig, ipam)
    }

    /// A config for `range` whose requests go straight to the API server.
    fn direct(&self, name: &str, ipam: Value) -> Value {
        self.fx.netconf("1.0.0", name, ipam)
    }

    /// Makes the pool of `ipam` for the config `name` with an ADD and a DEL straight to the API server, so that
    /// the next patch of the pool through the proxy is an entry's (a new pool's first patch settles it).
    async fn pool_made(&self, name: &str, ipam: Value) {
        let direct = self.direct(name, ipam);
        self.fx.add(&direct, "maker", "c-maker").await.result();
        assert!(self.fx.del(&direct, "maker", "c-maker").await.success);
    }

    /// The podref holding each reservation, by name.
    async fn reservations(&self) -> Vec<(String, String, String)> {
        let mut all: Vec<(String, String, String)> = self
            .fx
            .reservations()
            .await
            .into_iter()
            .map(|r| (r.metadata.name.unwrap_or_default(), r.spec.podref, r.spec.containerid))
            .collect();
        all.sort();
        all
    }

    fn podref(&self, pod: &str) -> String {
        format!("{}/{pod}", self.fx.ns)
    }

    fn count(&self, verb: Verb, resource: &str) -> usize {
        self.proxy.seen().iter().filter(|s| s.is(verb, resource)).count()
    }

    fn fired(&self, verb: Verb, resource: &str, action: &Action) -> bool {
        self.proxy.seen().iter().any(|s| s.is(verb, resource) && s.action.as_ref() == Some(action))
    }
}

/// Defect 1: the pool patch is applied, its answer lost; the retry's test fails (422) and the ADD took that for
/// a real collision, deleted its own reservation, found its entry on the re-read and succeeded without a
/// reservation — so an ADD on an overlapping range got the same address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_patch_answer_never_leaves_an_address_unreserved() {
    let fx = Fx::new("fault-lost-patch").await;
    let wide = fx.through_proxy("wide", json!({"range": "198.18.70.0/24"}));
    let narrow = fx.direct("narrow", json!({"range": "198.18.70.0/28"}));
    fx.proxy.add_rule(Rule::nth(Verb::Patch, "ippools", 1, Action::DropResponse));

    let a = fx.fx.add(&wide, "pod-a", "c-a").await.ips();
    assert!(fx.fired(Verb::Patch, "ippools", &Action::DropResponse), "the fault fired: {:?}", fx.proxy.seen());
    let b = fx.fx.add(&narrow, "pod-b", "c-b").await.ips();
    assert_ne!(a, b, "an address handed to two pods: pod-a {a:?}, pod-b {b:?}");
    let reservations = fx.reservations().await;
    assert!(
        reservations.contains(&(a[0].to_string(), fx.podref("pod-a"), "c-a".into())),
        "pod-a's address is reserved: {reservations:?}"
    );
}

/// Defect 1, on the reservation create: its answer lost after the server created it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reservation_create_answer_is_read_back_as_ours() {
    let fx = Fx::new("fault-lost-create").await;
    let config = fx.through_proxy("net", json!({"range": "198.18.71.0/24"}));
    fx.proxy.add_rule(Rule::nth(Verb::Create, "overlappingrangeipreservations", 1, Action::DropResponse));
    let a = fx.fx.add(&config, "pod-a", "c-a").await.ips();
    assert!(fx.fired(Verb::Create, "overlappingrangeipreservations", &Action::DropResponse));
    assert_eq!(a, [ip("198.18.71.1")], "the lowest address, claimed by the create whose answer was lost");
    assert_eq!(fx.reservations().await, [("198.18.71.1".into(), fx.podref("pod-a"), "c-a".into())]);
}

/// Defect 2: an ADD that finds the attachment's entry (a retried ADD from a new sandbox) while its reservation
/// is gone (Whereabouts' DEL deletes reservations by name) re-creates the reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_entry_gets_its_reservation_back() {
    let fx = Fx::new("fault-kept-entry").await;
    let wide = fx.through_proxy("wide", json!({"range": "198.18.72.0/24"}));
    let narrow = fx.direct("narrow", json!({"range": "198.18.72.0/28"}));
    let first = fx.fx.add(&wide, "pod-a", "c-1").await.ips();
    let reservations = Api::<OverlappingRangeIpReservation>::namespaced(fx.fx.admin.clone(), &fx.fx.ns);
    reservations.delete(&first[0].to_string(), &DeleteParams::default()).await.unwrap();

    // the runtime retries the sandbox: a new container id for the same pod and interface
    let again = fx.fx.add(&wide, "pod-a", "c-2").await.ips();
    assert_eq!(again, first, "the attachment keeps its address");
    assert!(fx.count(Verb::Create, "overlappingrangeipreservations") >= 2, "{:?}", fx.proxy.seen());
    let b = fx.fx.add(&narrow, "pod-b", "c-b").await.ips();
    assert_ne!(b, first, "an address handed to two pods");
    assert!(fx.reservations().await.contains(&(first[0].to_string(), fx.podref("pod-a"), "c-2".into())));
}

/// Defect 6: an ADD killed after its reservation was created leaves that claim under the old container id; the
/// retried ADD (new container id) kept it as it was, so the later DEL could not delete it and the address was
/// blocked until the daily cron. The retry takes the claim over, and the DEL frees everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_add_leaves_nothing_the_retry_and_del_do_not_free() {
    let fx = Fx::new("fault-killed").await;
    let config = fx.through_proxy("net", json!({"range": "198.18.73.0/24"}));
    fx.pool_made("net", json!({"range": "198.18.73.0/24"})).await;
    fx.proxy.add_rule(Rule::nth(Verb::Patch, "ippools", 1, Action::Hold));
    let running = fx.fx.invocation("ADD", &config, "pod-a", "c-1").start().await;
    fx.proxy.wait_held(1).await;
    // the runtime's timeout: SIGKILL while the pool patch is in flight (it never reaches the server)
    running.kill().await;
    assert_eq!(fx.reservations().await, [("198.18.73.1".into(), fx.podref("pod-a"), "c-1".into())]);

    let direct = fx.direct("net", json!({"range": "198.18.73.0/24"}));
    let retry = fx.fx.add(&direct, "pod-a", "c-2").await.ips();
    assert_eq!(retry, [ip("198.18.73.1")]);
    assert_eq!(
        fx.reservations().await,
        [("198.18.73.1".into(), fx.podref("pod-a"), "c-2".into())],
        "the retry took its earlier sandbox's claim over"
    );
    let del = fx.fx.del(&direct, "pod-a", "c-2").await;
    assert!(del.success, "{}", del.stdout);
    assert_eq!(fx.fx.object_count().await, (1, 0), "the DEL freed the reservation too");
    assert!(fx.fx.pool("198.18.73.0-24").await.spec.allocations.is_empty());
}

/// Defect 8: a 422 that is not the allocation's own test (an admission policy, a schema) is a refusal: the ADD
/// fails at once with its own code, rolls back, and does not spin for its whole budget. The pool is new, so the
/// first patch refused is its settle (which spun until the budget ran out, code 11, before it read the pool back
/// to tell its own test's refusal from another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_is_not_the_test_fails_at_once_and_rolls_back() {
    let fx = Fx::new("fault-422").await;
    let config = fx.through_proxy("net", json!({"range": "198.18.74.0/24", "timeout_seconds": 60}));
    let denied = Action::Status(422, "admission webhook \"policy.example.com\" denied the request".into());
    fx.proxy.add_rule(Rule::every(Verb::Patch, "ippools", denied.clone()));
    let out = fx.fx.add(&config, "pod-a", "c-1").await;
    assert_eq!(out.error_code(), 103, "{}", out.stdout);
    assert!(out.stdout.contains("policy.example.com"), "the server's words are in the error: {}", out.stdout);
    let patches = fx.count(Verb::Patch, "ippools");
    assert!((1..=2).contains(&patches), "tried once (and read back), not for the whole budget: {patches} patches");
    assert_eq!(fx.fx.object_count().await, (1, 0), "the reservation was rolled back");
}

/// Defect 7: a pool at the storage's size limit answers every further write with "request is too large": that
/// is an immediate error of its own, not 90 s of retries ending in "try again later".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_at_the_size_limit_is_a_distinct_immediate_error() {
    let fx = Fx::new("fault-too-large").await;
    let config = fx.through_proxy("net", json!({"range": "198.18.75.0/24"}));
    fx.pool_made("net", json!({"range": "198.18.75.0/24"})).await;
    let too_large = Action::Status(500, "etcdserver: request is too large".into());
    fx.proxy.add_rule(Rule::every(Verb::Patch, "ippools", too_large));
    let out = fx.fx.add(&config, "pod-a", "c-1").await;
    assert_eq!(out.error_code(), 104, "{}", out.stdout);
    assert!(out.stdout.contains("node_slice_size"), "the error says what to do: {}", out.stdout);
    assert_eq!(fx.count(Verb::Patch, "ippools"), 1, "no retry can help: {:?}", fx.proxy.seen());
    assert_eq!(fx.fx.object_count().await, (1, 0), "the reservation was rolled back");
}

/// Resets and 503s on every kind of request, a few each, still end in one reserved address per pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_and_server_errors_everywhere_still_give_distinct_reserved_addresses() {
    let fx = Fx::new("fault-mixed").await;
    let config = fx.through_proxy("net", json!({"range": "198.18.76.0/24"}));
    let rules = [
        (Verb::Get, "ippools", Action::ResetBeforeForward),
        (Verb::Create, "overlappingrangeipreservations", Action::DropResponse),
        (Verb::Patch, "ippools", Action::DropResponse),
        (Verb::Patch, "ippools", Action::Status(503, "the server is shutting down".into())),
        (Verb::Get, "overlappingrangeipreservations", Action::Status(429, "too many requests".into())),
    ];
    for (i, (verb, resource, action)) in rules.into_iter().enumerate() {
        fx.proxy.add_rule(Rule::nth(verb, resource, 2 + i, action));
    }
    let mut all = BTreeSet::new();
    for i in 0..8 {
        let ips = fx.fx.add(&config, &format!("pod-{i}"), &format!("c-{i}")).await.ips();
        assert!(all.insert(ips[0]), "{} handed out twice", ips[0]);
    }
    let fired = fx.proxy.seen().iter().filter(|s| s.action.is_some()).count();
    assert!(fired >= 4, "the faults fired: {:?}", fx.proxy.seen());
    let reserved: BTreeSet<IpAddr> = fx.reservations().await.iter().map(|(n, _, _)| ip(n)).collect();
    assert_eq!(reserved, all, "every address reserved, nothing else");
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Defect 11: a reservation that already existed for the same pod and interface was adopted as it was (old
/// container id, old resourceVersion), so the earlier sandbox's guarded delete still passed: the loser of two
/// concurrent ADDs of one pod, rolling back, removed the claim under the entry the other sandbox holds, and an
/// overlapping range handed the address out again. Forced here by holding one sandbox's pool patch while the other
/// ADDs; then a dozen unforced races. Every pair ends with one entry and its reservation, both of one sandbox, and
/// the other sandbox's DEL frees neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sandbox_of_a_pod_owns_the_claim_the_first_can_no_longer_delete() {
    let fx = Fx::new("fault-two-sandboxes").await;
    let wide = fx.direct("wide", json!({"range": "198.18.74.0/24"}));
    let narrow = fx.direct("narrow", json!({"range": "198.18.74.0/27"}));

    // in sequence: the runtime retries the sandbox, then tears the old one down
    let first = fx.fx.add(&wide, "pod-s", "s-1").await.ips();
    assert_eq!(fx.fx.add(&wide, "pod-s", "s-2").await.ips(), first);
    assert!(fx.fx.del(&wide, "pod-s", "s-1").await.success);

    // forced: sandbox x has its reservation and its pool patch in flight when sandbox y of the same pod ADDs
    let held = fx.through_proxy("wide", json!({"range": "198.18.74.0/24"}));
    fx.proxy.add_rule(Rule::nth(Verb::Patch, "ippools", 1, Action::Hold));
    // on another node name: on one node the host lock would make y wait for x, and the protocol must hold
    // without the lock too (it is best effort)
    let x = fx.fx.invocation("ADD", &held, "pod-h", "pod-h-x").with_env("NODENAME", "node-x").start().await;
    fx.proxy.wait_held(1).await;
    let y = fx.fx.add(&wide, "pod-h", "pod-h-y").await;
    assert!(y.success, "{}", y.stderr);
    assert_eq!(fx.proxy.release_held(), 1);
    let x = x.wait().await;
    assert!(x.success, "{}", x.stderr);
    assert_eq!(x.ips(), y.ips(), "one attachment, one address");
    assert!(fx.fired(Verb::Patch, "ippools", &Action::Hold), "{:?}", fx.proxy.seen());

    // unforced: a dozen pods, each ADDed from two sandboxes at once
    let mut trials: Vec<String> = (0..12).map(|i| format!("pod-{i}")).collect();
    let mut racing = Vec::new();
    for pod in &trials {
        for sandbox in ["x", "y"] {
            let add = fx.fx.invocation("ADD", &wide, pod, &format!("{pod}-{sandbox}"));
            racing.push(tokio::spawn(async move { add.run().await }));
        }
    }
    for add in racing {
        add.await.unwrap();
    }
    trials.push("pod-h".into());
    let pool = fx.fx.pool("198.18.74.0-24").await;
    let mut kept = vec![("pod-s".to_string(), "s-2".to_string())];
    for pod in &trials {
        let holder = pool.spec.allocations.values().find(|a| a.podref == fx.podref(pod));
        let holder = holder.unwrap_or_else(|| panic!("{pod} holds no entry: {:?}", pool.spec.allocations));
        let other = if holder.id.ends_with("-x") { format!("{pod}-y") } else { format!("{pod}-x") };
        let del = fx.fx.del(&wide, pod, &other).await;
        assert!(del.success, "{}", del.stdout);
        kept.push((pod.clone(), holder.id.clone()));
    }

    let pool = fx.fx.pool("198.18.74.0-24").await;
    let reservations = fx.reservations().await;
    assert_eq!(pool.spec.allocations.len(), kept.len(), "one entry per pod: {:?}", pool.spec.allocations);
    for (pod, sandbox) in &kept {
        let (offset, entry) = pool.spec.allocations.iter().find(|(_, a)| a.podref == fx.podref(pod)).unwrap();
        assert_eq!(&entry.id, sandbox, "{pod}: the entry is the kept sandbox's");
        let base = u32::from(std::net::Ipv4Addr::new(198, 18, 74, 0));
        let address = std::net::Ipv4Addr::from(base + offset.parse::<u32>().unwrap()).to_string();
        assert!(
            reservations.contains(&(address.clone(), fx.podref(pod), sandbox.clone())),
            "{pod}: {address} is reserved for {sandbox}: {reservations:?}"
        );
    }
    // the narrow range can only take what no pod holds
    let held: BTreeSet<String> = reservations.iter().map(|(name, _, _)| name.clone()).collect();
    for i in 0..4 {
        let got = fx.fx.add(&narrow, &format!("other-{i}"), &format!("o-{i}")).await.ips();
        assert!(!held.contains(&got[0].to_string()), "{} handed to two pods", got[0]);
    }
}
