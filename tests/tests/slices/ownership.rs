//! Slices never move under entries: what takes a slice from a node, or a NodeSlicePool from the cluster, while
//! pods hold addresses of it. Each case is one a tool beside hereabouts makes (Whereabouts' node-slice controller,
//! an operator, the garbage collector), with that tool running where the case needs it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use hereabouts_ipam::crd::{IpPool, NodeSlicePool};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::objects::{mk_node, mk_pod};
use hereabouts_tests::plugin::{Output, whereabouts};
use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
use hereabouts_tests::whereabouts_controller::WhereaboutsController;
use hereabouts_tests::{TestCluster, deploy, runtime, wait};
use ipnet::IpNet;
use kube::api::{Api, DeleteParams};
use serde_json::json;

/// Every (address, podref) the pools hold, from each pool's own range (slices of /31 included).
fn held(pools: &[IpPool]) -> Vec<(IpAddr, String)> {
    let mut all = Vec::new();
    for pool in pools {
        let network = pool.spec.range.parse::<IpNet>().unwrap().network();
        for (offset, entry) in &pool.spec.allocations {
            let offset: u128 = offset.parse().unwrap();
            let ip = match network {
                IpAddr::V4(n) => IpAddr::V4((u32::from(n) + offset as u32).into()),
                IpAddr::V6(n) => IpAddr::V6((u128::from(n) + offset).into()),
            };
            all.push((ip, entry.podref.clone()));
        }
    }
    all
}

async fn assert_no_address_twice(fx: &CniFixture) -> Vec<(IpAddr, String)> {
    let held = held(&fx.pools().await);
    let distinct: BTreeSet<&IpAddr> = held.iter().map(|(ip, _)| ip).collect();
    assert_eq!(distinct.len(), held.len(), "an address is held twice: {held:?}");
    held
}

async fn listing(fx: &CniFixture, name: &str) -> NodeSlicePool {
    Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns).get(name).await.unwrap()
}

/// Slice → owner.
async fn owners(fx: &CniFixture, name: &str) -> BTreeMap<String, String> {
    let status = listing(fx, name).await.status.unwrap();
    status.allocations.into_iter().map(|a| (a.slice_range, a.node_name)).collect()
}

fn add_on(fx: &CniFixture, config: &serde_json::Value, node: &str, pod: &str) -> hereabouts_tests::plugin::Invocation {
    fx.invocation("ADD", config, pod, &format!("c-{pod}")).with_env("NODENAME", node)
}

/// Finding (ii): the NodeSlicePool deleted (by hand; by the garbage collector through an owner reference) while
/// node-b's pod holds an address of its slice. Re-created all free, node-a would claim that slice and hand the
/// address out again; it is rebuilt with node-b's slice in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_node_slice_pool_is_rebuilt_with_the_slices_in_use() {
    let fx = CniFixture::new("own-lost").await;
    let config = fx.netconf(
        "1.1.0",
        "lost",
        json!({"range": "198.18.200.0/30", "node_slice_size": "/31", "enable_overlapping_ranges": false}),
    );
    // the pods exist: the leader's sweep would rightly give back the addresses of pods that do not
    for (pod, node) in [("on-b", "node-b"), ("on-a-0", "node-a"), ("on-a-1", "node-a")] {
        mk_pod(&fx.ns, pod).node(node).create(&fx.admin).await;
    }
    let b = add_on(&fx, &config, "node-b", "on-b").run().await.ips()[0];
    Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns).delete("lost", &DeleteParams::default()).await.unwrap();
    for i in 0..2 {
        let out = add_on(&fx, &config, "node-a", &format!("on-a-{i}")).run().await;
        if out.success {
            assert!(!out.ips().contains(&b), "node-b's pod holds {b}: {}", out.stdout);
        } else {
            assert_eq!(out.error_code(), 100, "the range is full: {}", out.stdout);
        }
    }
    let held = assert_no_address_twice(&fx).await;
    assert!(held.contains(&(b, format!("{}/on-b", fx.ns))), "{held:?}");
    let owner_of_b = || async {
        let owners = owners(&fx, "lost").await;
        owners.into_iter().find(|(s, _)| s.parse::<IpNet>().unwrap().contains(&b)).unwrap().1
    };
    assert_ne!(owner_of_b().await, "node-a", "re-created without node-b's slice in use given away");
    // the leader gives node-b its slice back
    deploy::apply_rbac(fx.admin.clone()).await;
    deploy::create_lease(&fx.admin, &fx.ns).await;
    let reconciler = Reconciler::start(fx.cluster, &ReconcilerOptions::new("node-a", &fx.ns)).await;
    let back = wait::until(Duration::from_secs(30), "node-b's slice back to node-b", || async {
        (owner_of_b().await == "node-b").then_some(())
    })
    .await;
    if let Err(e) = back {
        panic!("{e}\n{}\n{:?}\n{:?}", reconciler.logs(), fx.pools().await, listing(&fx, "lost").await);
    }
}

/// `config` as a NAD Whereabouts' controller reads: its config loader wants a flat file, named here.
fn as_whereabouts_nad(cluster: &TestCluster, fx: &CniFixture, config: &serde_json::Value) -> serde_json::Value {
    let flat = cluster.dir().join(format!("whereabouts-controller-{}.conf", fx.ns));
    let kubeconfig = cluster.kubeconfig(hereabouts_tests::Identity::Admin, &fx.ns);
    std::fs::write(&flat, json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": kubeconfig}}).to_string())
        .unwrap();
    let mut nad = config.clone();
    nad["ipam"]["type"] = json!("whereabouts");
    nad["ipam"]["configuration_path"] = json!(flat);
    nad
}

/// Makes the NAD `nad` an owner of the NodeSlicePool `name`, as Whereabouts' controller does with the
/// NodeSlicePools it creates. v0.9.2 updates only those: for any other, the owner reference it appends lacks its
/// kind and the update is refused, so it re-slices or frees nothing there.
async fn owned_by_nad(fx: &CniFixture, name: &str, nad: &str) {
    let nads = Api::<kube::core::DynamicObject>::namespaced_with(
        fx.admin.clone(),
        &fx.ns,
        &hereabouts_ipam::crd::nad_resource(),
    );
    let uid = nads.get(nad).await.unwrap().metadata.uid.unwrap();
    let owner = json!([{"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "name": nad,
        "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
    let patch = kube::api::Patch::Merge(json!({"metadata": {"ownerReferences": owner}}));
    Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns)
        .patch(name, &kube::api::PatchParams::default(), &patch)
        .await
        .unwrap();
}

/// Waits until Whereabouts' controller has synced the NAD: one of its two outcomes is logged.
async fn synced(controller: &WhereaboutsController) {
    wait::until(Duration::from_secs(45), "Whereabouts' controller to sync the NAD", || async {
        let logs = controller.logs();
        (logs.contains("range configuration did not change") || logs.contains("re-allocating node slices"))
            .then_some(())
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}
{}",
            controller.logs()
        )
    });
}

/// A control plane of the test's own: Whereabouts' controller gives slices to every Node and reads every NAD.
async fn own_fixture(owner: &'static str, prefix: &str) -> (&'static TestCluster, CniFixture) {
    let cluster = TestCluster::own(owner);
    (cluster, CniFixture::on(cluster, prefix).await)
}

/// Finding (i): a NodeSlicePool hereabouts created for `node_slice_size: "28"` says `"28"`, so Whereabouts'
/// controller finds nothing changed and leaves the slices where hereabouts put them; finding (ii)'s cause: the
/// owner references to NADs it adds are dropped by hereabouts' leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whereabouts_controller_finds_nothing_to_reslice_and_hereabouts_drops_its_owner_references() {
    let (cluster, fx) = own_fixture(concat!(module_path!(), "::reslice"), "own-reslice").await;
    for node in ["node-a", "node-b"] {
        mk_node(node).create(&fx.admin).await;
    }
    let config = fx.netconf(
        "1.1.0",
        "attach",
        json!({"range": "198.18.201.0/24", "node_slice_size": "28", "network_name": "wbs"}),
    );
    for (node, pod) in [("node-b", "b0"), ("node-a", "a0"), ("node-a", "a1")] {
        let out = add_on(&fx, &config, node, pod).run().await;
        assert!(out.success, "{}", out.stdout);
    }
    let before = owners(&fx, "wbs").await;

    let nad = as_whereabouts_nad(cluster, &fx, &config);
    let controller = WhereaboutsController::start(cluster, &fx.ns).await.unwrap();
    runtime::create_nad(&fx.admin, &fx.ns, "attach", &nad).await.unwrap();
    owned_by_nad(&fx, "wbs", "attach").await;
    synced(&controller).await;
    assert!(!controller.logs().contains("re-allocating node slices"), "{}", controller.logs());
    assert_eq!(listing(&fx, "wbs").await.spec.slice_size, "28", "as the config spells it");
    let after = owners(&fx, "wbs").await;
    for (slice, node) in before.iter().filter(|(_, n)| !n.is_empty()) {
        assert_eq!(&after[slice], node, "hereabouts' slices stay where they were: {after:?}");
    }
    drop(controller);

    deploy::apply_rbac(fx.admin.clone()).await;
    deploy::create_lease(&fx.admin, &fx.ns).await;
    let reconciler = Reconciler::start(cluster, &ReconcilerOptions::new("node-a", &fx.ns)).await;
    wait::until(Duration::from_secs(15), "the leader to drop the NAD owner references", || async {
        let owners = listing(&fx, "wbs").await.metadata.owner_references.unwrap_or_default();
        owners.iter().all(|o| o.kind != "NetworkAttachmentDefinition").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    assert_eq!(owners(&fx, "wbs").await, after, "no slice moved");
}

/// Finding (iii): Whereabouts' controller frees the slice of a node that is not a Node, whatever its pool holds.
/// hereabouts does not claim a free slice whose pool of another node still holds entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_freed_under_its_entries_is_not_claimed() {
    let (cluster, fx) = own_fixture(concat!(module_path!(), "::freed"), "own-freed").await;
    mk_node("node-a").create(&fx.admin).await;
    let config = fx.netconf(
        "1.1.0",
        "attach",
        json!({"range": "198.18.202.0/30", "node_slice_size": "/31", "network_name": "wbf",
               "enable_overlapping_ranges": false}),
    );
    // a node whose Node object is gone (or named otherwise) holds an address of its slice
    let gone = add_on(&fx, &config, "gone-node", "kept").run().await.ips()[0];
    let nad = as_whereabouts_nad(cluster, &fx, &config);
    let controller = WhereaboutsController::start(cluster, &fx.ns).await.unwrap();
    runtime::create_nad(&fx.admin, &fx.ns, "attach", &nad).await.unwrap();
    owned_by_nad(&fx, "wbf", "attach").await;
    wait::until(Duration::from_secs(45), "Whereabouts' controller to free gone-node's slice", || async {
        let owners = owners(&fx, "wbf").await;
        (!owners.values().any(|n| n == "gone-node") && owners.values().any(|n| n == "node-a")).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", controller.logs()));
    drop(controller);

    let mut given = Vec::new();
    for i in 0..3 {
        let out: Output = add_on(&fx, &config, "node-a", &format!("a{i}")).run().await;
        if out.success {
            given.extend(out.ips());
        } else {
            assert_eq!(out.error_code(), 100, "{}", out.stdout);
        }
    }
    assert!(!given.contains(&gone), "{gone} is the gone node's pod's: {given:?}");
    assert_eq!(given.len(), 1, "node-a's own slice only (its /31 holds one host of the /30): {given:?}");
    let held = assert_no_address_twice(&fx).await;
    assert!(held.contains(&(gone, format!("{}/kept", fx.ns))), "{held:?}");
    let owned = owners(&fx, "wbf").await.values().filter(|n| *n == "node-a").count();
    assert_eq!(owned, 1, "one slice for node-a");
}

/// Findings (iv) and 4, and the mixed fleet: upstream Whereabouts' CNI in fast IPAM on nodes 4–7 beside hereabouts
/// on nodes 0–3, one network in /27 slices, slices given by hereabouts' leader only to the Whereabouts nodes (as
/// they join, one while pods start). Pods come and go (a quarter deleted without DEL); the reconcilers run. After:
/// no entry and no reservation of a gone pod, no reservation under a misread network name, and every Whereabouts
/// ADD that has a free address gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_mixed_with_whereabouts_fast_ipam_leaks_nothing_and_never_starves_it() {
    let (cluster, fx) = own_fixture(concat!(module_path!(), "::mixed"), "own-mixed").await;
    deploy::apply_rbac(fx.admin.clone()).await;
    deploy::create_lease(&fx.admin, &fx.ns).await;
    let nodes: Vec<String> = (0..8).map(|i| format!("node-{i}")).collect();
    for (i, node) in nodes.iter().enumerate().take(7) {
        let builder = mk_node(node);
        let builder = if i >= 4 { builder.label("fleet", "whereabouts") } else { builder };
        builder.create(&fx.admin).await;
    }
    let opts = ReconcilerOptions {
        cron: "*/2 * * * * *".into(),
        extra_args: vec!["--assign-slices-to=fleet=whereabouts".into()],
        // the slice pass without a watch would wait this long
        slice_interval: "30s".into(),
        ..ReconcilerOptions::new("node-0", &fx.ns)
    };
    let reconciler = Reconciler::start(cluster, &opts).await;
    let config = fx.netconf(
        "1.1.0",
        "slnet",
        json!({"range": "198.18.32.0/23", "node_slice_size": "/27", "network_name": "slnet"}),
    );
    // the NodeSlicePool comes with hereabouts' first ADD; the leader then gives nodes 4–6 a slice each
    let first = mk_pod(&fx.ns, "h-first").node("node-0").create(&fx.admin).await;
    assert!(add_on(&fx, &config, "node-0", "h-first").run().await.success);
    let assigned = |node: String| {
        let fx = &fx;
        async move { owners(fx, "slnet").await.values().any(|n| *n == node).then_some(()) }
    };
    for node in &nodes[4..7] {
        wait::until(Duration::from_secs(25), &format!("a slice for {node}"), || assigned(node.clone()))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    }
    // node-7 joins while pods start: its slice comes with the Node (the watch), not at the next 30-s pass
    mk_node("node-7").label("fleet", "whereabouts").create(&fx.admin).await;
    let mut pods = vec![first.metadata.name.clone().unwrap()];
    for i in 0..24 {
        let node = &nodes[i % 8];
        let pod = format!("p{i}");
        mk_pod(&fx.ns, &pod).node(node).create(&fx.admin).await;
        if i % 8 == 7 && i < 8 {
            wait::until(Duration::from_secs(20), "a slice for node-7", || assigned("node-7".into()))
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
        }
        let out = if i % 8 >= 4 {
            whereabouts(cluster, &fx.ns, "ADD", &config, &pod, &format!("c-{pod}"))
                .with_env("NODENAME", node)
                .run()
                .await
        } else {
            add_on(&fx, &config, node, &pod).run().await
        };
        assert!(out.success, "{pod} on {node}: {}\n{}", out.stdout, out.stderr);
        pods.push(pod);
    }
    assert_no_address_twice(&fx).await;
    // a quarter go without DEL, from both plugins' nodes
    let gone: Vec<String> = pods.iter().skip(1).step_by(4).cloned().collect();
    for pod in &gone {
        let params = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(fx.admin.clone(), &fx.ns)
            .delete(pod, &params)
            .await
            .unwrap();
    }
    let gone_refs: BTreeSet<String> = gone.iter().map(|p| format!("{}/{p}", fx.ns)).collect();
    wait::until(Duration::from_secs(60), "the gone pods' entries and reservations released", || async {
        let entries = held(&fx.pools().await);
        let reservations = fx.reservations().await;
        let left = entries.iter().any(|(_, p)| gone_refs.contains(p))
            || reservations.iter().any(|r| gone_refs.contains(&r.spec.podref));
        (!left).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    let reservations = fx.reservations().await;
    let misnamed: Vec<String> = reservations
        .iter()
        .filter_map(|r| r.metadata.name.clone())
        .filter(|n| !n.starts_with("slnet-198.18."))
        .collect();
    assert!(misnamed.is_empty(), "reservations under a misread network: {misnamed:?}");
    let live = held(&fx.pools().await);
    assert_eq!(reservations.len(), live.len(), "one reservation per live entry: {live:?}");
    // every Whereabouts node has free addresses in its slice: each ADD gets one
    for (i, node) in nodes[4..].iter().enumerate() {
        let pod = format!("late-{i}");
        mk_pod(&fx.ns, &pod).node(node).create(&fx.admin).await;
        let out = whereabouts(cluster, &fx.ns, "ADD", &config, &pod, &format!("c-{pod}"))
            .with_env("NODENAME", node)
            .run()
            .await;
        assert!(out.success, "Whereabouts' ADD on {node}: {}\n{}", out.stdout, out.stderr);
    }
    assert_no_address_twice(&fx).await;
}
