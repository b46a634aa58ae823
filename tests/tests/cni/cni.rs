//! The CNI plugin on the real control plane, run as a compiled binary the way a runtime runs it.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;

use futures::future::join_all;
use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::objects::{mk_entry, mk_pool, mk_reservation};
use kube::api::{Api, PostParams};
use serde_json::json;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_adds_over_four_nodes_get_distinct_addresses() {
    let fx = CniFixture::new("cni-burst").await;
    let config = fx.netconf("1.0.0", "burst", json!({"range": "198.18.10.0/24"}));
    let adds = (0..64).map(|i| {
        let inv = fx
            .invocation("ADD", &config, &format!("pod-{i}"), &format!("c{i}"))
            .with_env("NODENAME", &format!("node-{}", i % 4));
        async move { inv.run().await }
    });
    let outputs = join_all(adds).await;
    let ips: Vec<IpAddr> = outputs.iter().flat_map(|o| o.ips()).collect();
    let distinct: BTreeSet<IpAddr> = ips.iter().copied().collect();
    assert_eq!(ips.len(), 64);
    assert_eq!(distinct.len(), 64, "an address was handed out twice: {ips:?}");

    let pool = fx.pool("198.18.10.0-24").await;
    assert_eq!(pool.spec.allocations.len(), 64);
    let pool_ips: BTreeSet<IpAddr> =
        pool.spec.allocations.keys().map(|k| ip(&format!("198.18.10.{}", k.parse::<u8>().unwrap()))).collect();
    assert_eq!(pool_ips, distinct, "the pool holds exactly the addresses handed out");
    let nodes: HashSet<_> = pool.spec.allocations.values().filter_map(|a| a.node.clone()).collect();
    assert_eq!(nodes.len(), 4);

    let reservations = fx.reservations().await;
    assert_eq!(reservations.len(), 64, "one reservation per address");
    let reserved: BTreeSet<IpAddr> = reservations.iter().map(|r| ip(r.metadata.name.as_deref().unwrap())).collect();
    assert_eq!(reserved, distinct);
    for r in &reservations {
        let ip = r.metadata.name.as_deref().unwrap();
        let offset: u8 = ip.rsplit('.').next().unwrap().parse().unwrap();
        assert_eq!(pool.spec.allocations[&offset.to_string()].podref, r.spec.podref, "reservation {ip}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_ranges_never_share_an_address() {
    let fx = CniFixture::new("cni-overlap").await;
    let wide = fx.netconf("1.0.0", "wide", json!({"range": "198.18.11.0/24"}));
    // A /28 inside the /24: both pools would hand out .1 to .14 without the reservations.
    let narrow = fx.netconf("1.0.0", "narrow", json!({"range": "198.18.11.0/28"}));
    let adds = (0..40).map(|i| {
        let config = if i % 2 == 0 { &wide } else { &narrow };
        let inv = fx.invocation("ADD", config, &format!("pod-{i}"), &format!("c{i}"));
        async move { (i, inv.run().await) }
    });
    let outputs = join_all(adds).await;
    let mut ips = Vec::new();
    let mut narrow_exhausted = false;
    for (i, out) in &outputs {
        if i % 2 == 1 && !out.success {
            // the /28's 14 usable addresses are shared with the /24: the rest must fail as exhausted
            assert_eq!(out.error_code(), 100, "pod-{i}: {}", out.stdout);
            narrow_exhausted = true;
            continue;
        }
        ips.extend(out.ips());
    }
    let distinct: BTreeSet<IpAddr> = ips.iter().copied().collect();
    assert_eq!(distinct.len(), ips.len(), "an address was handed out twice across overlapping ranges: {ips:?}");
    if narrow_exhausted {
        // reservations are never given back here, so "exhausted" is only true if all 14 are held
        let shared: BTreeSet<IpAddr> = (1..=14).map(|o| ip(&format!("198.18.11.{o}"))).collect();
        assert!(shared.is_subset(&distinct), "the /28 reported exhausted while free: {distinct:?}");
    }
    let pools = fx.pools().await;
    let total: usize = pools.iter().map(|p| p.spec.allocations.len()).sum();
    assert_eq!(total, ips.len(), "pools hold exactly what was handed out");
    assert_eq!(fx.reservations().await.len(), ips.len());
}

#[tokio::test]
async fn add_is_idempotent_and_del_releases() {
    let fx = CniFixture::new("cni-idem").await;
    let config = fx.netconf("0.4.0", "idem", json!({"range": "198.18.12.0/24", "gateway": "198.18.12.1"}));
    let first = fx.add(&config, "web", "c1").await;
    let result = first.result();
    assert_eq!(result["cniVersion"], "0.4.0");
    assert_eq!(result["ips"][0]["version"], "4", "0.4.0 results carry the IP version");
    assert_eq!(result["ips"][0]["gateway"], "198.18.12.1");
    let ip1 = first.ips()[0];
    assert_ne!(ip1, ip("198.18.12.1"), "the gateway is never handed out");

    // The same pod and interface again (a runtime retry with a new sandbox) gets the same address.
    let again = fx.add(&config, "web", "c2").await;
    assert_eq!(again.ips(), vec![ip1]);
    let pool = fx.pool("198.18.12.0-24").await;
    assert_eq!(pool.spec.allocations.len(), 1);
    assert_eq!(pool.spec.allocations.values().next().unwrap().id, "c2", "the container id is updated");

    // DEL of an unknown container succeeds and changes nothing.
    let unknown = fx.del(&config, "web", "nope").await;
    assert!(unknown.success, "{}", unknown.stdout);
    assert_eq!(unknown.stdout.trim(), "", "DEL prints nothing on success");
    assert_eq!(fx.pool("198.18.12.0-24").await.spec.allocations.len(), 1);

    let del = fx.del(&config, "web", "c2").await;
    assert!(del.success, "{}", del.stdout);
    assert!(fx.pool("198.18.12.0-24").await.spec.allocations.is_empty());
    assert!(fx.reservations().await.is_empty(), "DEL frees the reservation");
    let twice = fx.del(&config, "web", "c2").await;
    assert!(twice.success, "a second DEL succeeds");
}

#[tokio::test]
async fn api_server_unreachable_is_try_again_later_and_changes_nothing() {
    let fx = CniFixture::new("cni-down").await;
    let config = fx.netconf("1.0.0", "down", json!({"range": "198.18.13.0/24"}));
    let held = fx.add(&config, "web", "c1").await.ips();

    // The same identity, pointed at a port nothing listens on.
    let text = std::fs::read_to_string(&fx.kubeconfig).unwrap();
    let dead = text.replace(fx.cluster.server(), "https://127.0.0.1:9");
    let dead_path = fx.cluster.dir().join(format!("kubeconfig-dead-{}", fx.ns));
    std::fs::write(&dead_path, dead).unwrap();
    let mut down = config.clone();
    down["ipam"]["kubernetes"]["kubeconfig"] = json!(dead_path);
    down["ipam"]["timeout_seconds"] = json!(2);

    for command in ["DEL", "ADD"] {
        let out = fx.invocation(command, &down, "web", "c1").run().await;
        assert_eq!(out.error_code(), 11, "{command} with the API server unreachable: {}", out.stdout);
    }
    let status = fx.invocation("STATUS", &down, "web", "c1").run().await;
    assert_eq!(status.error_code(), 50, "STATUS with the API server unreachable: {}", status.stdout);
    let ok = fx.invocation("STATUS", &config, "web", "c1").run().await;
    assert!(ok.success, "STATUS with the API server up: {}", ok.stdout);

    let pool = fx.pool("198.18.13.0-24").await;
    assert_eq!(pool.spec.allocations.len(), 1, "nothing was released");
    assert_eq!(fx.add(&config, "web", "c1").await.ips(), held);
}

#[tokio::test]
async fn exhausted_range_fails_with_its_code_and_writes_nothing() {
    let fx = CniFixture::new("cni-full").await;
    // a /29 has 6 usable addresses; the gateway takes one
    let config = fx.netconf("1.0.0", "full", json!({"range": "198.18.14.0/29", "gateway": "198.18.14.1"}));
    for i in 0..5 {
        fx.add(&config, &format!("pod-{i}"), &format!("c{i}")).await.result();
    }
    let before = fx.object_count().await;
    let pool_before = fx.pool("198.18.14.0-29").await;
    let out = fx.add(&config, "one-too-many", "c9").await;
    assert_eq!(out.error_code(), 100, "{}", out.stdout);
    assert_eq!(out.json()["msg"], "range exhausted");
    assert!(out.json()["details"].as_str().unwrap().contains("198.18.14.0/29"), "{}", out.stdout);
    assert_eq!(fx.object_count().await, before);
    assert_eq!(fx.pool("198.18.14.0-29").await.metadata.resource_version, pool_before.metadata.resource_version);
}

#[tokio::test]
async fn dual_stack_failure_in_the_second_range_rolls_back_the_first() {
    let fx = CniFixture::new("cni-dual").await;
    let v6_only = fx.netconf("1.0.0", "dual", json!({"range": "2001:db8:15::/126"}));
    // a /126 has two usable addresses: fill them
    let filled: Vec<IpAddr> =
        [fx.add(&v6_only, "filler-0", "f0").await.ips(), fx.add(&v6_only, "filler-1", "f1").await.ips()].concat();
    assert_eq!(filled, vec![ip("2001:db8:15::1"), ip("2001:db8:15::2")]);

    let dual =
        fx.netconf("1.0.0", "dual", json!({"range": "198.18.15.0/24", "ipRanges": [{"range": "2001:db8:15::/126"}]}));
    let out = fx.add(&dual, "web", "c1").await;
    assert_eq!(out.error_code(), 100, "{}", out.stdout);
    let v4 = fx.pool("198.18.15.0-24").await;
    assert!(v4.spec.allocations.is_empty(), "the IPv4 address taken first was released: {:?}", v4.spec.allocations);
    let names: BTreeSet<String> = fx.reservations().await.into_iter().filter_map(|r| r.metadata.name).collect();
    assert_eq!(names, BTreeSet::from(["2001-db8-15--1".to_string(), "2001-db8-15--2".to_string()]));

    // With room in both, one ADD gets one address of each family.
    let roomy =
        fx.netconf("1.0.0", "dual2", json!({"range": "198.18.16.0/24", "ipRanges": [{"range": "2001:db8:16::/64"}]}));
    let ips = fx.add(&roomy, "web2", "c2").await.ips();
    assert_eq!(ips, vec![ip("198.18.16.1"), ip("2001:db8:16::1")]);
}

#[tokio::test]
async fn exact_addresses_from_runtime_config_and_cni_args() {
    let fx = CniFixture::new("cni-exact").await;
    let mut config = fx.netconf("1.0.0", "exact", json!({"range": "198.18.17.0/24"}));
    config["runtimeConfig"] = json!({"ips": ["198.18.17.50/24"]});
    assert_eq!(fx.add(&config, "a", "ca").await.ips(), vec![ip("198.18.17.50")]);

    let plain = fx.netconf("1.0.0", "exact", json!({"range": "198.18.17.0/24"}));
    let mut inv = fx.invocation("ADD", &plain, "b", "cb");
    inv.args.push_str(";IP=198.18.17.60");
    assert_eq!(inv.run().await.ips(), vec![ip("198.18.17.60")]);

    // Held by another pod: an error, never a second owner.
    let taken = fx.add(&config, "c", "cc").await;
    assert_eq!(taken.error_code(), 101, "{}", taken.stdout);
    assert!(taken.json()["details"].as_str().unwrap().contains(&format!("{}/a", fx.ns)), "{}", taken.stdout);
    let pool = fx.pool("198.18.17.0-24").await;
    assert_eq!(pool.spec.allocations.len(), 2);
    assert_eq!(pool.spec.allocations["50"].podref, format!("{}/a", fx.ns));

    // A free exact address is recorded like any other, and lowest-free allocation skips it.
    assert_eq!(fx.add(&plain, "d", "cd").await.ips(), vec![ip("198.18.17.1")]);
}

#[tokio::test]
async fn gc_releases_exactly_the_attachments_not_listed() {
    let fx = CniFixture::new("cni-gc").await;
    let config = fx.netconf("1.1.0", "gcnet", json!({"range": "198.18.18.0/24"}));
    for i in 0..3 {
        fx.invocation("ADD", &config, &format!("pod-{i}"), &format!("c{i}"))
            .with_env("NODENAME", "node-a")
            .run()
            .await
            .result();
    }
    // another node's attachment, which node-a's runtime knows nothing of
    fx.invocation("ADD", &config, "remote", "cr").with_env("NODENAME", "node-b").run().await.result();
    // These were allocated ten minutes ago; an ADD still under way when the runtime took its list (c3, just now)
    // is in no list, so GC must leave young entries alone.
    age_entries(&fx, "198.18.18.0-24", 600).await;
    fx.invocation("ADD", &config, "pod-3", "c3").with_env("NODENAME", "node-a").run().await.result();

    let mut gc = config.clone();
    gc["cni.dev/valid-attachments"] =
        json!([{"containerID": "c0", "ifname": "net1"}, {"containerID": "c2", "ifname": "net1"}]);
    let out = fx.invocation("GC", &gc, "", "").with_env("NODENAME", "node-a").run().await;
    assert!(out.success, "{}", out.stdout);

    let pool = fx.pool("198.18.18.0-24").await;
    let ids: BTreeSet<&str> = pool.spec.allocations.values().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, BTreeSet::from(["c0", "c2", "c3", "cr"]), "only c1, old and unlisted, is released");
    assert_eq!(fx.reservations().await.len(), 4);

    let mut no_list = config.clone();
    no_list["cni.dev/valid-attachments"] = serde_json::Value::Null;
    no_list.as_object_mut().unwrap().remove("cni.dev/valid-attachments");
    let refused = fx.invocation("GC", &no_list, "", "").with_env("NODENAME", "node-a").run().await;
    assert_eq!(refused.error_code(), 7, "GC without the list must not release everything");
    assert_eq!(fx.pool("198.18.18.0-24").await.spec.allocations.len(), 4);
}

/// Moves the `allocated` time of every entry of `pool` `secs` into the past, as if the ADDs had run then.
async fn age_entries(fx: &CniFixture, pool: &str, secs: i64) {
    let at = (k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(secs)).to_string();
    let current = fx.pool(pool).await;
    let allocations: serde_json::Map<String, serde_json::Value> =
        current.spec.allocations.keys().map(|k| (k.clone(), json!({"allocated": at}))).collect();
    let patch = kube::api::Patch::Merge(json!({"spec": {"allocations": allocations}}));
    Api::<IpPool>::namespaced(fx.admin.clone(), &fx.ns)
        .patch(pool, &kube::api::PatchParams::default(), &patch)
        .await
        .unwrap();
}

#[tokio::test]
async fn check_reports_a_missing_allocation() {
    let fx = CniFixture::new("cni-check").await;
    let config = fx.netconf("1.0.0", "chk", json!({"range": "198.18.19.0/24"}));
    fx.add(&config, "web", "c1").await.result();
    let ok = fx.invocation("CHECK", &config, "web", "c1").run().await;
    assert!(ok.success, "{}", ok.stdout);
    let missing = fx.invocation("CHECK", &config, "web", "other").run().await;
    assert_eq!(missing.error_code(), 102, "{}", missing.stdout);
}

#[tokio::test]
async fn every_cni_version_gets_its_result_layout_and_version_lists_them() {
    let fx = CniFixture::new("cni-versions").await;
    for (i, version) in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"].into_iter().enumerate() {
        let config = fx.netconf(version, "ver", json!({"range": "198.18.20.0/24"}));
        let result = fx.add(&config, &format!("pod-{i}"), &format!("c{i}")).await.result();
        assert_eq!(result["cniVersion"], version);
        let has_version_field = result["ips"][0].get("version").is_some();
        assert_eq!(has_version_field, version.starts_with("0."), "{version}: {result}");
    }
    let out = fx.invocation("VERSION", &json!({"cniVersion": "1.1.0"}), "", "").run().await;
    let versions = out.result()["supportedVersions"].clone();
    assert_eq!(versions, json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]));
}

#[tokio::test]
async fn whereabouts_written_objects_are_read_extended_and_released() {
    let fx = CniFixture::new("cni-compat").await;
    // What Whereabouts writes: offsets as keys, {id, podref, ifname}, and one reservation per address.
    let pool = [1u32, 2, 4].into_iter().fold(mk_pool("198.18.21.0-24", "198.18.21.0/24"), |pool, offset| {
        pool.entry(offset, mk_entry(&format!("wb{offset}"), &format!("{}/wb-{offset}", fx.ns)).ifname("net1"))
    });
    Api::<IpPool>::namespaced(fx.admin.clone(), &fx.ns).create(&PostParams::default(), &pool.build()).await.unwrap();
    for offset in [1u32, 2, 4] {
        let r = mk_reservation(&format!("198.18.21.{offset}"), &format!("{}/wb-{offset}", fx.ns))
            .container(&format!("wb{offset}"))
            .ifname("net1")
            .build();
        Api::<OverlappingRangeIpReservation>::namespaced(fx.admin.clone(), &fx.ns)
            .create(&PostParams::default(), &r)
            .await
            .unwrap();
    }

    let config = fx.netconf("1.0.0", "compat", json!({"range": "198.18.21.0/24"}));
    assert_eq!(fx.add(&config, "new", "c-new").await.ips(), vec![ip("198.18.21.3")], "the first gap");
    // a DEL by container id releases what Whereabouts allocated
    assert!(fx.invocation("DEL", &config, "wb-2", "wb2").run().await.success);
    let pool = fx.pool("198.18.21.0-24").await;
    let keys: BTreeSet<&str> = pool.spec.allocations.keys().map(String::as_str).collect();
    assert_eq!(keys, BTreeSet::from(["1", "3", "4"]));
    let names: BTreeSet<String> = fx.reservations().await.into_iter().filter_map(|r| r.metadata.name).collect();
    assert!(!names.contains("198.18.21.2") && names.contains("198.18.21.3"), "{names:?}");
}

/// One malformed invocation and what it must get.
struct BadCase {
    what: &'static str,
    stdin: serde_json::Value,
    /// `CNI_ARGS`; `None` keeps the pod's.
    args: Option<String>,
    /// Replaces `CNI_COMMAND` / `CNI_CONTAINERID`.
    command: Option<&'static str>,
    container_id: Option<&'static str>,
    code: u64,
    /// A word the error's details must contain (the key or value at fault).
    names: &'static str,
}

fn bad(what: &'static str, stdin: serde_json::Value, code: u64, names: &'static str) -> BadCase {
    BadCase { what, stdin, args: None, command: None, container_id: None, code, names }
}

#[tokio::test]
async fn malformed_input_gets_its_code_and_writes_nothing() {
    let fx = CniFixture::new("cni-bad").await;
    let good = fx.netconf("1.0.0", "bad", json!({"range": "198.18.22.0/24"}));
    let with = |key: &str, value: serde_json::Value| {
        let mut c = good.clone();
        c["ipam"][key] = value;
        c
    };
    let mut without_kubeconfig = good.clone();
    without_kubeconfig["ipam"].as_object_mut().unwrap().remove("kubernetes");
    let ns = &fx.ns;
    let pod_args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME=p");
    let cases = vec![
        bad("unsupported cniVersion", json!({"cniVersion": "9.9.9", "name": "x", "ipam": good["ipam"]}), 1, "9.9.9"),
        bad("no ipam section", json!({"cniVersion": "1.0.0", "name": "x"}), 7, "ipam"),
        bad("camelCase rangeStart", with("rangeStart", json!("198.18.22.5")), 2, "rangeStart"),
        bad("prefix over 32", with("range", json!("198.18.22.0/33")), 7, "range"),
        bad("a /32 range", with("range", json!("198.18.22.7/32")), 7, "range"),
        bad("range_start outside the range", with("range_start", json!("198.18.99.5")), 7, "range_start"),
        bad("gateway not an IP", with("gateway", json!("banana")), 7, "gateway"),
        bad("exclude not a CIDR", with("exclude", json!(["198.18.22.0/99"])), 7, "exclude"),
        bad("exclude of the wrong type", with("exclude", json!("198.18.22.0/28")), 6, "exclude"),
        bad("no kubeconfig anywhere", without_kubeconfig, 7, "kubeconfig"),
        bad(
            "kubeconfig that does not exist",
            with("kubernetes", json!({"kubeconfig": "/nonexistent/kc"})),
            7,
            "/nonexistent/kc",
        ),
        bad("timeout_seconds 0", with("timeout_seconds", json!(0)), 7, "timeout_seconds"),
        BadCase {
            args: Some(format!("{pod_args};BROKEN")),
            ..bad("CNI_ARGS pair without =", good.clone(), 4, "BROKEN")
        },
        BadCase {
            args: Some(format!("K8S_POD_NAMESPACE={ns};K8S_POD_NAME=p;COLOUR=blue")),
            ..bad("unknown CNI_ARGS key without IgnoreUnknown", good.clone(), 4, "COLOUR")
        },
        BadCase {
            args: Some(format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns}")),
            ..bad("ADD without the pod name", good.clone(), 4, "K8S_POD_NAME")
        },
        BadCase {
            args: Some(format!("{pod_args};IP=203.0.113.9")),
            ..bad("requested IP outside every range", good.clone(), 7, "203.0.113.9")
        },
        BadCase {
            args: Some(format!("{pod_args};IP=198.18.22.9,198.18.22.10")),
            ..bad("two requested IPs in one range", good.clone(), 7, "198.18.22.10 and 198.18.22.9")
        },
        bad("timeout_seconds over the cap", with("timeout_seconds", json!(181)), 7, "timeout_seconds"),
        BadCase { command: Some("ATTACH"), ..bad("unknown CNI_COMMAND", good.clone(), 4, "ATTACH") },
        BadCase { container_id: Some(""), ..bad("no CNI_CONTAINERID", good.clone(), 4, "CNI_CONTAINERID") },
    ];
    let out = fx.invocation("ADD", &good, "p", "c-bad").run_raw(b"{not json").await;
    assert_eq!(out.error_code(), 6, "stdin is not JSON: {}", out.stdout);

    for case in cases {
        let mut inv = fx.invocation("ADD", &case.stdin, "p", "c-bad");
        if let Some(args) = case.args {
            inv.args = args;
        }
        if let Some(command) = case.command {
            inv.command = command;
        }
        if let Some(id) = case.container_id {
            inv.container_id = id.to_string();
        }
        let out = inv.run().await;
        let what = case.what;
        assert_eq!(out.error_code(), case.code, "{what}: {}", out.stdout);
        let err = out.json();
        assert!(err["msg"].as_str().is_some_and(|m| !m.is_empty()), "{what}: no msg in {}", out.stdout);
        let details = err["details"].as_str().unwrap_or_default();
        assert!(details.contains(case.names), "{what}: the details should name {:?}: {details}", case.names);
        assert!(!out.stderr.contains("panicked"), "{what}: {}", out.stderr);
        assert_eq!(fx.object_count().await, (0, 0), "{what}: no object may be created");
    }
}

/// Defect 3: after an address was found held through an overlapping range, the default strategy turned into a
/// whole-range random pick. Sequential ADDs alternating between two overlapping ranges get the next lowest.
#[tokio::test]
async fn sequential_adds_on_overlapping_ranges_get_the_next_lowest() {
    let fx = CniFixture::new("cni-lowest").await;
    let wide = fx.netconf("1.0.0", "wide", json!({"range": "198.18.23.0/24"}));
    let narrow = fx.netconf("1.0.0", "narrow", json!({"range": "198.18.23.0/28"}));
    let mut got = Vec::new();
    for i in 0..8 {
        let config = if i % 2 == 0 { &wide } else { &narrow };
        got.push(fx.add(config, &format!("pod-{i}"), &format!("c{i}")).await.ips()[0]);
    }
    let expected: Vec<IpAddr> = (1..=8).map(|o| ip(&format!("198.18.23.{o}"))).collect();
    assert_eq!(got, expected);
}

/// Defect 5: DEL was as strict as ADD, so a config Whereabouts accepted (which Multus replays to DEL as it
/// cached it) failed the DEL and left the pod stuck terminating. Each of these succeeds and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_with_each_config_whereabouts_accepted_succeeds_and_releases() {
    let fx = CniFixture::new("cni-lenient-del").await;
    let good = fx.netconf("1.0.0", "lenient", json!({"range": "198.18.24.0/24"}));
    let variant = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = good.clone();
        f(&mut c);
        c
    };
    let cases: Vec<(&str, serde_json::Value)> = vec![
        ("camelCase keys", variant(&|c| c["ipam"]["rangeStart"] = json!("198.18.24.50"))),
        ("cniVersion 0.1.0", variant(&|c| c["cniVersion"] = json!("0.1.0"))),
        ("cniVersion 0.2.0", variant(&|c| c["cniVersion"] = json!("0.2.0"))),
        ("no cniVersion", variant(&|c| drop(c.as_object_mut().unwrap().remove("cniVersion")))),
        ("runtimeConfig ips outside the range", variant(&|c| c["runtimeConfig"] = json!({"ips": ["203.0.113.7/24"]}))),
        ("range_start outside the range", variant(&|c| c["ipam"]["range_start"] = json!("198.18.99.1"))),
        ("an unparsable exclude", variant(&|c| c["ipam"]["exclude"] = json!(["198.18.24.0/99"]))),
        ("legacy etcd keys", variant(&|c| c["ipam"]["etcd_host"] = json!("127.0.0.1:2379"))),
    ];
    for (i, (what, config)) in cases.iter().enumerate() {
        let (pod, cid) = (format!("pod-{i}"), format!("c{i}"));
        let added = fx.add(&good, &pod, &cid).await.ips();
        let mut del = fx.invocation("DEL", config, &pod, &cid);
        del.args = format!("K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};COLOUR=blue", fx.ns);
        let out = del.run().await;
        assert!(out.success, "{what}: DEL failed: {}\n{}", out.stdout, out.stderr);
        assert!(out.stderr.contains("passed over"), "{what}: the problem is logged: {}", out.stderr);
        let holders = hereabouts_tests::objects::pool_holders(&fx.admin, &fx.ns, "198.18.24.0-24").await;
        assert!(!holders.contains(&format!("{}/{pod}", fx.ns)), "{what}: {added:?} not released");
    }
    assert!(fx.reservations().await.is_empty(), "every reservation released too");

    // With the kubeconfig gone (an uninstalled node), DEL cannot act: it succeeds, and the reconciler will.
    fx.add(&good, "orphan", "c-orphan").await.result();
    let gone = variant(&|c| c["ipam"]["kubernetes"] = json!({"kubeconfig": "/nonexistent/kubeconfig"}));
    let out = fx.del(&gone, "orphan", "c-orphan").await;
    assert!(out.success, "{}", out.stdout);
    assert!(out.stderr.contains("the reconciler will"), "{}", out.stderr);
    // and a DEL of garbage succeeds without touching anything
    let out = fx.invocation("DEL", &good, "orphan", "c-orphan").run_raw(b"{not json").await;
    assert!(out.success, "{}", out.stdout);
    assert_eq!(fx.pool("198.18.24.0-24").await.spec.allocations.len(), 1);
}

/// `RUST_LOG`, when the runtime passes one, overrides `log_level`: the same debug-level config logs its info
/// lines without it and only errors with `RUST_LOG=error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_overrides_the_configs_log_level() {
    let fx = CniFixture::new("cni-rust-log").await;
    let config = fx.netconf("1.0.0", "rust-log", json!({"range": "198.18.95.0/28", "log_level": "debug"}));
    let levels = |stderr: &str| -> BTreeSet<String> {
        stderr.lines().filter_map(|l| l.split_whitespace().nth(1)).map(str::to_string).collect()
    };
    let default = fx.add(&config, "a", "c-a").await;
    assert_eq!(default.ips().len(), 1);
    assert!(levels(&default.stderr).contains("INFO"), "log_level debug: {}", default.stderr);

    let quiet = fx.invocation("ADD", &config, "b", "c-b").with_env("RUST_LOG", "error").run().await;
    assert_eq!(quiet.ips().len(), 1);
    assert_eq!(levels(&quiet.stderr), BTreeSet::new(), "RUST_LOG=error and nothing failed: {}", quiet.stderr);

    let unparsable = fx.invocation("ADD", &config, "c", "c-c").with_env("RUST_LOG", "=[").run().await;
    assert_eq!(unparsable.ips().len(), 1);
    assert!(unparsable.stderr.contains("does not parse"), "{}", unparsable.stderr);
    assert!(levels(&unparsable.stderr).contains("INFO"), "log_level again: {}", unparsable.stderr);
}

/// Run by hand on a terminal with no CNI command (as after the switch-over, `/opt/cni/bin/whereabouts` tried by an
/// operator), the plugin says what it is, which CNI versions it speaks and where its logs go, and exits 1, instead
/// of waiting for a network config on stdin. `script` (util-linux) gives it a terminal.
#[test]
fn run_by_hand_on_a_terminal_the_plugin_says_what_it_is() {
    let plugin = hereabouts_tests::plugin::workspace_bin("hereabouts");
    let out = std::process::Command::new("timeout")
        .args(["20", "script", "--quiet", "--return", "--command"])
        .arg(&plugin)
        .arg("/dev/null")
        .env_remove("CNI_COMMAND")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("timeout (coreutils) and script (util-linux: apt-get install util-linux) give the plugin a terminal");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("a CNI IPAM plugin"), "it says what it is: {said}");
    assert!(said.contains("0.3.0") && said.contains("1.1.0"), "and the CNI versions: {said}");
    assert!(said.contains("log_file"), "and where its log goes: {said}");
    assert_eq!(out.status.code(), Some(1), "it exits 1 (124: it waited for stdin): {said}");
}

/// `--version` and `--help` answer on stdout and exit 0 whatever stdin is (a script, `kubectl exec` without `-t`,
/// a release's smoke test), with or without `CNI_COMMAND`; the CNI VERSION command still answers as the spec says.
#[test]
fn version_and_help_answer_whatever_stdin_is() {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let plugin = hereabouts_tests::plugin::workspace_bin("hereabouts");
    let run = |args: &[&str], command: Option<&str>, stdin: Stdio| {
        let mut cmd = Command::new(&plugin);
        cmd.args(args).env_remove("CNI_COMMAND").stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(command) = command {
            cmd.env("CNI_COMMAND", command);
        }
        let mut child = cmd.spawn().unwrap();
        // a pipe with a config in it, as a script would give; the plugin on main read it and answered code 4
        if let Some(mut pipe) = child.stdin.take() {
            let _ = pipe.write_all(br#"{"cniVersion":"1.0.0"}"#);
        }
        let out = child.wait_with_output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let version = format!("hereabouts {} (CNI spec versions 0.3.0", env!("CARGO_PKG_VERSION"));
    for stdin in [Stdio::null as fn() -> Stdio, Stdio::piped] {
        for command in [None, Some("ADD")] {
            for flag in ["--version", "-V"] {
                let (code, out) = run(&[flag], command, stdin());
                assert_eq!(code, Some(0), "{flag} {command:?}: {out}");
                assert!(out.starts_with(&version) && out.contains("1.1.0"), "{flag} {command:?}: {out}");
            }
            for flag in ["--help", "-h"] {
                let (code, out) = run(&[flag], command, stdin());
                assert_eq!(code, Some(0), "{flag} {command:?}: {out}");
                assert!(out.contains("a CNI IPAM plugin") && out.contains("--version"), "{flag}: {out}");
            }
        }
    }
    // the CNI command VERSION: the spec's JSON, in the config's version
    let mut child = Command::new(&plugin)
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(br#"{"cniVersion":"0.4.0"}"#).unwrap();
    let out = child.wait_with_output().unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["cniVersion"], "0.4.0", "{answer}");
    assert_eq!(answer["supportedVersions"].as_array().unwrap().len(), 5, "{answer}");
}

/// `enable_l3` (the maintained Whereabouts fork's key) through the compiled plugin: a /31's two addresses go to
/// two pods at once (the network address among them, each with its /31), a third ADD is told the range is full and
/// writes nothing, a DEL gives one back; without the key a /31 is refused with code 7 naming `ipam.range`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_enable_l3_a_point_to_point_range_hands_out_both_addresses() {
    let fx = CniFixture::new("cni-l3").await;
    let config = fx.netconf("1.0.0", "p2p", json!({"range": "198.18.107.0/31", "enable_l3": true}));
    let both = join_all(["a", "b"].map(|pod| {
        let inv = fx.invocation("ADD", &config, pod, &format!("c-{pod}"));
        async move { inv.run().await }
    }))
    .await;
    let got: BTreeSet<IpAddr> = both.iter().flat_map(|o| o.ips()).collect();
    assert_eq!(got, BTreeSet::from([ip("198.18.107.0"), ip("198.18.107.1")]), "{:?}", both);
    for out in &both {
        assert_eq!(out.json()["ips"][0]["address"].as_str().unwrap().split('/').nth(1), Some("31"), "{}", out.stdout);
    }
    let before = fx.object_count().await;
    let full = fx.add(&config, "c", "c-c").await;
    assert_eq!(full.error_code(), 100, "{}", full.stdout);
    assert_eq!(fx.object_count().await, before, "nothing written");
    assert!(fx.del(&config, "a", "c-a").await.success);
    assert_eq!(fx.pool("198.18.107.0-31").await.spec.allocations.len(), 1);

    let without = fx.netconf("1.0.0", "p2p", json!({"range": "198.18.107.2/31"}));
    let refused = fx.add(&without, "d", "c-d").await;
    assert_eq!(refused.error_code(), 7, "{}", refused.stdout);
    assert!(refused.stdout.contains("ipam.range"), "{}", refused.stdout);
}

/// `large_offsets`: the upper half of an IPv6 /64 (offsets 2^63 and above, which Whereabouts v0.9 cannot read) is
/// handed out when the network opts in, recorded in the pool as the big decimal offset the maintained fork writes,
/// and released by DEL; without the key the same range is refused with code 7, nothing written.
#[tokio::test]
async fn large_offsets_hand_out_the_upper_half_of_a_64() {
    let fx = CniFixture::new("cni-large").await;
    let range = "2001:db8:63::8000:0:0:0-2001:db8:63::8000:0:0:ff/64";
    let refused = fx.add(&fx.netconf("1.0.0", "large", json!({"range": range})), "web", "c0").await;
    assert_eq!(refused.error_code(), 7, "{}", refused.stdout);
    assert!(fx.pools().await.is_empty(), "nothing written");

    let config = fx.netconf("1.0.0", "large", json!({"range": range, "large_offsets": true}));
    let out = fx.add(&config, "web", "c1").await;
    assert_eq!(out.ips(), [ip("2001:db8:63::8000:0:0:0")], "{}", out.stdout);
    let pool = fx.pool("2001-db8-63---64").await;
    assert_eq!(pool.spec.allocations.keys().collect::<Vec<_>>(), ["9223372036854775808"]);
    assert!(fx.del(&config, "web", "c1").await.success);
    assert!(fx.pool("2001-db8-63---64").await.spec.allocations.is_empty());
    assert!(fx.reservations().await.is_empty());
}
