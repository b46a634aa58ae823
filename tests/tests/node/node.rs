//! hereabouts on a real node: the chart installed by helm on a kubelet + containerd + runc node, Multus as the
//! thin plugin, pods that get their secondary addresses through the kubelet and ping each other, DEL through the
//! kubelet, a rolling update, the reconciler's release after it was down, and the switch-over from Whereabouts.
//! One node at a time: [`Node::start`] serialises these tests.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use hereabouts_tests::node::workload::*;
use hereabouts_tests::node::{self, Multus, Node};
use hereabouts_tests::{Identity, TestCluster, plugin, testenv, wait};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

/// The chart installs onto the node: the DaemonSet becomes Ready, install-cni writes the binary, the flat file,
/// the kubeconfig and the node name into the node's CNI directories; pods through Multus get distinct addresses
/// and reach each other on them; deleting them through the API runs DEL through the kubelet, which gives every
/// address and reservation back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_a_real_node_get_addresses_ping_and_give_them_back() {
    get_addresses_ping_and_give_them_back(Multus::Thin).await;
}

/// The same under Multus' thick plugin: the runtime runs `multus-shim`, Multus' daemon runs the delegates (the
/// plugin among them) through its chroot executor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_a_real_node_get_addresses_ping_and_give_them_back_under_thick_multus() {
    get_addresses_ping_and_give_them_back(Multus::Thick).await;
}

/// The steps of docs/install.md (the image imported, the CRDs in place, `helm install` with the image and the
/// node's values, the rollout, the files on the node, a NAD and pods, `kubectl hereabouts ipam show`), then DEL.
async fn get_addresses_ping_and_give_them_back(multus: Multus) {
    let (cluster, node) = fresh_node_with(multus).await;
    // values an operator sets, beyond the node's own: they reach the running pod
    helm_install(
        cluster,
        &node,
        &["podAnnotations.example\\.com/installed-by=node-test", "resources.reconciler.limits.memory=192Mi"],
    );
    daemonset_ready(cluster, &node, node::IMAGE).await;
    let daemon_pods = Api::<Pod>::namespaced(cluster.admin().await, SYSTEM)
        .list(&ListParams::default().labels("app.kubernetes.io/name=hereabouts"))
        .await
        .unwrap();
    let pod = daemon_pods.items.first().expect("the DaemonSet's pod");
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("example.com/installed-by").map(String::as_str), Some("node-test"), "{annotations:?}");
    let controller_pods = Api::<Pod>::namespaced(cluster.admin().await, SYSTEM)
        .list(&ListParams::default().labels(hereabouts_tests::node::workload::CONTROLLER_PODS))
        .await
        .unwrap();
    let pod = controller_pods.items.first().expect("the controller's pod");
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("hereabouts"), "the controller's own account");
    let reconciler = spec.containers.iter().find(|c| c.name == "reconciler").unwrap();
    let limits = reconciler.resources.as_ref().and_then(|r| r.limits.clone()).unwrap_or_default();
    assert_eq!(limits.get("memory").map(|q| q.0.as_str()), Some("192Mi"), "{limits:?}");

    let installed = node.cni_bin_dir().join("hereabouts");
    assert!(
        std::fs::read(&installed).unwrap() == std::fs::read(plugin::workspace_bin("hereabouts")).unwrap(),
        "install-cni copied this build's plugin to {}",
        installed.display()
    );
    let conf = node.cni_conf_dir().join("hereabouts.d");
    assert_eq!(std::fs::read_to_string(conf.join("nodename")).unwrap().trim(), node::NAME);
    let flat: Value = serde_json::from_slice(&std::fs::read(conf.join("hereabouts.conf")).unwrap()).unwrap();
    assert_eq!(flat["kubernetes"]["kubeconfig"], conf.join("hereabouts.kubeconfig").to_string_lossy().as_ref());
    let kubeconfig = std::fs::read_to_string(conf.join("hereabouts.kubeconfig")).unwrap();
    assert!(kubeconfig.contains(cluster.server()), "the plugin's kubeconfig names the API server: {kubeconfig}");

    let ns = cluster.namespace("node").await;
    node::default_service_account(cluster, &ns).await;
    create_nad(
        cluster,
        &ns,
        "sec",
        hereabouts_ipam(&node, "hereabouts", "hereabouts.d/hereabouts.conf", "198.18.0.0/28"),
    )
    .await;
    let names: Vec<String> = (0..3).map(|i| format!("pod-{i}")).collect();
    for name in &names {
        create_pod(cluster, &ns, name, "sec").await;
    }
    let mut pods = Vec::new();
    for name in &names {
        pods.push(running(cluster, &node, &ns, name, "sec").await);
    }
    let addresses: BTreeSet<IpAddr> = pods.iter().map(|(_, ip)| *ip).collect();
    assert_eq!(addresses.len(), 3, "three pods, three addresses: {pods:?}");
    for (_, ip) in &pods {
        assert!("198.18.0.0/28".parse::<ipnet::IpNet>().unwrap().contains(ip), "{ip} in the range");
    }
    let entries = pool_entries(cluster).await;
    assert_eq!(entries.len(), 3, "{entries:?}");
    for name in &names {
        assert!(entries.iter().any(|(_, podref)| *podref == format!("{ns}/{name}")), "{name} in {entries:?}");
    }
    let (first, _) = &pods[0];
    for (_, ip) in &pods[1..] {
        assert!(ping(&node, first, *ip), "pod-0 reaches {ip} over the secondary network");
    }
    // as docs/install.md has the operator look: the kubectl plugin finds the pools where the chart installed it
    let shown = hereabouts_tests::ctl::ctl_as_is(
        &cluster.kubeconfig(Identity::Admin, "default"),
        &["ipam", "show", "-o", "json"],
    )
    .await;
    assert!(shown.success, "{}", shown.stderr);
    let rows: Vec<Value> = serde_json::from_str(&shown.stdout).unwrap();
    let row = rows.iter().find(|r| r["range"] == "198.18.0.0/28").unwrap_or_else(|| panic!("{}", shown.stdout));
    assert_eq!(row["allocated"], 3, "{row}");
    if multus == Multus::Thick {
        let shim = std::fs::read_to_string(node.dir().join("multus-shim.log")).unwrap_or_default();
        let daemon = std::fs::read_to_string(node.dir().join("multus.log")).unwrap_or_default();
        assert_eq!(shim.matches("CmdAdd (shim)").count(), names.len(), "the runtime ran the shim:\n{shim}");
        assert!(daemon.contains("server configured with chroot: /"), "through its chroot executor:\n{daemon}");
        let attached = daemon.lines().filter(|l| l.contains(&format!("{ns}/sec(sec):net1"))).count();
        assert_eq!(attached, names.len(), "Multus' daemon ran the plugin for each pod's net1:\n{daemon}");
    }

    delete_pods(cluster, &node, &ns, &names).await;
    assert_eq!(pool_entries(cluster).await, vec![], "DEL through the kubelet gave every address back");
    assert_eq!(reservations(cluster).await, Vec::<String>::new(), "and every reservation");
    assert_eq!(cni_failures(cluster, &ns).await, vec![], "no ADD or DEL failed");
    // the kubelet ran the plugin through Multus; the plugin handed each invocation to the node's agent
    let agent = node.container_logs(SYSTEM, "hereabouts-", "agent");
    for command in ["ADD", "DEL"] {
        let served = agent.lines().filter(|l| l.contains("served") && l.contains(&format!("command={command}")));
        assert!(served.count() >= names.len(), "the agent served every {command}:\n{agent}");
    }
    // what the chart put on the host outside the node's directory (the agent's socket) goes with the node: a
    // socket left behind sends every later CNI call on the machine to a dead agent first
    let mut node = node;
    assert!(node.dir().exists());
    let left = node.shut_down();
    assert_eq!(left, Vec::<std::path::PathBuf>::new(), "left on the host after the node's teardown");
}

/// A rolling update of the DaemonSet to a new image tag while pods come and go on the node: no ADD and no DEL
/// fails, and afterwards the pools hold exactly the live pods' addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_fails_no_add_and_no_del() {
    a_rolling_update_under(Multus::Thin).await;
}

/// The same under Multus' thick plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_fails_no_add_and_no_del_under_thick_multus() {
    a_rolling_update_under(Multus::Thick).await;
}

async fn a_rolling_update_under(multus: Multus) {
    let (cluster, node) = fresh_node_with(multus).await;
    helm_install(cluster, &node, &[]);
    daemonset_ready(cluster, &node, node::IMAGE).await;
    let next = "hereabouts:0.1.1-node";
    node.import_hereabouts_as(next).unwrap();
    let ns = cluster.namespace("rolling").await;
    node::default_service_account(cluster, &ns).await;
    create_nad(
        cluster,
        &ns,
        "sec",
        hereabouts_ipam(&node, "hereabouts", "hereabouts.d/hereabouts.conf", "198.18.0.0/26"),
    )
    .await;

    // Pods are created one after another and each is deleted four creations later, until the rollout is over.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let churn = {
        let (stop, made, ns) = (stop.clone(), made.clone(), ns.clone());
        tokio::spawn(async move {
            let api = Api::<Pod>::namespaced(cluster.admin().await, &ns);
            let mut created = Vec::new();
            let mut deleted = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) || created.len() < 12 {
                let name = format!("pod-{}", created.len());
                create_pod(cluster, &ns, &name, "sec").await;
                created.push(name);
                if created.len() > 4 {
                    let old = created[created.len() - 5].clone();
                    api.delete(&old, &DeleteParams::default()).await.unwrap();
                    deleted.push(old);
                }
                made.store(created.len(), std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            (created, deleted)
        })
    };
    // Two rollouts, to the new tag and back, each while pods come and go: the first once the churn deletes too.
    wait::until(Duration::from_secs(60), "the churn to create five pods (and delete the first)", || async {
        (made.load(std::sync::atomic::Ordering::SeqCst) >= 5).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", node.logs()));
    let mut rollouts = Vec::new();
    for image in [next, node::IMAGE] {
        let t0 = std::time::Instant::now();
        set_image(cluster, image).await;
        daemonset_ready(cluster, &node, image).await;
        rollouts.push(format!("to {image} in {:.1} s", t0.elapsed().as_secs_f64()));
        // pods go on coming and going on the rolled-out DaemonSet for a while before the next rollout or the end
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (created, deleted) = churn.await.unwrap();

    let live: Vec<&String> = created.iter().filter(|n| !deleted.contains(n)).collect();
    let mut addresses = BTreeSet::new();
    for name in &live {
        addresses.insert(running(cluster, &node, &ns, name, "sec").await.1);
    }
    assert_eq!(addresses.len(), live.len(), "the live pods' addresses are distinct");
    let api = Api::<Pod>::namespaced(cluster.admin().await, &ns);
    wait::until(Duration::from_secs(90), "the deleted pods to be gone", || async {
        for name in &deleted {
            if api.get_opt(name).await.ok()?.is_some() {
                return None;
            }
        }
        Some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", node.logs()));
    let failures = cni_failures(cluster, &ns).await;
    let log = node.containerd().log();
    let runtime_failures = log
        .lines()
        .filter(|l| {
            l.contains("failed to setup network for sandbox") || l.contains("failed to destroy network for sandbox")
        })
        .count();
    eprintln!(
        "rolling updates {} while {} pods were created and {} deleted: {} ADD/DEL failure events, {} in the runtime's log",
        rollouts.join(", "),
        created.len(),
        deleted.len(),
        failures.len(),
        runtime_failures
    );
    assert_eq!(failures, vec![], "no ADD and no DEL failed during the rolling updates");
    assert_eq!(runtime_failures, 0, "the runtime saw no CNI failure");
    let holders: BTreeSet<String> = pool_entries(cluster).await.into_iter().map(|(_, podref)| podref).collect();
    let expected: BTreeSet<String> = live.iter().map(|n| format!("{ns}/{n}")).collect();
    assert_eq!(holders, expected, "the pools hold exactly the live pods");

    let live: Vec<String> = live.into_iter().cloned().collect();
    delete_pods(cluster, &node, &ns, &live).await;
    assert_eq!(pool_entries(cluster).await, vec![]);
}

/// A pod deleted while the controller is down (scaled to nothing), whose DEL could not release (the plugin's
/// kubeconfig was gone, so the lenient DEL succeeded without releasing), is released by the controller when it is
/// back; the live pod's address stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_while_the_reconciler_is_down_is_released_when_it_returns() {
    released_after_the_reconciler_returns(Multus::Thin).await;
}

/// The same under Multus' thick plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_while_the_reconciler_is_down_is_released_when_it_returns_under_thick_multus() {
    released_after_the_reconciler_returns(Multus::Thick).await;
}

async fn released_after_the_reconciler_returns(multus: Multus) {
    let (cluster, node) = fresh_node_with(multus).await;
    helm_install(cluster, &node, &[]);
    daemonset_ready(cluster, &node, node::IMAGE).await;
    let ns = cluster.namespace("down").await;
    node::default_service_account(cluster, &ns).await;
    create_nad(
        cluster,
        &ns,
        "sec",
        hereabouts_ipam(&node, "hereabouts", "hereabouts.d/hereabouts.conf", "198.18.0.0/28"),
    )
    .await;
    for name in ["kept", "gone"] {
        create_pod(cluster, &ns, name, "sec").await;
    }
    let kept = running(cluster, &node, &ns, "kept", "sec").await.1;
    running(cluster, &node, &ns, "gone", "sec").await;

    // The controller goes (no replica any more), and the node's pod with its agent (no node matches the DaemonSet:
    // the agent's client would release without the kubeconfig the DEL below is denied).
    hereabouts_tests::node::workload::scale_controller(cluster, 0).await;
    let daemonsets = Api::<DaemonSet>::namespaced(cluster.admin().await, SYSTEM);
    let away = json!({"spec": {"template": {"spec": {"nodeSelector": {"hereabouts.test/absent": "true"}}}}});
    daemonsets.patch("hereabouts", &PatchParams::default(), &Patch::Merge(&away)).await.unwrap();
    let system_pods = Api::<Pod>::namespaced(cluster.admin().await, SYSTEM);
    for (what, selector) in [
        ("the controller's pod", hereabouts_tests::node::workload::CONTROLLER_PODS),
        ("the node's pod", "app.kubernetes.io/name=hereabouts"),
    ] {
        wait::until(Duration::from_secs(60), &format!("{what} to be gone"), || async {
            system_pods.list(&ListParams::default().labels(selector)).await.ok()?.items.is_empty().then_some(())
        })
        .await
        .unwrap();
    }

    let kubeconfig = node.cni_conf_dir().join("hereabouts.d/hereabouts.kubeconfig");
    let aside = kubeconfig.with_extension("aside");
    std::fs::rename(&kubeconfig, &aside).unwrap();
    delete_pods(cluster, &node, &ns, &["gone".to_string()]).await;
    let holders = || async { pool_entries(cluster).await.into_iter().map(|(_, p)| p).collect::<BTreeSet<String>>() };
    assert!(holders().await.contains(&format!("{ns}/gone")), "DEL without a kubeconfig released nothing");
    std::fs::rename(&aside, &kubeconfig).unwrap();

    let back = json!({"spec": {"template": {"spec": {"nodeSelector": {"hereabouts.test/absent": null}}}}});
    daemonsets.patch("hereabouts", &PatchParams::default(), &Patch::Merge(&back)).await.unwrap();
    hereabouts_tests::node::workload::scale_controller(cluster, 1).await;
    daemonset_ready(cluster, &node, node::IMAGE).await;
    let released = wait::until(Duration::from_secs(90), "the controller to release the gone pod", || async {
        let now = holders().await;
        (!now.contains(&format!("{ns}/gone"))).then_some(now)
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", node.logs()));
    assert_eq!(released, BTreeSet::from([format!("{ns}/kept")]), "the live pod keeps its address");
    let log = node.container_logs(SYSTEM, "hereabouts-controller-", "reconciler");
    let gone = format!("podref={ns}/gone");
    assert!(log.lines().any(|l| l.contains("released") && l.contains(&gone)), "the reconciler released it:\n{log}");
    assert_eq!(reservations(cluster).await.len(), 1, "only the live pod's reservation is left");
    assert!(ping_self(&node, cluster, &ns, "kept", kept).await);
}

async fn ping_self(node: &Node, cluster: &TestCluster, ns: &str, name: &str, ip: IpAddr) -> bool {
    let uid = running(cluster, node, ns, name, "sec").await.0;
    ping(node, &uid, ip)
}

/// The switch-over from Whereabouts on a node: pods get addresses from upstream Whereabouts (its binary, flat
/// file and kubeconfig, as its installer writes them); hereabouts is installed under the `whereabouts` name; new
/// pods of the same `"type": "whereabouts"` NAD get addresses that collide with none of the old pods', and the old
/// pods' DEL, now run by hereabouts, gives their addresses back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_over_from_whereabouts_keeps_old_pods_and_serves_new_ones() {
    switch_over_from_whereabouts(Multus::Thin).await;
}

/// The same under Multus' thick plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_over_from_whereabouts_keeps_old_pods_and_serves_new_ones_under_thick_multus() {
    switch_over_from_whereabouts(Multus::Thick).await;
}

async fn switch_over_from_whereabouts(multus: Multus) {
    let (cluster, node) = fresh_node_with(multus).await;
    let wb_dir = node.cni_conf_dir().join("whereabouts.d");
    std::fs::create_dir_all(&wb_dir).unwrap();
    std::fs::copy(testenv::tool("whereabouts"), node.cni_bin_dir().join("whereabouts")).unwrap();
    let wb_kubeconfig = wb_dir.join("whereabouts.kubeconfig");
    std::fs::copy(cluster.kubeconfig(Identity::Admin, SYSTEM), &wb_kubeconfig).unwrap();
    let flat = json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": wb_kubeconfig}});
    std::fs::write(wb_dir.join("whereabouts.conf"), flat.to_string()).unwrap();

    let ns = cluster.namespace("switch").await;
    node::default_service_account(cluster, &ns).await;
    create_nad(
        cluster,
        &ns,
        "wb",
        hereabouts_ipam(&node, "whereabouts", "whereabouts.d/whereabouts.conf", "198.18.1.0/28"),
    )
    .await;
    let old: Vec<String> = vec!["old-0".into(), "old-1".into()];
    let mut taken = BTreeSet::new();
    for name in &old {
        create_pod(cluster, &ns, name, "wb").await;
        taken.insert(running(cluster, &node, &ns, name, "wb").await.1);
    }
    assert_eq!(taken.len(), 2, "Whereabouts gave the old pods two addresses");
    assert_eq!(pool_entries(cluster).await.len(), 2, "in Whereabouts' pool");

    helm_install(cluster, &node, &["installAsWhereabouts=true"]);
    daemonset_ready(cluster, &node, node::IMAGE).await;
    let served_by = std::fs::read(node.cni_bin_dir().join("whereabouts")).unwrap();
    assert!(served_by == std::fs::read(plugin::workspace_bin("hereabouts")).unwrap(), "whereabouts is hereabouts now");

    for name in ["new-0", "new-1"] {
        create_pod(cluster, &ns, name, "wb").await;
        let ip = running(cluster, &node, &ns, name, "wb").await.1;
        assert!(taken.insert(ip), "{name} got {ip}, which is taken: {taken:?}");
    }
    delete_pods(cluster, &node, &ns, &old).await;
    let holders: BTreeSet<String> = pool_entries(cluster).await.into_iter().map(|(_, p)| p).collect();
    assert_eq!(holders, BTreeSet::from([format!("{ns}/new-0"), format!("{ns}/new-1")]), "old pods' DEL released");
    delete_pods(cluster, &node, &ns, &["new-0".to_string(), "new-1".to_string()]).await;
    assert_eq!(pool_entries(cluster).await, vec![]);
    assert_eq!(cni_failures(cluster, &ns).await, vec![], "no ADD or DEL failed, before or after the switch");
}
