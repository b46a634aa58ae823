//! IaaS provider mode end to end (global pools): the compiled plugin, run as a runtime runs it, against the test
//! API server and the reference provider over HTTPS.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use hereabouts_ipam::provider::ALLOCATE_PATH;
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::provider::{Fault, ProviderOptions, ReferenceProvider};
use hereabouts_tests::wait;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

const RELEASE: &str = hereabouts_ipam::provider::RELEASE_PATH;

fn config(fx: &CniFixture, provider: &ReferenceProvider, range: &str, extra: Value) -> Value {
    let mut section = json!({"url": provider.url(), "ca_file": provider.ca_file(), "parent_interface": "lo"});
    section.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    fx.netconf("1.0.0", "iaas", json!({"range": range, "iaas_provider": section}))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A fresh address makes one provider call and records the sub-interface in the pool; DEL releases the address
/// but keeps the sub-interface cached on its node, so the next ADD there takes it with no call; an ADD on
/// another node takes a fresh address rather than another node's idle sub-interface.
#[tokio::test]
async fn a_global_pool_calls_the_provider_once_per_sub_interface_and_reuses_its_cache() {
    let fx = CniFixture::new("iaas-cache").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let cfg = config(&fx, &provider, "198.18.40.0/24", json!({}));

    let t0 = Instant::now();
    let first = fx.add_on(&cfg, "node-a", "a").await;
    let with_call = t0.elapsed();
    assert_eq!(first.ips(), vec![ip("198.18.40.1")], "{}", first.stderr);
    assert_eq!(provider.allocate_calls(), 1);
    let call = &provider.calls()[0];
    assert_eq!(call.body["nodeName"], "node-a");
    assert_eq!(call.body["subEniRequests"][0]["ipv4Address"], "198.18.40.1");
    assert_eq!(call.body["subEniRequests"][0]["subnet"], "198.18.40.0/24");
    assert_eq!(call.body["subEniRequests"][0]["parentNicMac"], "00:00:00:00:00:00", "lo's MAC, read from the host");
    let pool = fx.pool("198.18.40.0-24").await;
    let record = &pool.spec.sub_interfaces["1"];
    assert_eq!(record.node, "node-a");
    assert_eq!(record.mac, provider.sub_enis()["198.18.40.1"].mac);
    assert_eq!(record.vlan, provider.sub_enis()["198.18.40.1"].vlan);

    let del = fx.del_on(&cfg, "node-a", "a").await;
    assert!(del.success, "{}", del.stdout);
    let pool = fx.pool("198.18.40.0-24").await;
    assert!(pool.spec.allocations.is_empty(), "DEL released the address");
    assert_eq!(pool.spec.sub_interfaces["1"].node, "node-a", "its sub-interface stays cached on node-a");
    assert_eq!(provider.calls().len(), 1, "DEL made no provider call");

    let t0 = Instant::now();
    let cached = fx.add_on(&cfg, "node-a", "b").await;
    let without_call = t0.elapsed();
    assert_eq!(cached.ips(), vec![ip("198.18.40.1")], "the cached sub-interface of node-a");
    assert_eq!(provider.allocate_calls(), 1, "no provider call for a cached sub-interface");

    assert!(fx.del_on(&cfg, "node-a", "b").await.success);
    let other = fx.add_on(&cfg, "node-b", "c").await;
    assert_eq!(other.ips(), vec![ip("198.18.40.2")], "a fresh address, not node-a's idle sub-interface");
    assert_eq!(provider.allocate_calls(), 2);
    assert_eq!(fx.pool("198.18.40.0-24").await.spec.sub_interfaces["1"].node, "node-a", "node-a keeps its cache");
    eprintln!(
        "ADD with a provider call {} ms, from the cache {} ms (one run each; the reference provider's cloud delay is 20 ms)",
        with_call.as_millis(),
        without_call.as_millis()
    );
}

/// When every free address has an idle sub-interface on another node, one is moved here by the provider; one the
/// provider is unbinding (`vlan: -1`) is never handed out.
#[tokio::test]
async fn another_nodes_idle_sub_interface_is_taken_last_and_an_unbinding_one_never() {
    let fx = CniFixture::new("iaas-steal").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    // a /29: .1 to .6 usable
    let cfg = config(&fx, &provider, "198.18.41.0/29", json!({}));
    for pod in ["a", "b", "c", "d", "e", "f"] {
        assert!(fx.add_on(&cfg, "node-a", pod).await.success);
    }
    for pod in ["a", "b", "c", "d", "e", "f"] {
        assert!(fx.del_on(&cfg, "node-a", pod).await.success);
    }
    assert_eq!(provider.allocate_calls(), 6);
    // the provider unbinds .1's idle sub-interface (metadata write-back)
    let pools = Api::<hereabouts_ipam::crd::IpPool>::namespaced(fx.admin.clone(), &fx.ns);
    let unbind = json!({"spec": {"subInterfaces": {"1": {"node": "node-a", "vlan": -1}}}});
    pools.patch("198.18.41.0-29", &PatchParams::default(), &Patch::Merge(&unbind)).await.unwrap();

    let stolen = fx.add_on(&cfg, "node-b", "g").await;
    assert_eq!(stolen.ips(), vec![ip("198.18.41.2")], "node-a's lowest idle sub-interface that is not unbinding");
    assert_eq!(provider.allocate_calls(), 7, "moved by the provider");
    let pool = fx.pool("198.18.41.0-29").await;
    assert_eq!(pool.spec.sub_interfaces["2"].node, "node-b", "now cached on node-b");
    for pod in ["h", "i", "j", "k"] {
        assert!(fx.add_on(&cfg, "node-a", pod).await.success, "node-a's own cache");
    }
    let last = fx.add_on(&cfg, "node-a", "l").await;
    assert_eq!(last.error_code(), 100, "only the unbinding .1 is left, and it is never handed out: {}", last.stdout);
    assert!(!fx.pool("198.18.41.0-29").await.spec.allocations.contains_key("1"));
}

/// A provider that fails, refuses or does not answer in time fails the ADD with its code, and what the ADD
/// claimed (entry, reservation) is rolled back; the next ADD starts clean and succeeds.
#[tokio::test]
async fn a_failed_or_timed_out_provider_call_leaves_nothing_claimed() {
    let fx = CniFixture::new("iaas-fail").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let cfg = config(&fx, &provider, "198.18.42.0/24", json!({"http_request_timeout": "2s"}));
    for (fault, code, says) in [
        (Fault::Status(500), 11, "HTTP 500"),
        (Fault::Status(400), 105, "HTTP 400"),
        (Fault::Hang, 11, "provider-interaction timeout: POST"),
    ] {
        provider.inject(fault);
        let out = fx.add_on(&cfg, "node-a", "a").await;
        assert_eq!(out.error_code(), code, "{}", out.stdout);
        assert!(out.stdout.contains(says), "{says}: {}", out.stdout);
        let pool = fx.pool("198.18.42.0-24").await;
        assert!(pool.spec.allocations.is_empty(), "rolled back: {:?}", pool.spec.allocations);
        assert!(pool.spec.sub_interfaces.is_empty());
        assert!(fx.reservations().await.is_empty(), "the reservation too");
    }
    let ok = fx.add_on(&cfg, "node-a", "a").await;
    assert_eq!(ok.ips(), vec![ip("198.18.42.1")], "{}", ok.stdout);
}

/// An untrusted provider certificate fails the ADD clearly (code 105) and leaves nothing; an invalid
/// `http_request_timeout` is refused before anything is written, naming the key.
#[tokio::test]
async fn an_untrusted_provider_and_a_bad_timeout_are_refused_clearly() {
    let fx = CniFixture::new("iaas-bad").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let stranger = ReferenceProvider::start(ProviderOptions::default()).await;
    let cfg = config(&fx, &provider, "198.18.43.0/24", json!({"ca_file": stranger.ca_file()}));
    let out = fx.add_on(&cfg, "node-a", "a").await;
    assert_eq!(out.error_code(), 105, "{}", out.stdout);
    assert!(out.stdout.contains("invalid peer certificate"), "{}", out.stdout);
    assert!(fx.pool("198.18.43.0-24").await.spec.allocations.is_empty());
    assert!(provider.calls().is_empty());

    for bad in ["2m", "0s", "fast", "-1s", "100s"] {
        let cfg = config(&fx, &provider, "198.18.44.0/24", json!({"http_request_timeout": bad}));
        let out = fx.add_on(&cfg, "node-a", "a").await;
        assert_eq!(out.error_code(), 7, "{bad}: {}", out.stdout);
        assert!(out.stdout.contains("ipam.iaas_provider.http_request_timeout"), "{bad}: {}", out.stdout);
        assert!(fx.pools().await.iter().all(|p| p.spec.range != "198.18.44.0/24"), "{bad}: nothing written");
    }
}

/// Sixteen ADDs at once over two nodes into one provider-backed pool get sixteen distinct addresses, one provider
/// call each, each sub-interface recorded on its own node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_get_distinct_addresses_and_one_call_each() {
    let fx = CniFixture::new("iaas-burst").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let cfg = config(&fx, &provider, "198.18.45.0/24", json!({}));
    let runs = (0..16).map(|i| {
        let (fx, cfg) = (&fx, &cfg);
        async move { (i, fx.add_on(cfg, ["node-a", "node-b"][i % 2], &format!("p{i}")).await) }
    });
    let outs = futures::future::join_all(runs).await;
    let mut seen = std::collections::BTreeSet::new();
    for (i, out) in &outs {
        assert!(out.success, "p{i}: {}", out.stdout);
        assert!(seen.insert(out.ips()[0]), "p{i} got a taken address {:?}", out.ips());
    }
    assert_eq!(provider.allocate_calls(), 16);
    let pool = fx.pool("198.18.45.0-24").await;
    assert_eq!(pool.spec.allocations.len(), 16);
    for (offset, entry) in &pool.spec.allocations {
        assert_eq!(Some(&pool.spec.sub_interfaces[offset].node), entry.node.as_ref(), "recorded on its node");
    }
}

/// An ADD killed while the provider works (the runtime's timeout) leaves its claim; the runtime's next ADD of
/// the same pod gets that address back, placed on its node, and nothing is held twice.
#[tokio::test]
async fn an_add_killed_during_the_provider_call_is_completed_by_the_next_one() {
    let fx = CniFixture::new("iaas-kill").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let cfg = config(&fx, &provider, "198.18.46.0/24", json!({}));
    provider.inject(Fault::Slow(Duration::from_secs(5)));
    let running = fx.invocation("ADD", &cfg, "a", "c-first").with_env("NODENAME", "node-a").start().await;
    // the ADD is in the provider's hands (5 s there) when the runtime gives up on it
    wait::until(Duration::from_secs(20), "the ADD's allocate call to reach the provider", || async {
        (provider.arrived(ALLOCATE_PATH) == 1).then_some(())
    })
    .await
    .unwrap();
    running.kill().await;
    let retry = fx.invocation("ADD", &cfg, "a", "c-second").with_env("NODENAME", "node-a").run().await;
    assert_eq!(retry.ips(), vec![ip("198.18.46.1")], "{}", retry.stdout);
    let pool = fx.pool("198.18.46.0-24").await;
    assert_eq!(pool.spec.allocations.len(), 1, "one address for the pod: {:?}", pool.spec.allocations);
    assert_eq!(pool.spec.allocations["1"].id, "c-second");
    assert_eq!(fx.reservations().await.len(), 1);
    assert_eq!(pool.spec.sub_interfaces["1"].node, "node-a");
}

/// The leader reconciler has the provider release the sub-interfaces cached on a Node that is gone — one it
/// recorded at ADD (with the parent NIC's MAC) and one the provider wrote back (no `parentNicMac`: sent empty) —
/// holding each address in the pool while the provider is asked, so the provider's release comes before the
/// pool's. A release that fails keeps the hold and is retried; a live Node's cache is left alone.
#[tokio::test]
async fn the_leader_releases_the_sub_interfaces_of_gone_nodes_through_the_provider() {
    use hereabouts_ipam::provider::{HOLD_ID, HOLD_PODREF};
    use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
    use k8s_openapi::api::core::v1::Node;
    use kube::api::DeleteParams;

    let fx = CniFixture::new("iaas-gone").await;
    let _rbac = hereabouts_tests::deploy::apply_rbac_in(&fx.admin, &fx.ns).await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let cfg = config(&fx, &provider, "198.18.47.0/24", json!({}));
    let (live, gone) = (format!("{}-live", fx.ns), format!("{}-gone", fx.ns));
    let nodes = Api::<Node>::all(fx.admin.clone());
    hereabouts_tests::objects::mk_node(&live).create(&fx.admin).await;

    assert_eq!(fx.add_on(&cfg, &gone, "a").await.ips(), vec![ip("198.18.47.1")]);
    assert_eq!(fx.add_on(&cfg, &live, "b").await.ips(), vec![ip("198.18.47.2")]);
    assert!(fx.del_on(&cfg, &gone, "a").await.success);
    assert!(fx.del_on(&cfg, &live, "b").await.success);
    let pools = Api::<hereabouts_ipam::crd::IpPool>::namespaced(fx.admin.clone(), &fx.ns);
    let written_back =
        json!({"spec": {"subInterfaces": {"10": {"node": gone, "mac": "02:00:00:00:0a:0a", "vlan": 7}}}});
    pools.patch("198.18.47.0-24", &PatchParams::default(), &Patch::Merge(&written_back)).await.unwrap();

    // the first release fails, the second takes 3 s: long enough to see the pool hold both addresses meanwhile
    provider.inject(Fault::Status(500));
    provider.inject(Fault::Slow(Duration::from_secs(3)));
    let config_file = provider.dir().join("iaas_provider.json");
    let section = json!({"url": provider.url(), "ca_file": provider.ca_file(), "parent_interface": "lo", "http_request_timeout": "10s"});
    std::fs::write(&config_file, section.to_string()).unwrap();
    let opts = ReconcilerOptions {
        extra_args: vec!["--iaas-provider-config".into(), config_file.display().to_string()],
        ..ReconcilerOptions::new(&live, &fx.ns)
    };
    let reconciler = Reconciler::start(fx.cluster, &opts).await;

    let held_both = hereabouts_tests::wait::until(Duration::from_secs(20), "both holds", || async {
        let pool = fx.pool("198.18.47.0-24").await;
        let holds: Vec<&String> = pool
            .spec
            .allocations
            .iter()
            .filter(|(_, e)| e.id == HOLD_ID && e.podref == HOLD_PODREF)
            .map(|(k, _)| k)
            .collect();
        (holds == ["1", "10"]).then_some(())
    })
    .await;
    assert!(held_both.is_ok(), "both addresses held while the provider is asked: {}", reconciler.logs());
    let during = provider.calls().iter().filter(|c| c.path == RELEASE && c.status == 200).count();
    assert_eq!(during, 0, "no release had been accepted yet while the pool held them");

    let done = hereabouts_tests::wait::until(Duration::from_secs(30), "the release", || async {
        let pool = fx.pool("198.18.47.0-24").await;
        (pool.spec.allocations.is_empty() && pool.spec.sub_interfaces.len() == 1).then_some(pool)
    })
    .await;
    let pool = done.unwrap_or_else(|e| panic!("{e}: {}", reconciler.logs()));
    assert_eq!(pool.spec.sub_interfaces["2"].node, live, "the live node's cache stays");

    let releases: Vec<_> = provider.calls().into_iter().filter(|c| c.path == RELEASE).collect();
    let ok: Vec<&Value> = releases.iter().filter(|c| c.status == 200).map(|c| &c.body).collect();
    assert_eq!(releases.iter().filter(|c| c.status == 500).count(), 1, "{releases:?}");
    assert_eq!(ok.len(), 2, "once per sub-interface: {releases:?}");
    let of = |ip: &str| *ok.iter().find(|b| b["ipAddress"] == ip).unwrap_or_else(|| panic!("{ip}: {ok:?}"));
    assert_eq!(of("198.18.47.1")["parentNicMac"], "00:00:00:00:00:00", "recorded at ADD");
    assert_eq!(of("198.18.47.10")["parentNicMac"], "", "written back without one: sent empty");
    for body in &ok {
        assert_eq!(body["nodeName"], gone.as_str());
        assert_eq!(body["subnet"], "198.18.47.0/24");
        assert_eq!(body["poolName"], "198.18.47.0-24");
    }
    assert!(releases.iter().all(|c| c.budget_ms.is_some_and(|ms| ms <= 10_000)), "{releases:?}");
    assert!(!provider.sub_enis().contains_key("198.18.47.1"), "the provider released it");
    assert!(provider.sub_enis().contains_key("198.18.47.2"), "the live node's stays");
    assert!(reconciler.logs().contains("provider released the sub-interface of a gone node"));

    // the released address is fresh again: an ADD on a new node places it with a provider call
    let calls = provider.allocate_calls();
    assert_eq!(fx.add_on(&cfg, &format!("{}-new", fx.ns), "c").await.ips(), vec![ip("198.18.47.1")]);
    assert_eq!(provider.allocate_calls(), calls + 1);
    nodes.delete(&live, &DeleteParams::default()).await.unwrap();
}
