//! Ranges chosen per pod and per node, the compiled plugin against the test API server: the pod's annotation,
//! its namespace's default, node selectors over real Node objects, the errors a choice that cannot be honoured
//! gets (nothing written), the reads only a choosing config makes, and concurrent ADDs of pods choosing
//! different ranges while answers are lost.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::objects::{mk_node, mk_pod};
use hereabouts_tests::plugin::netconf;
use hereabouts_tests::{Identity, rbac};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

const ANNOTATION: &str = hereabouts_ipam::config::RANGES_ANNOTATION;

async fn fixture(prefix: &str) -> CniFixture {
    let fx = CniFixture::new(prefix).await;
    rbac::grant_cni_ranges(&fx.admin).await;
    fx
}

/// Creates pod `name` in the fixture's namespace, with the ranges annotation when `ranges` is given.
async fn pod(fx: &CniFixture, name: &str, ranges: Option<&str>) {
    let pod = mk_pod(&fx.ns, name);
    match ranges {
        Some(r) => pod.annotation(ANNOTATION, r),
        None => pod,
    }
    .create(&fx.admin)
    .await;
}

async fn annotate_namespace(fx: &CniFixture, ranges: &str) {
    let patch = json!({"metadata": {"annotations": {ANNOTATION: ranges}}});
    Api::<Namespace>::all(fx.admin.clone())
        .patch(&fx.ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Creates Node `name` with `labels` (no kubelet behind it: only its labels are read).
async fn node(fx: &CniFixture, name: &str, labels: &[(&str, &str)]) {
    labels.iter().fold(mk_node(name), |node, (k, v)| node.label(k, v)).create(&fx.admin).await;
}

fn within(ip: IpAddr, cidr: &str) -> bool {
    cidr.parse::<IpNet>().unwrap().contains(&ip)
}

/// Every pool entry of the namespace, as `(pool, podref)`.
async fn entries(fx: &CniFixture) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for pool in fx.pools().await {
        for entry in pool.spec.allocations.values() {
            out.insert((pool.metadata.name.clone().unwrap(), entry.podref.clone()));
        }
    }
    out
}

fn blue_red(fx: &CniFixture, blue: &str, red: &str) -> Value {
    fx.netconf(
        "1.0.0",
        "net1",
        json!({"pod_ranges": true, "ipRanges": [{"range": blue, "name": "blue"}, {"range": red, "name": "red"}]}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_annotation_then_the_namespace_default_choose_the_range() {
    let fx = fixture("ranges-pod").await;
    let (blue, red) = ("198.18.120.0/28", "198.18.121.0/28");
    let config = blue_red(&fx, blue, red);
    annotate_namespace(&fx, "red").await;
    pod(&fx, "p-blue", Some("blue")).await;
    pod(&fx, "p-default", None).await;
    pod(&fx, "p-object", Some(r#"{"net1": ["198.18.120.0/28"], "other-net": ["x"]}"#)).await;
    pod(&fx, "p-both", Some(r#"["red", "blue"]"#)).await;

    let ip = |out: &hereabouts_tests::plugin::Output| out.ips();
    let got = ip(&fx.add_on(&config, "node-1", "p-blue").await);
    assert!(got.len() == 1 && within(got[0], blue), "p-blue: {got:?}");
    let got = ip(&fx.add_on(&config, "node-1", "p-default").await);
    assert!(got.len() == 1 && within(got[0], red), "the namespace's default: {got:?}");
    let got = ip(&fx.add_on(&config, "node-1", "p-object").await);
    assert!(got.len() == 1 && within(got[0], blue), "the object form's entry for net1: {got:?}");
    let got = ip(&fx.add_on(&config, "node-1", "p-both").await);
    assert!(got.len() == 2 && within(got[0], blue) && within(got[1], red), "both, in config order: {got:?}");
    // a pod the API server does not know (a static pod without its mirror yet) takes the namespace's default
    let got = ip(&fx.add_on(&config, "node-1", "p-unknown").await);
    assert!(got.len() == 1 && within(got[0], red), "{got:?}");

    // CHECK applies the same choice: p-blue holds nothing in red and passes
    let check = fx.invocation("CHECK", &config, "p-blue", "c-p-blue").with_env("NODENAME", "node-1").run().await;
    assert!(check.success, "CHECK: {} {}", check.stdout, check.stderr);

    // a pod naming a range the network lacks: code 7 naming the annotation and the ranges; nothing written
    pod(&fx, "p-purple", Some("purple")).await;
    let before = (entries(&fx).await, fx.object_count().await);
    let out = fx.add_on(&config, "node-1", "p-purple").await;
    assert_eq!(out.error_code(), 7, "{}", out.stdout);
    let msg = out.json()["msg"].as_str().unwrap().to_string() + out.json()["details"].as_str().unwrap_or("");
    assert!(
        msg.contains(&format!(
            "annotation {ANNOTATION} of pod {}/p-purple: \"purple\" names no range of network net1 \
             (its ranges: blue (198.18.120.0/28), red (198.18.121.0/28))",
            fx.ns
        )),
        "{}",
        out.stdout
    );
    assert_eq!((entries(&fx).await, fx.object_count().await), before, "a refused choice writes nothing");

    // DEL gives back whatever the pod holds, whatever it chose
    for p in ["p-blue", "p-default", "p-object", "p-both", "p-unknown", "p-purple"] {
        assert!(fx.del_on(&config, "node-1", p).await.success, "DEL {p}");
    }
    assert_eq!(entries(&fx).await, BTreeSet::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_selectors_give_each_node_its_ranges() {
    let fx = fixture("ranges-node").await;
    let suffix = &fx.ns[fx.ns.len() - 5..];
    let (a, b, c) = (format!("zone-a-{suffix}"), format!("zone-b-{suffix}"), format!("bare-{suffix}"));
    node(&fx, &a, &[("topology.kubernetes.io/zone", "a"), ("example.com/v6", "")]).await;
    node(&fx, &b, &[("topology.kubernetes.io/zone", "b"), ("example.com/v6", "")]).await;
    node(&fx, &c, &[]).await;
    let config = fx.netconf(
        "1.0.0",
        "zoned",
        json!({"ipRanges": [
            {"range": "198.18.122.0/28", "node_selector": "topology.kubernetes.io/zone=a"},
            {"range": "198.18.123.0/28", "node_selector": "topology.kubernetes.io/zone in (b, c)"},
            {"range": "2001:db8:7b::/120", "node_selector": "example.com/v6"},
        ]}),
    );
    let on_a = fx.add_on(&config, &a, "pa").await.ips();
    assert!(on_a.len() == 2 && within(on_a[0], "198.18.122.0/28") && within(on_a[1], "2001:db8:7b::/120"), "{on_a:?}");
    let on_b = fx.add_on(&config, &b, "pb").await.ips();
    assert!(on_b.len() == 2 && within(on_b[0], "198.18.123.0/28") && within(on_b[1], "2001:db8:7b::/120"), "{on_b:?}");

    let before = (entries(&fx).await, fx.object_count().await);
    let out = fx.add_on(&config, &c, "pc").await;
    assert_eq!(out.error_code(), 7, "{}", out.stdout);
    assert!(
        out.stdout
            .contains(&format!("no range of network zoned serves node {c}: it matches the node_selector of none")),
        "{}",
        out.stdout
    );
    let out = fx.add_on(&config, "no-such-node", "px").await;
    assert_eq!(out.error_code(), 7, "{}", out.stdout);
    assert!(out.stdout.contains("node no-such-node is not a Node the API server knows"), "{}", out.stdout);
    assert_eq!((entries(&fx).await, fx.object_count().await), before, "refusals write nothing");

    // a label changed later moves the node's next pods (the pods it has keep their addresses)
    let relabel = json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "c"}}});
    Api::<Node>::all(fx.admin.clone()).patch(&c, &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    let on_c = fx.add_on(&config, &c, "pc").await.ips();
    assert!(on_c.len() == 1 && within(on_c[0], "198.18.123.0/28"), "{on_c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_choosing_config_reads_pods_namespaces_and_nodes() {
    let fx = fixture("ranges-reads").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let kubeconfig = proxy.kubeconfig(fx.cluster, Identity::Cni, &fx.ns);
    pod(&fx, "plain", Some("blue")).await;
    pod(&fx, "chooser", Some("blue")).await;
    pod(&fx, "defaulted", None).await;
    let core = |proxy: &FaultProxy| -> Vec<String> {
        proxy
            .seen()
            .iter()
            .filter(|s| ["pods", "namespaces", "nodes"].contains(&s.request.resource.as_str()))
            .map(|s| format!("{} {}", s.request.verb, s.request.resource))
            .collect()
    };
    let plain =
        netconf("1.0.0", "plain", &kubeconfig, json!({"ipRanges": [{"range": "198.18.124.0/28", "name": "blue"}]}));
    assert!(fx.add_on(&plain, "node-1", "plain").await.success);
    assert_eq!(core(&proxy), Vec::<String>::new(), "a config that chooses nothing reads no pod, namespace or node");

    let chooser = netconf(
        "1.0.0",
        "chooser",
        &kubeconfig,
        json!({"pod_ranges": true, "ipRanges": [
            {"range": "198.18.125.0/28", "name": "blue"},
            {"range": "198.18.126.0/28", "name": "red", "node_selector": "kubernetes.io/hostname"},
        ]}),
    );
    let got = fx.add_on(&chooser, "node-1", "chooser").await.ips();
    assert!(got.len() == 1 && within(got[0], "198.18.125.0/28"), "{got:?}");
    assert_eq!(core(&proxy), ["get pods", "get nodes"], "the pod decides: its namespace is not read");
    let before = core(&proxy).len();
    annotate_namespace(&fx, "blue").await;
    assert!(fx.add_on(&chooser, "node-1", "defaulted").await.success);
    assert_eq!(core(&proxy)[before..], ["get pods", "get namespaces", "get nodes"]);

    // without the right (the chart's cni.rangeChoice=false): a 403 that names the ClusterRole; nothing written
    proxy.add_rule(Rule::every(Verb::Get, "pods", Action::Status(403, "pods is forbidden: test".into())));
    let before = (entries(&fx).await, fx.object_count().await);
    pod(&fx, "refused", None).await;
    let out = fx.add_on(&chooser, "node-1", "refused").await;
    assert_eq!(out.error_code(), 103, "{}", out.stdout);
    assert!(
        out.stdout.contains("bind the CNI's ServiceAccount to the ClusterRole hereabouts-cni-ranges"),
        "{}",
        out.stdout
    );
    assert_eq!((entries(&fx).await, fx.object_count().await), before);
}

/// Sixteen ADDs at once, half the pods choosing blue by annotation and half taking the namespace's red, through a
/// proxy that loses the answers of some pool patches and reservation creates after the server applied them, and
/// refuses or resets some of the choice's reads. Every pod ends with one address of the range it chose; none is
/// held twice; nothing is left over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_choosing_different_ranges_under_lost_answers() {
    let fx = fixture("ranges-storm").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let kubeconfig = proxy.kubeconfig(fx.cluster, Identity::Cni, &fx.ns);
    let (blue, red) = ("198.18.127.0/28", "198.18.128.0/28");
    let config = netconf(
        "1.0.0",
        "storm",
        &kubeconfig,
        json!({"pod_ranges": true, "ipRanges": [{"range": blue, "name": "blue"}, {"range": red, "name": "red"}]}),
    );
    annotate_namespace(&fx, "red").await;
    for i in 0..16 {
        pod(&fx, &format!("s{i}"), (i % 2 == 0).then_some("blue")).await;
    }
    proxy.add_rule(Rule {
        verb: Verb::Patch,
        resource: "ippools".into(),
        nth: 2,
        times: 4,
        action: Action::DropResponse,
    });
    proxy.add_rule(Rule::nth(Verb::Create, "overlappingrangeipreservations", 3, Action::DropResponse));
    proxy.add_rule(Rule::nth(Verb::Create, "overlappingrangeipreservations", 9, Action::DropResponse));
    proxy.add_rule(Rule::nth(Verb::Get, "pods", 2, Action::Status(503, "test: unavailable".into())));
    proxy.add_rule(Rule::nth(Verb::Get, "namespaces", 3, Action::ResetBeforeForward));
    let runs = (0..16).map(|i| {
        let (fx, config) = (&fx, &config);
        async move {
            // the ADDs' starts spread over 300 ms: they overlap rather than start in one instant
            tokio::time::sleep(std::time::Duration::from_millis(20 * i as u64)).await;
            (i, fx.add_on(config, ["node-1", "node-2"][i % 2], &format!("s{i}")).await)
        }
    });
    let outs = futures::future::join_all(runs).await;
    let faults: Vec<String> = proxy
        .seen()
        .iter()
        .filter(|s| s.action.is_some())
        .map(|s| format!("{} {}", s.request.verb, s.request.resource))
        .collect();
    eprintln!("faults fired: {faults:?}");
    assert!(faults.len() >= 7, "the faults fired: {faults:?}");

    let mut held = BTreeMap::new();
    for (i, out) in &outs {
        let ips = out.ips();
        assert_eq!(ips.len(), 1, "s{i}: one address");
        let want = if i % 2 == 0 { blue } else { red };
        assert!(within(ips[0], want), "s{i} chose {want}, got {}", ips[0]);
        assert!(held.insert(ips[0], *i).is_none(), "{} handed out twice", ips[0]);
    }
    let all = entries(&fx).await;
    assert_eq!(all.len(), 16, "one entry per pod, none left over: {all:?}");
    let pods: BTreeSet<String> = all.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(pods.len(), 16);
    assert_eq!(fx.reservations().await.len(), 16, "one reservation per address");
}

/// `preferred_ip_annotation` (the maintained Whereabouts fork's `preferred-ip`): a pod's preferred address is taken
/// when free; one another pod holds gets the lowest free instead, and the ADD succeeds; a config without the key
/// leaves the annotation alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_preferred_address_is_taken_when_free() {
    let fx = fixture("preferred").await;
    let range = json!({"range": "198.18.122.0/28", "preferred_ip_annotation": true});
    let config = netconf("1.0.0", "net1", &fx.kubeconfig, range);
    let plain = netconf("1.0.0", "net1", &fx.kubeconfig, json!({"range": "198.18.122.0/28"}));
    for (name, preferred) in [("p-first", "198.18.122.9"), ("p-second", "198.18.122.9"), ("p-plain", "198.18.122.12")] {
        mk_pod(&fx.ns, name)
            .annotation(hereabouts_ipam::claim::PREFERRED_IP_ANNOTATION, preferred)
            .create(&fx.admin)
            .await;
    }
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(fx.add_on(&config, "node-1", "p-first").await.ips(), [ip("198.18.122.9")], "free: taken");
    assert_eq!(fx.add_on(&config, "node-1", "p-second").await.ips(), [ip("198.18.122.1")], "held: the lowest free");
    assert_eq!(fx.add_on(&plain, "node-1", "p-plain").await.ips(), [ip("198.18.122.2")], "no key: not read");
}
