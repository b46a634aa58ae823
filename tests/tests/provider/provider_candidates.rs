//! IaaS provider mode with several candidate ranges: node-warm pools, modes fixed for a pool's life, candidate
//! classes, and the provider taking idle sub-interfaces away above its watermark. The compiled plugin, run as a
//! runtime runs it, against the test API server and the reference provider over HTTPS.

use std::net::IpAddr;

use hereabouts_ipam::crd::IpPool;
use hereabouts_ipam::range::IpRange;
use hereabouts_ipam::store::{AsRead, KubeStore, Patched, PoolStore};
use hereabouts_tests::Identity;
use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::objects::mk_entry;
use hereabouts_tests::plugin::netconf;
use hereabouts_tests::provider::{Fault, ProviderOptions, ReferenceProvider};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const IGNORED_REASON: &str = hereabouts_ipam::provider::IGNORED_CANDIDATES_REASON;

fn config(fx: &CniFixture, provider: &ReferenceProvider, ranges: Value) -> Value {
    let section = json!({"url": provider.url(), "ca_file": provider.ca_file(), "parent_interface": "lo"});
    fx.netconf("1.0.0", "iaas", json!({"ipRanges": ranges, "iaas_provider": section}))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pools(fx: &CniFixture) -> Api<IpPool> {
    Api::namespaced(fx.admin.clone(), &fx.ns)
}

/// A node-warm pool hands out the sub-interfaces the provider pre-created on its node with no provider call, and
/// only there; once they are all in use the global pool behind it takes over (with a call), and a node the warm
/// pool is not bound to goes straight to the global pool.
#[tokio::test]
async fn a_node_warm_pool_hands_out_its_warm_addresses_with_no_call_then_the_global_pool_takes_over() {
    let fx = CniFixture::new("iaas-warm").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let cfg = config(
        &fx,
        &provider,
        json!([{"range": "198.18.80.0/28", "node_name": "node-a"}, {"range": "198.18.81.0/24"}]),
    );
    let warm = IpRange::parse("198.18.80.0/28", None, None, &[]).unwrap();
    let warmed = provider.prewarm(&pools(&fx), "198.18.80.0-28", &warm, "node-a", 2).await.unwrap();
    assert_eq!(warmed, vec![1, 2]);

    for (pod, want) in [("a", "198.18.80.1"), ("b", "198.18.80.2")] {
        let out = fx.add_on(&cfg, "node-a", pod).await;
        assert_eq!(out.ips(), vec![ip(want)], "a warm address: {}", out.stdout);
    }
    assert_eq!(provider.allocate_calls(), 0, "warm addresses need no provider call");
    // CHECK finds the address in one of the candidates, and not for a container that has none
    let check = fx.invocation("CHECK", &cfg, "a", "c-a").with_env("NODENAME", "node-a").run().await;
    assert!(check.success, "CHECK: {}", check.stdout);
    let check = fx.invocation("CHECK", &cfg, "a", "c-other").with_env("NODENAME", "node-a").run().await;
    assert_eq!(check.error_code(), 102, "{}", check.stdout);
    let fallback = fx.add_on(&cfg, "node-a", "c").await;
    assert_eq!(fallback.ips(), vec![ip("198.18.81.1")], "no warm address left: the global pool: {}", fallback.stdout);
    assert_eq!(provider.allocate_calls(), 1);
    let elsewhere = fx.add_on(&cfg, "node-b", "d").await;
    assert_eq!(elsewhere.ips(), vec![ip("198.18.81.2")], "node-a's warm pool is not node-b's: {}", elsewhere.stdout);
    assert_eq!(provider.allocate_calls(), 2);

    assert!(fx.del_on(&cfg, "node-a", "a").await.success);
    let again = fx.add_on(&cfg, "node-a", "e").await;
    assert_eq!(again.ips(), vec![ip("198.18.80.1")], "warm again after its pod's DEL");
    assert_eq!(provider.allocate_calls(), 2);

    // an address asked for comes from its own candidate, though a warm one is free
    assert!(fx.del_on(&cfg, "node-a", "b").await.success);
    let mut asked = fx.invocation("ADD", &cfg, "f", "c-f").with_env("NODENAME", "node-a");
    asked.args.push_str(";IP=198.18.81.9");
    let asked = asked.run().await;
    assert_eq!(asked.ips(), vec![ip("198.18.81.9")], "{}", asked.stdout);

    let warm_pool = fx.pool("198.18.80.0-28").await;
    assert_eq!(warm_pool.spec.node_name.as_deref(), Some("node-a"));
    assert_eq!(warm_pool.spec.allocations.len(), 1, "e's; b's was given back and the asked ADD took none");
    assert_eq!(fx.pool("198.18.81.0-24").await.spec.node_name, None, "the global pool has no node");
}

/// A pool's placement mode is fixed for its life: a config that would use a node-warm pool as a global one, or a
/// global pool as node-warm (or bound to another node), is refused with code 7 and writes nothing.
#[tokio::test]
async fn a_pool_is_never_switched_between_placement_modes() {
    let fx = CniFixture::new("iaas-mode").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let warm = IpRange::parse("198.18.82.0/28", None, None, &[]).unwrap();
    provider.prewarm(&pools(&fx), "198.18.82.0-28", &warm, "node-a", 2).await.unwrap();
    let global = config(&fx, &provider, json!([{"range": "198.18.83.0/24"}]));
    assert!(fx.add_on(&global, "node-a", "a").await.success);
    let before = (fx.pool("198.18.82.0-28").await, fx.pool("198.18.83.0-24").await, fx.reservations().await.len());

    for (ranges, node, says) in [
        (
            json!([{"range": "198.18.82.0/28"}]),
            "node-a",
            "the pool is node-warm on node-a but the config makes it a global pool",
        ),
        (
            json!([{"range": "198.18.82.0/28", "node_name": "node-b"}]),
            "node-b",
            "the pool is node-warm on node-a but the config makes it node-warm on node-b",
        ),
        (
            json!([{"range": "198.18.83.0/24", "node_name": "node-a"}]),
            "node-a",
            "the pool is a global pool (no node) but the config makes it node-warm on node-a",
        ),
    ] {
        let cfg = config(&fx, &provider, ranges.clone());
        let out = fx.add_on(&cfg, node, "b").await;
        assert_eq!(out.error_code(), 7, "{ranges}: {}", out.stdout);
        assert!(out.stdout.contains(says), "{ranges}: {}", out.stdout);
    }
    let after = (fx.pool("198.18.82.0-28").await, fx.pool("198.18.83.0-24").await, fx.reservations().await.len());
    assert_eq!(after.0.spec, before.0.spec, "the warm pool is untouched");
    assert_eq!(after.1.spec, before.1.spec, "the global pool is untouched");
    assert_eq!(after.2, before.2, "no reservation made");
    // a node-warm pool of another node is no candidate here at all
    let elsewhere = config(&fx, &provider, json!([{"range": "198.18.82.0/28", "node_name": "node-a"}]));
    let out = fx.add_on(&elsewhere, "node-b", "c").await;
    assert_eq!(out.error_code(), 100, "{}", out.stdout);
    assert!(out.stdout.contains("no candidate range applies to this node"), "{}", out.stdout);
    assert_eq!(provider.allocate_calls(), 1, "only the first ADD called the provider");
}

/// Candidates of mixed classes: the ordinary range is left out (a warning and a Warning Event on the pod), the
/// provider range gives the addresses, and when it has none left — or the provider fails — the ADD fails rather
/// than fall back to the ordinary range, whose pool is never even created.
#[tokio::test]
async fn mixed_candidate_classes_keep_the_provider_ranges_with_a_warning_event_and_never_fall_back() {
    let fx = CniFixture::new("iaas-class").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let cfg = config(
        &fx,
        &provider,
        json!([{"range": "198.18.84.0/24", "iaas_provider": false}, {"range": "198.18.85.0/30"}]),
    );

    let first = fx.add_on(&cfg, "node-a", "p1").await;
    assert_eq!(first.ips(), vec![ip("198.18.85.1")], "{}", first.stdout);
    let events = Api::<Event>::namespaced(fx.admin.clone(), &fx.ns);
    let on_p1 = events.list(&ListParams::default().fields("involvedObject.name=p1")).await.unwrap().items;
    assert_eq!(on_p1.len(), 1, "one Warning Event on the pod: {on_p1:?}");
    let event = &on_p1[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reason.as_deref(), Some(IGNORED_REASON));
    assert_eq!(event.involved_object.kind.as_deref(), Some("Pod"));
    let message = event.message.clone().unwrap_or_default();
    assert!(
        message.contains("198.18.84.0/24 (Ordinary)") && message.contains("198.18.85.0/30 (Provider)"),
        "{message}"
    );

    assert_eq!(fx.add_on(&cfg, "node-a", "p2").await.ips(), vec![ip("198.18.85.2")]);
    let full = fx.add_on(&cfg, "node-a", "p3").await;
    assert_eq!(full.error_code(), 100, "the provider range is full and there is no fallback: {}", full.stdout);
    assert!(full.stdout.contains("no IPv4 address for node node-a"), "{}", full.stdout);

    assert!(fx.del_on(&cfg, "node-a", "p2").await.success);
    provider.inject(Fault::Status(500));
    let failed = fx.add_on(&cfg, "node-b", "p4").await;
    assert_eq!(failed.error_code(), 11, "the provider's failure, not an ordinary address: {}", failed.stdout);
    let pool = fx.pool("198.18.85.0-30").await;
    assert_eq!(pool.spec.allocations.keys().collect::<Vec<_>>(), ["1"], "p2 released, p4 rolled back");
    assert!(
        fx.pools().await.iter().all(|p| p.spec.range != "198.18.84.0/24"),
        "the ignored ordinary range's pool was never created"
    );
}

/// Above its watermark the provider marks idle sub-interfaces `vlan: -1`; no ADD takes them, and a claim based on
/// a read from before the mark is refused by the store. The provider then unbinds those still idle and gives the
/// VLAN back to one a pod claimed before the mark landed; the unbound addresses are fresh again.
#[tokio::test]
async fn idle_sub_interfaces_above_the_watermark_are_marked_never_allocated_and_unbound() {
    let fx = CniFixture::new("iaas-watermark").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    // a /29: .1 to .6 usable
    let cfg = config(&fx, &provider, json!([{"range": "198.18.86.0/29"}]));
    let pool = "198.18.86.0-29";
    for pod in ["a", "b", "c", "d", "e", "f"] {
        assert!(fx.add_on(&cfg, "node-a", pod).await.success);
    }
    for pod in ["b", "c", "d", "e", "f"] {
        assert!(fx.del_on(&cfg, "node-a", pod).await.success);
    }
    assert_eq!(provider.allocate_calls(), 6);
    let before_mark = fx.pool(pool).await;

    // six sub-interfaces, a watermark of half: three idle ones go, lowest first
    let marked = provider.mark_idle_above_watermark(&pools(&fx), pool, 6, 0.5, usize::MAX).await.unwrap();
    assert_eq!(marked, vec![2, 3, 4]);
    for (pod, want) in [("g", "198.18.86.5"), ("h", "198.18.86.6")] {
        let out = fx.add_on(&cfg, "node-a", pod).await;
        assert_eq!(out.ips(), vec![ip(want)], "node-a's cache, never an unbinding one: {}", out.stdout);
    }
    let left = fx.add_on(&cfg, "node-a", "i").await;
    assert_eq!(left.error_code(), 100, "only unbinding sub-interfaces are free: {}", left.stdout);
    assert_eq!(provider.allocate_calls(), 6, "no call for any of it");

    // an ADD that read the pool before the mark cannot claim .2 after it
    let store = KubeStore::new(fx.admin.clone(), &fx.ns);
    let entry = mk_entry("c-late", &format!("{}/late", fx.ns)).build();
    let seen = &before_mark.spec.sub_interfaces["2"];
    let read = AsRead { sub_interface: Some(seen.clone()), ..AsRead::default() };
    let claim = store.add_allocation(pool, 2, &entry, &read).await.unwrap();
    assert!(matches!(claim, Patched::Refused(_)), "{claim:?}");
    // one that landed just before the mark holds .3
    let landed = json!({"spec": {"allocations": {"3": {"id": "c-early", "podref": format!("{}/early", fx.ns)}}}});
    pools(&fx).patch(pool, &PatchParams::default(), &Patch::Merge(&landed)).await.unwrap();

    let (unbound, kept) = provider.unbind_marked(&pools(&fx), pool).await.unwrap();
    assert_eq!((unbound, kept), (vec![2, 4], vec![3]));
    let after = fx.pool(pool).await;
    assert!(!after.spec.sub_interfaces.contains_key("2") && !after.spec.sub_interfaces.contains_key("4"));
    assert_eq!(after.spec.sub_interfaces["3"].vlan, before_mark.spec.sub_interfaces["3"].vlan, "VLAN given back");
    assert!(!provider.sub_enis().contains_key("198.18.86.2"), "unbound in the cloud");
    assert!(provider.sub_enis().contains_key("198.18.86.3"));

    let fresh = fx.add_on(&cfg, "node-b", "j").await;
    assert_eq!(fresh.ips(), vec![ip("198.18.86.2")], "unbound: fresh again, placed by a call: {}", fresh.stdout);
    assert_eq!(provider.allocate_calls(), 7);
}

/// Tries to break the mode under concurrency and faults: sixteen ADDs at once over two nodes (node-a has a warm
/// pool, both share a global pool whose idle sub-interfaces are cached on both), the answers of some pool patches
/// and reservation creates lost after the server applied them, and the provider meanwhile marking and unbinding
/// idle sub-interfaces above its watermark. No address is handed out twice, nothing is left claimed that no pod
/// holds, and every address a pod holds has a live sub-interface (not unbinding, not unbound) on that pod's node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_with_lost_answers_and_a_reclaiming_provider_never_share_or_lose_a_sub_interface() {
    let fx = CniFixture::new("iaas-storm").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let ranges = json!([{"range": "198.18.87.0/28", "node_name": "node-a"}, {"range": "198.18.88.0/27"}]);
    let direct = config(&fx, &provider, ranges.clone());
    let section = json!({"url": provider.url(), "ca_file": provider.ca_file(), "parent_interface": "lo"});
    let kubeconfig = proxy.kubeconfig(fx.cluster, Identity::Cni, &fx.ns);
    let faulty = netconf("1.0.0", "iaas", &kubeconfig, json!({"ipRanges": ranges, "iaas_provider": section}));
    let (warm_pool, global_pool) = ("198.18.87.0-28", "198.18.88.0-27");
    let warm = IpRange::parse("198.18.87.0/28", None, None, &[]).unwrap();
    provider.prewarm(&pools(&fx), warm_pool, &warm, "node-a", 4).await.unwrap();
    // idle sub-interfaces cached on both nodes: twelve ADDs and their DELs (node-a's first four are warm)
    for i in 0..12 {
        let node = ["node-a", "node-b"][i % 2];
        assert!(fx.add_on(&direct, node, &format!("w{i}")).await.success);
    }
    for i in 0..12 {
        assert!(fx.del_on(&direct, ["node-a", "node-b"][i % 2], &format!("w{i}")).await.success);
    }
    proxy.add_rule(Rule {
        verb: Verb::Patch,
        resource: "ippools".into(),
        nth: 2,
        times: 4,
        action: Action::DropResponse,
    });
    proxy.add_rule(Rule::nth(Verb::Create, "overlappingrangeipreservations", 3, Action::DropResponse));
    proxy.add_rule(Rule::nth(Verb::Create, "overlappingrangeipreservations", 7, Action::DropResponse));

    let done = std::sync::atomic::AtomicBool::new(false);
    let reclaim = async {
        let (mut marked, mut unbound, mut kept) = (0, 0, 0);
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            // one at a time, so that marks keep landing while the ADDs read and claim
            marked += provider.mark_idle_above_watermark(&pools(&fx), global_pool, 30, 0.0, 1).await.unwrap().len();
            tokio::time::sleep(std::time::Duration::from_millis(15)).await;
            let (u, k) = provider.unbind_marked(&pools(&fx), global_pool).await.unwrap();
            (unbound, kept) = (unbound + u.len(), kept + k.len());
        }
        (marked, unbound, kept)
    };
    let adds = async {
        let runs = (0..16).map(|i| {
            let (fx, faulty) = (&fx, &faulty);
            async move {
                // the ADDs' starts spread over 400 ms, so they keep coming while the provider marks
                tokio::time::sleep(std::time::Duration::from_millis(25 * i as u64)).await;
                (i, fx.add_on(faulty, ["node-a", "node-b"][i % 2], &format!("p{i}")).await)
            }
        });
        let outs = futures::future::join_all(runs).await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        outs
    };
    let (outs, (marked, unbound, kept)) = tokio::join!(adds, reclaim);
    let lost = proxy.seen().iter().filter(|s| s.action == Some(Action::DropResponse)).count();
    eprintln!("{lost} answers lost; the provider marked {marked}, unbound {unbound}, gave back {kept}");
    assert!(lost >= 4, "the faults fired: {:?}", proxy.seen());

    let mut held = std::collections::BTreeMap::new();
    for (i, out) in &outs {
        assert!(out.success, "p{i}: {}", out.stdout);
        let ips = out.ips();
        assert_eq!(ips.len(), 1, "p{i}: one IPv4 address");
        assert!(held.insert(ips[0], (format!("p{i}"), ["node-a", "node-b"][i % 2])).is_none(), "{} twice", ips[0]);
    }
    let enis = provider.sub_enis();
    let mut entries = 0;
    for (name, cidr) in [(warm_pool, "198.18.87.0/28"), (global_pool, "198.18.88.0/27")] {
        let range = IpRange::parse(cidr, None, None, &[]).unwrap();
        let pool = fx.pool(name).await;
        for (offset, entry) in &pool.spec.allocations {
            entries += 1;
            let ip = range.addr_at(offset.parse().unwrap());
            let (pod, node) = held.get(&ip).unwrap_or_else(|| panic!("{ip} is claimed by {entry:?}, which no ADD got"));
            assert_eq!(entry.podref, format!("{}/{pod}", fx.ns));
            let record = &pool.spec.sub_interfaces[offset];
            assert_eq!((record.node.as_str(), record.vlan != -1), (*node, true), "{ip}: {record:?}");
            let eni = enis.get(&ip.to_string()).unwrap_or_else(|| panic!("{ip}: unbound in the cloud under {pod}"));
            assert_eq!(eni.node, *node, "{ip}: the cloud has it on {}", eni.node);
            if name == warm_pool {
                assert_eq!(*node, "node-a", "only node-a takes from its warm pool");
            }
        }
    }
    assert_eq!(entries, 16, "one entry per ADD, none left over");
    assert_eq!(fx.reservations().await.len(), 16, "one reservation per address");
}

/// The interleaving the claim's guard is for, made certain: an ADD reads the pool (node-a's idle sub-interface
/// cached at .1) and its claim is held in flight while the provider marks that sub-interface `vlan: -1`, finds no
/// pod on it and unbinds it. When the claim arrives it is refused (the record it read is gone), and the ADD picks
/// again: .1 is now an address with no sub-interface, so the provider creates one. Without the guard the claim
/// lands and the pod gets an address whose sub-interface the cloud has just taken away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_read_before_the_provider_unbound_its_sub_interface_is_refused_and_picks_again() {
    let fx = CniFixture::new("iaas-guard").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let ranges = json!([{"range": "198.18.89.0/29"}]);
    let direct = config(&fx, &provider, ranges.clone());
    let section = json!({"url": provider.url(), "ca_file": provider.ca_file(), "parent_interface": "lo"});
    let kubeconfig = proxy.kubeconfig(fx.cluster, Identity::Cni, &fx.ns);
    let held = netconf("1.0.0", "iaas", &kubeconfig, json!({"ipRanges": ranges, "iaas_provider": section}));
    let pool = "198.18.89.0-29";
    assert!(fx.add_on(&direct, "node-a", "a").await.success);
    assert!(fx.del_on(&direct, "node-a", "a").await.success);
    assert_eq!(provider.allocate_calls(), 1);

    proxy.add_rule(Rule::nth(Verb::Patch, "ippools", 1, Action::Hold));
    let running = fx.invocation("ADD", &held, "b", "c-b").with_env("NODENAME", "node-a").start().await;
    proxy.wait_held(1).await;
    assert_eq!(provider.mark_idle_above_watermark(&pools(&fx), pool, 6, 0.0, usize::MAX).await.unwrap(), vec![1]);
    assert_eq!(provider.unbind_marked(&pools(&fx), pool).await.unwrap(), (vec![1], vec![]));
    assert!(provider.sub_enis().is_empty(), "unbound in the cloud");
    proxy.release_held();
    let out = running.wait().await;

    assert_eq!(out.ips(), vec![ip("198.18.89.1")], "{}", out.stdout);
    let record = fx.pool(pool).await.spec.sub_interfaces.get("1").cloned();
    assert_eq!(record.as_ref().map(|r| r.node.as_str()), Some("node-a"), "a sub-interface recorded for the pod");
    assert!(provider.sub_enis().contains_key("198.18.89.1"), "and the cloud has it again");
    assert_eq!(provider.allocate_calls(), 2, "placed by a provider call after the refused claim");
}

/// An ADD killed while the provider places its global-pool address leaves its claim there; by the runtime's
/// retry a warm address has appeared in the node-warm pool that comes first. The retry gets the address it
/// already holds back, not a second one from the warm pool.
#[tokio::test]
async fn a_retried_add_gets_back_the_candidate_it_already_holds() {
    let fx = CniFixture::new("iaas-retry").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let cfg = config(
        &fx,
        &provider,
        json!([{"range": "198.18.90.0/28", "node_name": "node-a"}, {"range": "198.18.91.0/24"}]),
    );
    provider.inject(Fault::Slow(std::time::Duration::from_secs(20)));
    let running = fx.invocation("ADD", &cfg, "a", "c-first").with_env("NODENAME", "node-a").start().await;
    let global = pools(&fx);
    hereabouts_tests::wait::until(
        std::time::Duration::from_secs(15),
        "the first ADD's claim in the global pool",
        || async { global.get_opt("198.18.91.0-24").await.ok().flatten().filter(|p| p.spec.allocations.len() == 1) },
    )
    .await
    .unwrap();
    running.kill().await;

    let warm = IpRange::parse("198.18.90.0/28", None, None, &[]).unwrap();
    provider.prewarm(&pools(&fx), "198.18.90.0-28", &warm, "node-a", 1).await.unwrap();
    let retry = fx.invocation("ADD", &cfg, "a", "c-second").with_env("NODENAME", "node-a").run().await;
    assert_eq!(retry.ips(), vec![ip("198.18.91.1")], "{}", retry.stdout);
    assert!(fx.pool("198.18.90.0-28").await.spec.allocations.is_empty(), "no second address from the warm pool");
    assert_eq!(fx.pool("198.18.91.0-24").await.spec.allocations["1"].id, "c-second");
    assert_eq!(fx.reservations().await.len(), 1);
}

/// Paired dual-stack sub-interfaces: one provider call places an IPv4 and an IPv6 address together; the IPv6 one
/// stays with its sub-interface for its life (a pod reusing the cached sub-interface gets both back with no
/// call), a new sub-interface never takes an IPv6 address another pairs, and a pair is all or nothing. Mixed with
/// a plain provider range, the paired one is the class kept.
#[tokio::test]
async fn paired_dual_stack_sub_interfaces_keep_their_ipv6_address_and_come_in_pairs_or_not_at_all() {
    let fx = CniFixture::new("iaas-pair").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let cfg = config(
        &fx,
        &provider,
        json!([{"range": "198.18.94.0/24"}, {"range": "198.18.93.0/24", "paired_range": "2001:db8:93::/125"}]),
    );
    let first = fx.add_on(&cfg, "node-a", "a").await;
    assert_eq!(first.ips(), vec![ip("198.18.93.1"), ip("2001:db8:93::1")], "{}", first.stdout);
    let call = &provider.calls()[0].body["subEniRequests"];
    assert_eq!(call.as_array().map(Vec::len), Some(1), "one sub-interface for both: {call}");
    assert_eq!(
        (call[0]["ipv4Address"].as_str(), call[0]["ipv6Address"].as_str()),
        (Some("198.18.93.1"), Some("2001:db8:93::1"))
    );
    assert_eq!(call[0]["ipv6PoolName"], "2001-db8-93---125");
    let events = Api::<Event>::namespaced(fx.admin.clone(), &fx.ns);
    let on_a = events.list(&ListParams::default().fields("involvedObject.name=a")).await.unwrap().items;
    let message = on_a.first().and_then(|e| e.message.clone()).unwrap_or_default();
    assert!(message.contains("198.18.94.0/24 (Provider)"), "the plain provider range is left out: {message}");
    let record = &fx.pool("198.18.93.0-24").await.spec.sub_interfaces["1"];
    assert_eq!(record.paired_address.as_deref(), Some("2001:db8:93::1"));

    assert_eq!(fx.add_on(&cfg, "node-a", "b").await.ips(), vec![ip("198.18.93.2"), ip("2001:db8:93::2")]);
    assert!(fx.del_on(&cfg, "node-a", "a").await.success);
    assert!(fx.pool("2001-db8-93---125").await.spec.allocations.len() == 1, "DEL gave back the IPv6 half too");
    let other = fx.add_on(&cfg, "node-b", "c").await;
    assert_eq!(
        other.ips(),
        vec![ip("198.18.93.3"), ip("2001:db8:93::3")],
        "a fresh pair: ::1 is still node-a's idle sub-interface's: {}",
        other.stdout
    );
    assert_eq!(provider.allocate_calls(), 3);
    let cached = fx.add_on(&cfg, "node-a", "d").await;
    assert_eq!(cached.ips(), vec![ip("198.18.93.1"), ip("2001:db8:93::1")], "sticky IPv6: {}", cached.stdout);
    assert_eq!(provider.allocate_calls(), 3, "from the cache, no call");
    let check = fx.invocation("CHECK", &cfg, "d", "c-d").with_env("NODENAME", "node-a").run().await;
    assert!(check.success, "CHECK of both halves of the pair: {}", check.stdout);

    // the /125 has 6 usable IPv6 addresses: .1-.3 pair ::1-::3; three more pairs, then the IPv6 half runs out
    for pod in ["e", "f", "g"] {
        assert_eq!(fx.add_on(&cfg, "node-b", pod).await.ips().len(), 2);
    }
    let none = fx.add_on(&cfg, "node-b", "h").await;
    assert_eq!(none.error_code(), 100, "no IPv6 half, no pair: {}", none.stdout);
    let v4 = fx.pool("198.18.93.0-24").await;
    assert_eq!(v4.spec.allocations.len(), 6, "the IPv4 half of the failed pair was rolled back");
    assert!(fx.pools().await.iter().all(|p| p.spec.range != "198.18.94.0/24"), "the plain range was never used");
}

/// The seed's merge of the provider's answer: a `macAddress` or `vlanId` the answer leaves empty keeps what the
/// sub-interface's record had (here, one moved from another node); a filled one replaces it.
#[tokio::test]
async fn an_empty_mac_or_vlan_in_the_providers_answer_keeps_what_the_record_had() {
    let fx = CniFixture::new("iaas-merge").await;
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    // a /30: .1 and .2 usable
    let cfg = config(&fx, &provider, json!([{"range": "198.18.95.0/30"}]));
    for pod in ["a", "b"] {
        assert!(fx.add_on(&cfg, "node-a", pod).await.success);
    }
    for pod in ["a", "b"] {
        assert!(fx.del_on(&cfg, "node-a", pod).await.success);
    }
    let before = fx.pool("198.18.95.0-30").await.spec.sub_interfaces["1"].clone();
    provider.inject(Fault::Blank);
    let moved = fx.add_on(&cfg, "node-b", "c").await;
    assert_eq!(moved.ips(), vec![ip("198.18.95.1")], "{}", moved.stdout);
    let after = fx.pool("198.18.95.0-30").await.spec.sub_interfaces["1"].clone();
    assert_eq!((after.node.as_str(), &after.mac, after.vlan), ("node-b", &before.mac, before.vlan));
    let filled = fx.add_on(&cfg, "node-b", "d").await;
    assert_eq!(filled.ips(), vec![ip("198.18.95.2")]);
    let record = fx.pool("198.18.95.0-30").await.spec.sub_interfaces["2"].clone();
    assert_eq!(
        (record.mac.clone(), record.vlan),
        (provider.sub_enis()["198.18.95.2"].mac.clone(), provider.sub_enis()["198.18.95.2"].vlan)
    );
    assert_ne!(record.vlan, before.vlan);
}
