//! The fault proxy (`hereabouts_tests::faultproxy`) on the real control plane: it relays faithfully, and each
//! action does what it says, seen from the client, from the API server and in the proxy's record.

use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use hereabouts_ipam::crd::{IpAllocation, IpPool, OverlappingRangeIpReservation};
use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Seen, Verb};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::objects::{mk_pool, mk_reservation};
use hereabouts_tests::plugin::{self, Invocation};
use hereabouts_tests::{Identity, TestCluster, wait};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use tokio::io::AsyncWriteExt as _;

const POOL: &str = "198.18.0.0-24";

fn new_pool(name: &str) -> IpPool {
    mk_pool(name, "198.18.0.0/24").build()
}

fn add_allocation(offset: u32, id: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"spec": {"allocations": {offset.to_string(): {"id": id, "podref": format!("ns/{id}")}}}}))
}

/// The error of `result`, which must be a transport failure rather than an answer of the server.
fn transport_error<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> kube::Error {
    match result {
        Ok(value) => panic!("expected a transport error, got an answer: {value:?}"),
        Err(kube::Error::Api(status)) => panic!("expected a transport error, got an HTTP status: {status:?}"),
        Err(e) => e,
    }
}

/// `err` with its chain of causes, which kube's `Display` leaves out.
fn chain(err: &kube::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn api_code(err: kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error status, got {other}"),
    }
}

/// The one request of `verb` on `resource` the proxy saw; panics, listing what it saw, unless there is exactly one.
fn only(seen: &[Seen], verb: Verb, resource: &str) -> Seen {
    let matching: Vec<&Seen> = seen.iter().filter(|s| s.is(verb, resource)).collect();
    assert_eq!(matching.len(), 1, "expected one {verb} {resource}, the proxy saw {seen:#?}");
    matching[0].clone()
}

struct Setup {
    cluster: &'static TestCluster,
    ns: String,
    proxy: FaultProxy,
    /// Pools of the namespace, read and written directly.
    direct: Api<IpPool>,
    /// The same, through the proxy.
    via: Api<IpPool>,
}

async fn setup(prefix: &str) -> Setup {
    let cluster = TestCluster::get();
    let ns = cluster.namespace(prefix).await;
    let proxy = FaultProxy::start(cluster).await;
    let direct = Api::namespaced(cluster.admin().await, &ns);
    let via = Api::namespaced(proxy.client(cluster, Identity::Admin).await, &ns);
    Setup { cluster, ns, proxy, direct, via }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_list_and_create_through_the_proxy_behave_as_direct_ones() {
    let s = setup("fp-relay").await;
    let created = s.via.create(&PostParams::default(), &new_pool(POOL)).await.expect("create through the proxy");
    let direct = s.direct.get(POOL).await.expect("the pool exists");
    assert_eq!(created.metadata.uid, direct.metadata.uid);
    assert_eq!(created.spec, direct.spec);

    let got = s.via.get(POOL).await.expect("get through the proxy");
    assert_eq!(got.metadata, direct.metadata);
    assert_eq!(got.spec, direct.spec);
    let listed = s.via.list(&ListParams::default()).await.expect("list through the proxy");
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].metadata.uid, direct.metadata.uid);
    let missing = s.via.get("nope").await.expect_err("a missing pool");
    assert_eq!(api_code(missing), 404, "the server's own statuses come through");

    // kube's client may read discovery or the like first; the proxy must have seen at least these
    let seen = s.proxy.seen();
    let create = only(&seen, Verb::Create, "ippools");
    assert_eq!((create.status, create.action.clone()), (Some(201), None));
    assert_eq!(create.request.namespace.as_deref(), Some(s.ns.as_str()));
    let gets: Vec<&Seen> = seen.iter().filter(|x| x.is(Verb::Get, "ippools")).collect();
    assert_eq!(gets.len(), 2, "{seen:#?}");
    assert_eq!(gets[0].request.name.as_deref(), Some(POOL));
    assert_eq!(gets[0].status, Some(200));
    assert_eq!(gets[1].status, Some(404));
    assert_eq!(only(&seen, Verb::List, "ippools").status, Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_response_loses_the_answer_to_an_applied_patch() {
    let s = setup("fp-drop").await;
    s.direct.create(&PostParams::default(), &new_pool(POOL)).await.unwrap();
    s.proxy.add_rule(Rule::nth(Verb::Patch, "ippools", 1, Action::DropResponse));

    let err = transport_error(s.via.patch(POOL, &PatchParams::default(), &add_allocation(5, "lost")).await);
    eprintln!("the client saw: {}", chain(&err));
    let pool = s.direct.get(POOL).await.unwrap();
    assert_eq!(pool.spec.allocations.get("5").map(|a| a.id.as_str()), Some("lost"), "the patch was applied");

    let seen = s.proxy.seen();
    let dropped = only(&seen, Verb::Patch, "ippools");
    assert_eq!(dropped.action, Some(Action::DropResponse));
    assert_eq!(dropped.status, Some(200), "the server answered the dropped patch");

    // the rule fired once: the next patch is answered
    let next = s.via.patch(POOL, &PatchParams::default(), &add_allocation(6, "kept")).await.expect("second patch");
    assert!(next.spec.allocations.contains_key("5") && next.spec.allocations.contains_key("6"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_before_forward_never_reaches_the_server() {
    let s = setup("fp-reset").await;
    let reservations: Api<OverlappingRangeIpReservation> = Api::namespaced(s.cluster.admin().await, &s.ns);
    let via: Api<OverlappingRangeIpReservation> =
        Api::namespaced(s.proxy.client(s.cluster, Identity::Admin).await, &s.ns);
    let name = "198.18.0.7";
    let reservation = mk_reservation(name, "ns/p").container("c1").ifname("net1").build();
    s.proxy.add_rule(Rule::nth(Verb::Create, "overlappingrangeipreservations", 1, Action::ResetBeforeForward));

    let err = transport_error(via.create(&PostParams::default(), &reservation).await);
    eprintln!("the client saw: {}", chain(&err));
    assert_eq!(api_code(reservations.get(name).await.unwrap_err()), 404, "the server never saw the create");
    let seen = s.proxy.seen();
    let reset = only(&seen, Verb::Create, "overlappingrangeipreservations");
    assert_eq!((reset.action, reset.status, reset.error), (Some(Action::ResetBeforeForward), None, None));

    via.create(&PostParams::default(), &reservation).await.expect("the rule fired once");
    reservations.get(name).await.expect("created the second time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_answers_in_place_of_the_server() {
    let s = setup("fp-status").await;
    s.direct.create(&PostParams::default(), &new_pool(POOL)).await.unwrap();
    s.proxy.add_rule(Rule::nth(Verb::Get, "ippools", 2, Action::Status(500, "injected by the test".into())));
    s.proxy.add_rule(Rule::nth(Verb::Create, "ippools", 1, Action::Status(422, "refused by the test".into())));

    s.via.get(POOL).await.expect("the first get is not the rule's");
    match s.via.get(POOL).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 500);
            assert_eq!(status.message, "injected by the test");
            assert_eq!(status.reason, "InternalError");
        }
        other => panic!("expected the injected 500, got {other:?}"),
    }
    s.via.get(POOL).await.expect("the third get is not the rule's");

    let refused = s.via.create(&PostParams::default(), &new_pool("198.18.1.0-24")).await.unwrap_err();
    assert_eq!(api_code(refused), 422);
    assert_eq!(api_code(s.direct.get("198.18.1.0-24").await.unwrap_err()), 404, "the create was not forwarded");

    let seen = s.proxy.seen();
    let gets: Vec<&Seen> = seen.iter().filter(|x| x.is(Verb::Get, "ippools")).collect();
    let outcome: Vec<_> = gets.iter().map(|g| (g.action.clone(), g.status)).collect();
    assert_eq!(
        outcome,
        vec![(None, Some(200)), (Some(Action::Status(500, "injected by the test".into())), None), (None, Some(200))]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_forwards_after_its_time() {
    let s = setup("fp-delay").await;
    s.direct.create(&PostParams::default(), &new_pool(POOL)).await.unwrap();
    let delay = Duration::from_millis(1500);
    s.proxy.add_rule(Rule::nth(Verb::Get, "ippools", 1, Action::Delay(delay)));

    let t0 = Instant::now();
    s.via.get(POOL).await.expect("a delayed get is answered");
    let took = t0.elapsed();
    eprintln!("the delayed get took {took:?}");
    assert!(took >= delay, "the get took {took:?}, less than the {delay:?} delay");
    let seen = only(&s.proxy.seen(), Verb::Get, "ippools");
    assert_eq!((seen.action, seen.status), (Some(Action::Delay(delay)), Some(200)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_forwards_nothing_until_released() {
    let s = setup("fp-hold").await;
    s.proxy.add_rule(Rule::nth(Verb::Create, "ippools", 1, Action::Hold));
    let via = s.via.clone();
    let create = tokio::spawn(async move { via.create(&PostParams::default(), &new_pool(POOL)).await });

    s.proxy.wait_held(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!create.is_finished(), "a held request was answered");
    assert_eq!(api_code(s.direct.get(POOL).await.unwrap_err()), 404, "a held request reached the server");
    assert_eq!(s.proxy.held(), 1);

    assert_eq!(s.proxy.release_held(), 1);
    let created = create.await.unwrap().expect("the released create is answered");
    assert_eq!(s.direct.get(POOL).await.unwrap().metadata.uid, created.metadata.uid);
    let seen = only(&s.proxy.seen(), Verb::Create, "ippools");
    assert_eq!((seen.action, seen.status), (Some(Action::Hold), Some(201)));
    assert_eq!(s.proxy.held(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_streams_through_and_ends_with_the_proxy() {
    let s = setup("fp-watch").await;
    let version = s.via.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let events = s.via.watch(&WatchParams::default().timeout(60), &version).await.expect("watch through the proxy");
    let mut events = std::pin::pin!(events);
    // each event arrives as it happens, long before the response ends
    for i in 0..2 {
        let name = format!("198.18.{i}.0-24");
        s.direct.create(&PostParams::default(), &new_pool(&name)).await.unwrap();
        let event = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("the event streamed through")
            .expect("the watch goes on")
            .expect("a watch event");
        match event {
            WatchEvent::Added(pool) => assert_eq!(pool.metadata.name, Some(name)),
            other => panic!("expected the pool's creation, got {other:?}"),
        }
    }
    assert_eq!(only(&s.proxy.seen(), Verb::Watch, "ippools").status, Some(200));

    drop(s.proxy);
    let end =
        tokio::time::timeout(Duration::from_secs(20), events.next()).await.expect("the watch ends with the proxy");
    assert!(!matches!(end, Some(Ok(_))), "an event after the proxy stopped: {end:?}");
    assert!(s.via.get(POOL).await.is_err(), "the stopped proxy still answers");
}

/// A network config whose IPAM reaches the API server through `proxy`, as the CNI identity of `fx`.
fn proxied_netconf(fx: &CniFixture, proxy: &FaultProxy, range: &str) -> serde_json::Value {
    let kubeconfig = proxy.kubeconfig(fx.cluster, Identity::Cni, &fx.ns);
    plugin::netconf("1.0.0", "proxied", &kubeconfig, json!({"range": range}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cni_binary_works_through_the_proxy() {
    let fx = CniFixture::new("fp-cni").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let config = proxied_netconf(&fx, &proxy, "198.18.40.0/24");

    let out = fx.add(&config, "web", "c1").await;
    let ips = out.ips();
    assert_eq!(ips.len(), 1);
    let pool = fx.pool("198.18.40.0-24").await;
    let held: Vec<&IpAllocation> = pool.spec.allocations.values().collect();
    assert_eq!(held.len(), 1);
    assert_eq!((held[0].id.as_str(), held[0].podref.clone()), ("c1", format!("{}/web", fx.ns)));

    let seen = proxy.seen();
    let requests: Vec<String> =
        seen.iter().map(|x| format!("{} {} {:?}", x.request.verb, x.request.resource, x.status)).collect();
    eprintln!("the ADD's requests: {requests:?}");
    let resources: Vec<&Seen> = seen.iter().filter(|x| !x.request.resource.is_empty()).collect();
    assert!(resources.iter().all(|x| x.request.namespace.as_deref() == Some(fx.ns.as_str())), "{seen:#?}");
    assert!(
        seen.iter().any(|x| x.is(Verb::Get, "ippools") && x.status == Some(404)),
        "the pool was looked up: {seen:#?}"
    );
    assert_eq!(only(&seen, Verb::Create, "ippools").status, Some(201));
    let patches: Vec<Option<u16>> = seen.iter().filter(|x| x.is(Verb::Patch, "ippools")).map(|x| x.status).collect();
    assert_eq!(patches, [Some(200), Some(200)], "the new pool's settle, then the entry: {seen:#?}");
    assert_eq!(only(&seen, Verb::Create, "overlappingrangeipreservations").status, Some(201));
}

/// Starts the plugin as [`Invocation::run`] does, but hands back the process so the test can kill it.
async fn spawn_plugin(inv: &Invocation) -> tokio::process::Child {
    let mut child = tokio::process::Command::new(plugin::workspace_bin("hereabouts"))
        .env_clear()
        .env("CNI_COMMAND", inv.command)
        .env("CNI_CONTAINERID", &inv.container_id)
        .env("CNI_NETNS", format!("/var/run/netns/{}", inv.container_id))
        .env("CNI_IFNAME", &inv.ifname)
        .env("CNI_ARGS", &inv.args)
        .env("CNI_PATH", plugin::target_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn hereabouts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(inv.config.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_of_a_killed_plugin_is_applied_on_release() {
    let fx = CniFixture::new("fp-kill").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let config = proxied_netconf(&fx, &proxy, "198.18.41.0/24");
    // the first patch settles the new pool (hereabouts_ipam::claim::replaces); the second is the entry
    proxy.add_rule(Rule::nth(Verb::Patch, "ippools", 2, Action::Hold));

    let mut child = spawn_plugin(&fx.invocation("ADD", &config, "victim", "c-killed")).await;
    proxy.wait_held(1).await;
    child.kill().await.expect("SIGKILL the plugin");
    assert!(fx.pool("198.18.41.0-24").await.spec.allocations.is_empty(), "the held patch was not forwarded yet");

    assert_eq!(proxy.release_held(), 1);
    let applied = wait::until(Duration::from_secs(30), "the released patch to be answered", || async {
        proxy.seen().iter().filter(|x| x.is(Verb::Patch, "ippools")).nth(1).and_then(|x| x.status)
    })
    .await
    .unwrap();
    assert_eq!(applied, 200);
    let pool = fx.pool("198.18.41.0-24").await;
    let ids: Vec<&str> = pool.spec.allocations.values().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, vec!["c-killed"], "the dead plugin's write is applied: a leak for the reconciler to find");
}
