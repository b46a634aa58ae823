//! What the real-node tests and the demo do on a [`Node`]: install the chart with helm, wait for the DaemonSet and
//! the controller,
//! create NetworkAttachmentDefinitions and pods, and read what Multus and the pools say about them. Failures
//! panic with what the node logged.

use std::net::IpAddr;
use std::time::Duration;

use super::{self as node, Node};
use crate::{Identity, TestCluster, netns, objects, testenv, wait};
use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Event, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The namespace the chart installs into (its default): the pools and reservations live there.
pub const SYSTEM: &str = "kube-system";

pub fn chart() -> std::path::PathBuf {
    testenv::repo_root().join("deploy/chart")
}

/// The real-node control plane with no trace of an earlier test of this binary: no release of the chart, no pools,
/// reservations or leader Lease in the system namespace; then a fresh node.
pub async fn fresh_node() -> (&'static TestCluster, Node) {
    fresh_node_with(node::Multus::Thin).await
}

/// [`fresh_node`] with Multus run as `multus`.
pub async fn fresh_node_with(multus: node::Multus) -> (&'static TestCluster, Node) {
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
    let node = Node::start_with(cluster, lock, multus).await;
    (cluster, node)
}

/// `helm install` of the chart onto the node, with the values a node of the tests needs: the image of this build,
/// the node's private CNI directories, the API server on loopback (there is no kube-proxy) and so the host's
/// network (a pod's network namespace cannot reach the host's 127.0.0.1), a free metrics port, and one controller
/// replica (a second would wait unscheduled: in the host's network two cannot share a node's metrics port).
pub fn helm_install(cluster: &TestCluster, node: &Node, extra: &[&str]) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = url_parts(cluster.server());
    let mut values = vec![
        format!("image.repository={}", node::IMAGE.split_once(':').expect("name:tag").0),
        format!("image.tag={}", node::IMAGE.split_once(':').expect("name:tag").1),
        format!("cni.binDir={}", node.cni_bin_dir().display()),
        format!("cni.confDir={}", node.cni_conf_dir().display()),
        format!("apiServer.host={}", url.0),
        format!("apiServer.port={}", url.1),
        format!("metrics.port={port}"),
        "hostNetwork=true".to_string(),
        "gracePeriodSeconds=2".to_string(),
        "controller.replicas=1".to_string(),
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

pub fn url_parts(server: &str) -> (String, String) {
    let rest = server.trim_start_matches("https://");
    let (host, port) = rest.rsplit_once(':').expect("host:port");
    (host.to_string(), port.to_string())
}

/// Waits until the DaemonSet runs `image` on the node and the controller's replica runs it too, Ready, with both
/// rollouts finished.
pub async fn daemonset_ready(cluster: &TestCluster, node: &Node, image: &str) {
    node_pods_ready(cluster, node, image).await;
    controller_ready(cluster, node, image).await;
}

/// Waits until the controller Deployment's one replica runs `image`, Ready, with its rollout finished.
pub async fn controller_ready(cluster: &TestCluster, node: &Node, image: &str) {
    let api = Api::<Deployment>::namespaced(cluster.admin().await, SYSTEM);
    let pods = Api::<Pod>::namespaced(cluster.admin().await, SYSTEM);
    let done = wait::until(Duration::from_secs(180), "the controller to be Ready", || async {
        let deployment = api.get("hereabouts-controller").await.ok()?;
        let status = deployment.status?;
        let current = deployment.metadata.generation == status.observed_generation;
        let ready =
            status.updated_replicas == Some(1) && status.ready_replicas == Some(1) && status.replicas == Some(1);
        let on_image = all_on_image(&pods, CONTROLLER_PODS, image).await?;
        (current && ready && on_image).then_some(())
    })
    .await;
    if let Err(e) = done {
        not_ready(&pods, node, e).await;
    }
}

/// Whether every pod `selector` lists (but those being deleted) runs `image` in its first container; `None` when
/// they cannot be listed.
async fn all_on_image(pods: &Api<Pod>, selector: &str, image: &str) -> Option<bool> {
    let listed = pods.list(&ListParams::default().labels(selector)).await.ok()?.items;
    let on_image = |p: &Pod| p.spec.as_ref().is_some_and(|s| s.containers[0].image.as_deref() == Some(image));
    Some(listed.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).all(on_image))
}

/// Panics with `e`, the status of every pod of the system namespace and the node's logs.
async fn not_ready(pods: &Api<Pod>, node: &Node, e: impl std::fmt::Display) {
    let listed = pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    let statuses: Vec<_> = listed.iter().map(|p| (&p.metadata.name, &p.status)).collect();
    panic!("{e:#}\npods: {statuses:#?}\n{}", node.logs());
}

/// The label selector of the controller's pods.
pub const CONTROLLER_PODS: &str = "app.kubernetes.io/name=hereabouts-controller";

/// Scales the controller to `replicas` (0: the cluster-wide work stops; the node's pods go on).
pub async fn scale_controller(cluster: &TestCluster, replicas: i32) {
    let api = Api::<Deployment>::namespaced(cluster.admin().await, SYSTEM);
    let patch = json!({"spec": {"replicas": replicas}});
    api.patch("hereabouts-controller", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// Waits until the DaemonSet runs `image` on the node, Ready, with the rollout finished.
async fn node_pods_ready(cluster: &TestCluster, node: &Node, image: &str) {
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
        let on_image = all_on_image(&pods, "app.kubernetes.io/name=hereabouts", image).await?;
        (current && ready && on_image).then_some(())
    })
    .await;
    if let Err(e) = done {
        not_ready(&pods, node, e).await;
    }
}

/// A NetworkAttachmentDefinition putting pods on the node's test bridge with `ipam`.
pub async fn create_nad(cluster: &TestCluster, ns: &str, name: &str, ipam: Value) {
    let config = json!({"cniVersion": "1.0.0", "name": name, "type": "bridge", "bridge": node::BRIDGE, "ipam": ipam});
    let api = Api::<DynamicObject>::namespaced_with(cluster.admin().await, ns, &hereabouts_ipam::crd::nad_resource());
    let nad = objects::mk_nad(ns, name, &config);
    // Established is not yet served: the group's route may answer 404 for a moment after the CRD was created.
    wait::until(Duration::from_secs(30), "the NAD to be created", || async {
        api.create(&PostParams::default(), &nad).await.map_err(|e| eprintln!("create NAD {ns}/{name}: {e}")).ok()
    })
    .await
    .unwrap();
}

/// hereabouts' IPAM section for `range`, reading the flat file install-cni wrote on the node.
pub fn hereabouts_ipam(node: &Node, kind: &str, file: &str, range: &str) -> Value {
    json!({"type": kind, "range": range, "configuration_path": node.cni_conf_dir().join(file)})
}

/// A pod of the node's pause image with the secondary network `network` (Multus' annotation).
pub async fn create_pod(cluster: &TestCluster, ns: &str, name: &str, network: &str) {
    let app = Container {
        name: "app".into(),
        image: Some(node::PAUSE_IMAGE.into()),
        image_pull_policy: Some("Never".into()),
        ..Default::default()
    };
    objects::mk_pod(ns, name)
        .annotation("k8s.v1.cni.cncf.io/networks", network)
        .container(app)
        .termination_grace(5)
        .create(&cluster.admin().await)
        .await;
}

/// Waits until pod `name` runs and Multus reported its `network` attachment; returns its UID and the address.
pub async fn running(cluster: &TestCluster, node: &Node, ns: &str, name: &str, network: &str) -> (String, IpAddr) {
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
pub async fn delete_pods(cluster: &TestCluster, node: &Node, ns: &str, names: &[String]) {
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
pub async fn events(cluster: &TestCluster, ns: &str) -> Vec<(String, String)> {
    let api = Api::<Event>::namespaced(cluster.admin().await, ns);
    let list = api.list(&ListParams::default()).await.unwrap().items;
    list.into_iter().map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default())).collect()
}

/// Events that say an ADD (sandbox creation) or a DEL (sandbox teardown) failed.
pub async fn cni_failures(cluster: &TestCluster, ns: &str) -> Vec<(String, String)> {
    let failed = ["FailedCreatePodSandBox", "FailedKillPod"];
    events(cluster, ns).await.into_iter().filter(|(reason, _)| failed.contains(&reason.as_str())).collect()
}

/// The addresses the IPPools of the system namespace hold, with their podrefs.
pub async fn pool_entries(cluster: &TestCluster) -> Vec<(String, String)> {
    let pools = Api::<IpPool>::namespaced(cluster.admin().await, SYSTEM).list(&ListParams::default()).await.unwrap();
    let mut out = Vec::new();
    for pool in pools.items {
        for (offset, entry) in &pool.spec.allocations {
            out.push((format!("{}+{offset}", pool.spec.range), entry.podref.clone()));
        }
    }
    out
}

pub async fn reservations(cluster: &TestCluster) -> Vec<String> {
    let api = Api::<OverlappingRangeIpReservation>::namespaced(cluster.admin().await, SYSTEM);
    api.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|r| r.metadata.name).collect()
}

/// Whether the pod with UID `uid` gets an answer from `to` within 5 s.
pub fn ping(node: &Node, uid: &str, to: IpAddr) -> bool {
    let pid = node.pod_pid(uid).unwrap_or_else(|| panic!("no process of pod {uid} in the kubelet's cgroups"));
    netns::ping_at(std::path::Path::new(&format!("/proc/{pid}/ns/net")), to, Duration::from_secs(5)).unwrap()
}

/// Sets the image of both of the DaemonSet's containers and of the controller's, as `kubectl set image` does.
pub async fn set_image(cluster: &TestCluster, image: &str) {
    let api = Api::<DaemonSet>::namespaced(cluster.admin().await, SYSTEM);
    let patch = json!({"spec": {"template": {"spec": {
        "initContainers": [{"name": "install-cni", "image": image}],
        "containers": [{"name": "agent", "image": image}],
    }}}});
    api.patch("hereabouts", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();
    let api = Api::<Deployment>::namespaced(cluster.admin().await, SYSTEM);
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "reconciler", "image": image}]}}}});
    api.patch("hereabouts-controller", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();
}
