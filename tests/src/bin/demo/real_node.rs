//! The demo on a real node: the local control plane, one kubelet + containerd + runc node with Multus as its only
//! CNI config, the chart installed by helm (the DaemonSet installing the plugin on the node, the controller), pods of a
//! NetworkAttachmentDefinition getting addresses through the kubelet, DEL through the kubelet, and the controller
//! giving back what a DEL could not. Everything it starts and writes goes at the end.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hereabouts_ipam::crd::IpPool;
use hereabouts_tests::TestCluster;
use hereabouts_tests::node::workload::{self, SYSTEM};
use hereabouts_tests::node::{self, Node};
use kube::api::Api;

use super::{Step, detail, print_pool};

const RANGE: &str = "198.18.100.0/24";
const POOL: &str = "198.18.100.0-24";
const NETWORK: &str = "demo-net";
const PODS: usize = 6;

async fn pool(cluster: &TestCluster) -> anyhow::Result<IpPool> {
    Api::<IpPool>::namespaced(cluster.admin().await, SYSTEM).get(POOL).await.context("read the pool")
}

async fn holders(cluster: &TestCluster) -> anyhow::Result<BTreeSet<String>> {
    Ok(pool(cluster).await?.spec.allocations.values().map(|a| a.podref.clone()).collect())
}

pub async fn main(step: &mut Step) -> anyhow::Result<()> {
    step.say("starting the local control plane (etcd + kube-apiserver, TLS, RBAC, ServiceAccount tokens)");
    let cluster = TestCluster::get_for_node();
    detail(&format!("API server {} ready after {:.1} s", cluster.server(), cluster.ready_after.as_secs_f64()));

    step.say("starting a node: containerd (CRI, runc), kube-controller-manager, kube-scheduler, kubelet");
    let multus = if std::env::args().any(|a| a == "--multus-thick") { node::Multus::Thick } else { node::Multus::Thin };
    let (cluster, node) = workload::fresh_node_with(multus).await;
    detail(&format!(
        "node {} Ready after {:.1} s, state in {}",
        node::NAME,
        node.ready_after.as_secs_f64(),
        node.dir().display()
    ));
    detail(match multus {
        node::Multus::Thin => "its only CNI config is Multus (thin plugin), delegating the default network to a bridge",
        node::Multus::Thick => {
            "its only CNI config is Multus' thick plugin (multus-shim, and multus-daemon running the delegates \
             through its chroot executor), delegating the default network to a bridge"
        }
    });
    let result = run(step, cluster, &node).await;
    if let Err(e) = &result {
        eprintln!("\ndemo failed: {e:#}\n{}", node.logs());
    }
    result
}

async fn run(step: &mut Step, cluster: &'static TestCluster, node: &Node) -> anyhow::Result<()> {
    step.say(&format!(
        "helm install deploy/chart with image {} (written from this build, imported into containerd)",
        node::IMAGE
    ));
    workload::helm_install(cluster, node, &[]);
    workload::daemonset_ready(cluster, node, node::IMAGE).await;
    detail("Deployment kube-system/hereabouts-controller Ready: the cluster-wide work, leader-elected");
    detail("DaemonSet kube-system/hereabouts Ready: install-cni (a native sidecar) wrote on the node:");
    for dir in [node.cni_bin_dir(), node.cni_conf_dir().join("hereabouts.d")] {
        let mut names: Vec<String> =
            std::fs::read_dir(&dir)?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        detail(&format!("  {}: {}", dir.display(), names.join(" ")));
    }

    let ns = cluster.namespace("demo").await;
    node::default_service_account(cluster, &ns).await;
    step.say(&format!("NetworkAttachmentDefinition {ns}/{NETWORK}: bridge {} + hereabouts {RANGE}", node::BRIDGE));
    let ipam = workload::hereabouts_ipam(node, "hereabouts", "hereabouts.d/hereabouts.conf", RANGE);
    workload::create_nad(cluster, &ns, NETWORK, ipam).await;

    step.say(&format!("creating {PODS} pods annotated k8s.v1.cni.cncf.io/networks: {NETWORK}"));
    let names: Vec<String> = (0..PODS).map(|i| format!("web-{i}")).collect();
    let t = Instant::now();
    for name in &names {
        workload::create_pod(cluster, &ns, name, NETWORK).await;
    }
    let mut pods = Vec::new();
    for name in &names {
        let (uid, ip) = workload::running(cluster, node, &ns, name, NETWORK).await;
        detail(&format!(
            "{name} Running, net1 {ip} (Multus network-status), {:.1} s after creation",
            t.elapsed().as_secs_f64()
        ));
        pods.push((name.clone(), uid, ip));
    }
    let agent = node.container_logs(SYSTEM, "hereabouts-", "agent");
    let served = agent.lines().filter(|l| l.contains("served") && l.contains("command=ADD")).count();
    detail(&format!(
        "the node agent (container `agent` of the DaemonSet pod) served {served} of the {PODS} ADDs: the plugin \
         handed them over /run/hereabouts/agent.sock"
    ));

    step.say("web-0 pings every other pod on its secondary address");
    for (name, _, ip) in &pods[1..] {
        let t = Instant::now();
        let answered = workload::ping(node, &pods[0].1, *ip);
        detail(&format!(
            "web-0 -> {name} ({ip}): {}",
            if answered { format!("reply in {:.1} ms", t.elapsed().as_secs_f64() * 1000.0) } else { "NO REPLY".into() }
        ));
        if !answered {
            bail!("{name} did not answer on {ip}");
        }
    }
    print_pool(&pool(cluster).await?);

    step.say("deleting web-1 and web-2 through the API: the kubelet runs CNI DEL (Multus -> bridge -> hereabouts)");
    workload::delete_pods(cluster, node, &ns, &names[1..3]).await;
    print_pool(&pool(cluster).await?);

    step.say("deleting web-3 and web-4 while the plugin's kubeconfig is set aside: DEL succeeds, releases nothing");
    let kubeconfig = node.cni_conf_dir().join("hereabouts.d/hereabouts.kubeconfig");
    let aside = kubeconfig.with_extension("aside");
    std::fs::rename(&kubeconfig, &aside)?;
    let t = Instant::now();
    workload::delete_pods(cluster, node, &ns, &names[3..5]).await;
    std::fs::rename(&aside, &kubeconfig)?;
    let mut pending: BTreeSet<String> = names[3..5].iter().map(|n| format!("{ns}/{n}")).collect();
    step.say("the controller sees the pods gone and gives their addresses back");
    while !pending.is_empty() {
        if t.elapsed() > Duration::from_secs(60) {
            bail!("not released after 60 s: {pending:?}");
        }
        let held = holders(cluster).await?;
        for podref in pending.clone() {
            if !held.contains(&podref) {
                detail(&format!("{podref} released {:.1} s after its deletion was asked", t.elapsed().as_secs_f64()));
                pending.remove(&podref);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for line in node.container_logs(SYSTEM, "hereabouts-controller-", "reconciler").lines() {
        if line.contains("released") && pods[3..5].iter().any(|(name, _, _)| line.contains(&format!("{ns}/{name}"))) {
            let message = line.splitn(4, ' ').nth(3).unwrap_or(line);
            detail(&format!("controller: {message}"));
        }
    }
    print_pool(&pool(cluster).await?);

    step.say("tearing down: the last pods through the API, then the node and the control plane");
    let last = [names[0].clone(), names[5].clone()];
    workload::delete_pods(cluster, node, &ns, &last).await;
    let left = pool(cluster).await?.spec.allocations.len();
    let failures = workload::cni_failures(cluster, &ns).await;
    println!();
    println!(
        "summary: {PODS} pods attached through Multus on node {}, {} pings answered, 4 released by CNI DEL via the",
        node::NAME,
        PODS - 1
    );
    println!(
        "         kubelet, 2 by the controller; {left} left allocated, {} ADD/DEL failures, in {:.1} s",
        failures.len(),
        step.t0.elapsed().as_secs_f64()
    );
    Ok(())
}
