//! hereabouts on a real node: the chart installed by helm on a kubelet + containerd + runc node, Multus as the
//! thin plugin, pods that get their secondary addresses through the kubelet and ping each other, DEL through the
//! kubelet, a rolling update, the reconciler's release after it was down, and the switch-over from Whereabouts.
//! One node at a time: [`Node::start`] serialises these tests.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_tests::node::{self, Node};
use hereabouts_tests::{Identity, TestCluster, netns, plugin, testenv, wait};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// The namespace the chart installs into (its default): the pools and reservations live there.
const SYSTEM: &str = "kube-system";

fn chart() -> std::path::PathBuf {
    testenv::repo_root().join("deploy/chart")
}

/// The control plane with no trace of an earlier test of this binary: no release of the chart, no pools,
/// reservations or leader Lease in the system namespace; then a fresh node.
async fn fresh_node() -> (&'static TestCluster, Node) {
    let cluster = TestCluster::get_for_node();
    let lock = node::exclusive();
    let kubeconfig = cluster.kubeconfig(Identity::Admin, SYSTEM);
    let out = std::process::Command::new(testenv::tool("helm"))
        .args(["uninstall", "hereabouts", "--namespace", SYSTEM, "--ignore-not-found"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    assert!(out.status.success(), "helm uninstall: {}", String::from_utf8_lossy(&out.stderr));
    let client = cluster.admin().await;
    let all = DeleteParams::default();
    let lp = ListParams::default();
    Api::<IpPool>::namespaced(client.clone(), SYSTEM).delete_collection(&all, &lp).await.unwrap();
    Api::<OverlappingRangeIpReservation>::namespaced(client.clone(), SYSTEM)
        .delete_collection(&all, &lp)
        .await
        .unwrap();
    let leases = Api::<Lease>::namespaced(client, SYSTEM);
    let _ = leases.delete("hereabouts-reconciler", &all).await;
    let node = Node::start_holding(cluster, lock).await;
    (cluster, node)
}

/// `helm install` of the chart onto the node, with the values a node of the tests needs: the image of this build,
/// the node's private CNI directories, the API server on loopback (there is no kube-proxy), a free metrics port.
fn helm_install(cluster: &TestCluster, node: &Node, extra: &[&str]) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = url_parts(cluster.server());
    let mut values = vec![
        format!("image={}", node::IMAGE),
        format!("cni.binDir={}", node.cni_bin_dir().display()),
        format!("cni.confDir={}", node.cni_conf_dir().display()),
        format!("apiServer.host={}", url.0),
        format!("apiServer.port={}", url.1),
        format!("metrics.port={port}"),
        "gracePeriodSeconds=2".to_string(),
    ];
    values.extend(extra.iter().map(|v| v.to_string()));
    let kubeconfig = cluster.kubeconfig(Identity::Admin, SYSTEM);
    let mut cmd = std::process::Command::new(testenv::tool("helm"));
    cmd.args(["install", "hereabouts"]).arg(chart()).args(["--namespace", SYSTEM, "--wait=hookOnly"]);
    for v in &values {
        cmd.args(["--set-string", v]);
    }
    let out = cmd.env("KUBECONFIG", kubeconfig).env("HELM_CACHE_HOME", node.dir().join("helm")).output().unwrap();
    assert!(
        out.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn url_parts(server: &str) -> (String, String) {
    let rest = server.trim_start_matches("https://");
    let (host, port) = rest.rsplit_once(':').expect("host:port");
    (host.to_string(), port.to_string())
}

/// Waits until the DaemonSet runs `image` on the node, Ready, with the rollout finished.
async fn daemonset_ready(cluster: &TestCluster, node: &Node, image: &str) {
    let api = Api::<DaemonSet>::namespaced(cluster.admin().await, SYSTEM);
    let pods = Api::<Pod>::namespaced(cluster.admin().await, SYSTEM);
    let done = wait::until(Duration::from_secs(180), "the DaemonSet to be Ready", || async {
        let ds = api.get("hereabouts").await.ok()?;
        let status = ds.status?;
        let current = ds.metadata.generation == status.observed_generation;
        let ready = status.desired_number_scheduled == 1
            && status.updated_number_scheduled == Some(1)
            && status.number_ready == 1
            && status.number_available == Some(1);
        let on_image = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=hereabouts"))
            .await
            .ok()?
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .all(|p| p.spec.as_ref().is_some_and(|s| s.containers[0].image.as_deref() == Some(image)));
        (current && ready && on_image).then_some(())
    })
    .await;
    if let Err(e) = done {
        let listed = pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let statuses: Vec<_> = listed.iter().map(|p| (&p.metadata.name, &p.status)).collect();
        panic!("{e:#}\npods: {statuses:#?}\n{}", node.logs());
    }
}

fn nad_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition");
    ApiResource::from_gvk_with_plural(&gvk, "network-attachment-definitions")
}

/// A NetworkAttachmentDefinition putting pods on the node's test bridge with `ipam`.
async fn create_nad(cluster: &TestCluster, ns: &str, name: &str, ipam: Value) {
    let config = json!({"cniVersion": "1.0.0", "name": name, "type": "bridge", "bridge": node::BRIDGE, "ipam": ipam});
    let nad = json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"config": config.to_string()},
    });
    let api = Api::<DynamicObject>::namespaced_with(cluster.admin().await, ns, &nad_resource());
    let nad: DynamicObject = serde_json::from_value(nad).unwrap();
    // Established is not yet served: the group's route may answer 404 for a moment after the CRD was created.
    wait::until(Duration::from_secs(30), "the NAD to be created", || async {
        api.create(&PostParams::default(), &nad).await.map_err(|e| eprintln!("create NAD {ns}/{name}: {e}")).ok()
    })
    .await
    .unwrap();
}

/// hereabouts' IPAM section for `range`, reading the flat file install-cni wrote on the node.
fn hereabouts_ipam(node: &Node, kind: &str, file: &str, range: &str) -> Value {
    json!({"type": kind, "range": range, "configuration_path": node.cni_conf_dir().join(file)})
}

async fn create_pod(cluster: &TestCluster, ns: &str, name: &str, network: &str) {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": {"k8s.v1.cni.cncf.io/networks": network}},
        "spec": {
            "containers": [{"name": "app", "image": node::PAUSE_IMAGE, "imagePullPolicy": "Never"}],
            "terminationGracePeriodSeconds": 5,
        },
    });
    Api::<Pod>::namespaced(cluster.admin().await, ns)
        .create(&PostParams::default(), &serde_json::from_value(pod).unwrap())
        .await
        .unwrap_or_else(|e| panic!("create pod {ns}/{name}: {e}"));
}

/// Waits until pod `name` runs and Multus reported its `network` attachment; returns its UID and the address.
async fn running(cluster: &TestCluster, node: &Node, ns: &str, name: &str, network: &str) -> (String, IpAddr) {
    let api = Api::<Pod>::namespaced(cluster.admin().await, ns);
    let wanted = format!("{ns}/{network}");
    let found = wait::until(Duration::from_secs(90), &format!("pod {name} to run with {wanted}"), || async {
        let pod = api.get(name).await.ok()?;
        let phase = pod.status.as_ref()?.phase.clone()?;
        if phase != "Running" {
            return None;
        }
        let status = pod.metadata.annotations.as_ref()?.get("k8s.v1.cni.cncf.io/network-status")?;
        let entries: Vec<Value> = serde_json::from_str(status).ok()?;
        let entry = entries.iter().find(|e| e["name"] == wanted.as_str())?;
        let ip: IpAddr = entry["ips"][0].as_str()?.parse().ok()?;
        Some((pod.metadata.uid.clone()?, ip))
    })
    .await;
    match found {
        Ok(found) => found,
        Err(e) => {
            let pod = api.get(name).await.ok();
            let events = events(cluster, ns).await;
            panic!("{e:#}\npod: {:#?}\nevents: {events:#?}\n{}", pod.map(|p| p.status), node.logs())
        }
    }
}

/// Deletes pods through the API and waits until they are gone: the kubelet has run CNI DEL for each.
async fn delete_pods(cluster: &TestCluster, node: &Node, ns: &str, names: &[String]) {
    let api = Api::<Pod>::namespaced(cluster.admin().await, ns);
    for name in names {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let gone = wait::until(Duration::from_secs(90), "the pods to be gone", || async {
        for name in names {
            if api.get_opt(name).await.ok()?.is_some() {
                return None;
            }
        }
        Some(())
    })
    .await;
    if let Err(e) = gone {
        panic!("{e:#}\nevents: {:#?}\n{}", events(cluster, ns).await, node.logs());
    }
}

/// `(reason, message)` of the namespace's events.
async fn events(cluster: &TestCluster, ns: &str) -> Vec<(String, String)> {
    let api = Api::<Event>::namespaced(cluster.admin().await, ns);
    let list = api.list(&ListParams::default()).await.unwrap().items;
    list.into_iter().map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default())).collect()
}

/// Events that say an ADD (sandbox creation) or a DEL (sandbox teardown) failed.
async fn cni_failures(cluster: &TestCluster, ns: &str) -> Vec<(String, String)> {
    let failed = ["FailedCreatePodSandBox", "FailedKillPod"];
    events(cluster, ns).await.into_iter().filter(|(reason, _)| failed.contains(&reason.as_str())).collect()
}

/// The addresses the IPPools of the system namespace hold, with their podrefs.
async fn pool_entries(cluster: &TestCluster) -> Vec<(String, String)> {
    let pools = Api::<IpPool>::namespaced(cluster.admin().await, SYSTEM).list(&ListParams::default()).await.unwrap();
    let mut out = Vec::new();
    for pool in pools.items {
        for (offset, entry) in &pool.spec.allocations {
            out.push((format!("{}+{offset}", pool.spec.range), entry.podref.clone()));
        }
    }
    out
}

async fn reservations(cluster: &TestCluster) -> Vec<String> {
    let api = Api::<OverlappingRangeIpReservation>::namespaced(cluster.admin().await, SYSTEM);
    api.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|r| r.metadata.name).collect()
}

/// Whether the pod with UID `uid` gets an answer from `to` within 5 s.
fn ping(node: &Node, uid: &str, to: IpAddr) -> bool {
    let pid = node.pod_pid(uid).unwrap_or_else(|| panic!("no process of pod {uid} in the kubelet's cgroups"));
    netns::ping_at(std::path::Path::new(&format!("/proc/{pid}/ns/net")), to, Duration::from_secs(5)).unwrap()
}

/// The chart installs onto the node: the DaemonSet becomes Ready, install-cni writes the binary, the flat file,
/// the kubeconfig and the node name into the node's CNI directories; pods through Multus get distinct addresses
/// and reach each other on them; deleting them through the API runs DEL through the kubelet, which gives every
/// address and reservation back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_a_real_node_get_addresses_ping_and_give_them_back() {
    let (cluster, node) = fresh_node().await;
    helm_install(cluster, &node, &[]);
    daemonset_ready(cluster, &node, node::IMAGE).await;

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

    delete_pods(cluster, &node, &ns, &names).await;
    assert_eq!(pool_entries(cluster).await, vec![], "DEL through the kubelet gave every address back");
    assert_eq!(reservations(cluster).await, Vec::<String>::new(), "and every reservation");
    assert_eq!(cni_failures(cluster, &ns).await, vec![], "no ADD or DEL failed");
}

/// Sets the image of both of the DaemonSet's containers, as `kubectl set image` does.
async fn set_image(cluster: &TestCluster, image: &str) {
    let api = Api::<DaemonSet>::namespaced(cluster.admin().await, SYSTEM);
    let patch = json!({"spec": {"template": {"spec": {
        "initContainers": [{"name": "install-cni", "image": image}],
        "containers": [{"name": "reconciler", "image": image}],
    }}}});
    api.patch("hereabouts", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();
}

/// A rolling update of the DaemonSet to a new image tag while pods come and go on the node: no ADD and no DEL
/// fails, and afterwards the pools hold exactly the live pods' addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_fails_no_add_and_no_del() {
    let (cluster, node) = fresh_node().await;
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
    let churn = {
        let (stop, ns) = (stop.clone(), ns.clone());
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
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            (created, deleted)
        })
    };
    // Two rollouts, to the new tag and back, each while pods come and go.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut rollouts = Vec::new();
    for image in [next, node::IMAGE] {
        let t0 = std::time::Instant::now();
        set_image(cluster, image).await;
        daemonset_ready(cluster, &node, image).await;
        rollouts.push(format!("to {image} in {:.1} s", t0.elapsed().as_secs_f64()));
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

/// A pod deleted while its node's reconciler is down, whose DEL could not release (the plugin's kubeconfig was
/// gone, so the lenient DEL succeeded without releasing), is released by the reconciler when it is back; the
/// live pod's address stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_while_the_reconciler_is_down_is_released_when_it_returns() {
    let (cluster, node) = fresh_node().await;
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

    // The reconciler goes: no node matches the DaemonSet any more.
    let daemonsets = Api::<DaemonSet>::namespaced(cluster.admin().await, SYSTEM);
    let away = json!({"spec": {"template": {"spec": {"nodeSelector": {"hereabouts.test/absent": "true"}}}}});
    daemonsets.patch("hereabouts", &PatchParams::default(), &Patch::Merge(&away)).await.unwrap();
    let system_pods = Api::<Pod>::namespaced(cluster.admin().await, SYSTEM);
    wait::until(Duration::from_secs(60), "the reconciler's pod to be gone", || async {
        let lp = ListParams::default().labels("app.kubernetes.io/name=hereabouts");
        system_pods.list(&lp).await.ok()?.items.is_empty().then_some(())
    })
    .await
    .unwrap();

    let kubeconfig = node.cni_conf_dir().join("hereabouts.d/hereabouts.kubeconfig");
    let aside = kubeconfig.with_extension("aside");
    std::fs::rename(&kubeconfig, &aside).unwrap();
    delete_pods(cluster, &node, &ns, &["gone".to_string()]).await;
    let holders = || async { pool_entries(cluster).await.into_iter().map(|(_, p)| p).collect::<BTreeSet<String>>() };
    assert!(holders().await.contains(&format!("{ns}/gone")), "DEL without a kubeconfig released nothing");
    std::fs::rename(&aside, &kubeconfig).unwrap();

    let back = json!({"spec": {"template": {"spec": {"nodeSelector": {"hereabouts.test/absent": null}}}}});
    daemonsets.patch("hereabouts", &PatchParams::default(), &Patch::Merge(&back)).await.unwrap();
    daemonset_ready(cluster, &node, node::IMAGE).await;
    let released = wait::until(Duration::from_secs(90), "the reconciler to release the gone pod", || async {
        let now = holders().await;
        (!now.contains(&format!("{ns}/gone"))).then_some(now)
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", node.logs()));
    assert_eq!(released, BTreeSet::from([format!("{ns}/kept")]), "the live pod keeps its address");
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
    let (cluster, node) = fresh_node().await;
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
