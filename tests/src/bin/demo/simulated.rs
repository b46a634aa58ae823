//! `make demo` where a real node cannot run (or with `--simulated`): hereabouts on a local control plane with three
//! simulated nodes and twelve pods.
//!
//! It starts kube-apiserver and etcd (the test control plane, CRDs installed), applies the RBAC of
//! `deploy/daemonset.yaml`, installs a NetworkAttachmentDefinition, starts one reconciler per node, makes three
//! node network namespaces on one L2 fabric and twelve pods across them (macvlan + hereabouts through `cnitool`),
//! prints the addresses, pings across nodes, prints the pool, deletes pods without CNI DEL and shows the
//! reconciler giving their addresses back, then removes everything. Needs root (network namespaces).
//! hereabouts logs to a file, named at the end; the reconcilers and the control plane log into the control
//! plane's state directory, removed at exit.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::{Step, detail, print_pool};

use anyhow::{Context as _, bail};
use hereabouts_ipam::crd::IpPool;
use hereabouts_tests::netns::{self, Fabric, Netns};
use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
use hereabouts_tests::runtime::{self, CniRuntime, PodRef, result_ips};
use hereabouts_tests::{Identity, TestCluster, deploy, testenv};
use kube::Client;
use kube::api::Api;
use serde_json::json;

const RANGE: &str = "198.18.100.0/24";
const POOL: &str = "198.18.100.0-24";
const NETWORK: &str = "demo-net";
const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
const PODS: usize = 12;

struct DemoPod {
    name: String,
    node: usize,
    netns: Netns,
    who: PodRef,
    ip: IpAddr,
}

async fn pool(admin: &Client, ns: &str) -> anyhow::Result<IpPool> {
    Api::<IpPool>::namespaced(admin.clone(), ns).get(POOL).await.context("read the pool")
}

/// The demo on simulated nodes (network namespaces, `cnitool`, one reconciler process per node).
pub async fn main(step: &mut Step) -> anyhow::Result<()> {
    if !netns::is_root() {
        bail!("the demo makes network namespaces and needs root: run `sudo make demo`");
    }
    // below /tmp: a NAD may log only below /var/log or /tmp
    let logs = tempfile::Builder::new().prefix("hereabouts-demo-logs-").tempdir_in("/tmp")?.keep();
    let result = run(step, &logs).await;
    match &result {
        Ok(()) => println!("\nhereabouts' log: {}", logs.join("hereabouts.log").display()),
        Err(e) => eprintln!("\ndemo failed: {e:#}\nlogs: {}", logs.display()),
    }
    result
}

async fn run(step: &mut Step, logs: &std::path::Path) -> anyhow::Result<()> {
    step.say("starting the local control plane (etcd + kube-apiserver, TLS, RBAC) and installing the CRDs");
    for tool in ["kube-apiserver", "etcd", "cnitool", "macvlan"] {
        testenv::tool(tool);
    }
    let cluster = TestCluster::get();
    detail(&format!("API server {} ready after {:.1} s", cluster.server(), cluster.ready_after.as_secs_f64()));
    let admin = cluster.admin().await;
    let ns = cluster.namespace("demo").await;
    detail(&format!("namespace {ns}"));

    step.say("applying the ServiceAccount's ClusterRole and binding from deploy/daemonset.yaml");
    deploy::apply_rbac(admin.clone()).await;
    deploy::create_lease(&admin, &ns).await;
    let kubeconfig = cluster.kubeconfig(Identity::Cni, &ns);

    let runtime = CniRuntime::new()?;
    let plugin = json!({
        "type": "macvlan", "master": "fab0", "mode": "bridge",
        "ipam": {"type": "hereabouts", "range": RANGE, "kubernetes": {"kubeconfig": kubeconfig},
                 "log_level": "debug", "log_file": logs.join("hereabouts.log")},
    });
    runtime.write_conflist(NETWORK, vec![plugin.clone()])?;
    let mut nad = plugin.clone();
    nad["cniVersion"] = json!("1.0.0");
    nad["name"] = json!(NETWORK);
    match runtime::nad_crd_path() {
        Some(crd) => {
            step.say("installing the NetworkAttachmentDefinition CRD and NAD demo-net (macvlan + hereabouts)");
            runtime::install_nad_crd(&admin, &crd).await?;
            runtime::create_nad(&admin, &ns, NETWORK, &nad).await?;
            detail(&format!(
                "{ns}/{NETWORK}: {}",
                nad["ipam"].to_string().replace(&kubeconfig.display().to_string(), "…")
            ));
        }
        None => {
            step.say("the NAD CRD is not built (hack/testenv.sh): the network config file stands for the NAD");
        }
    }
    detail(&format!("the runtime reads it as {}", runtime.conf_dir().join(format!("{NETWORK}.conflist")).display()));

    step.say("creating 3 nodes: network namespaces joined by veth pairs to one bridge");
    let port: u16 = cluster.server().rsplit(':').next().and_then(|p| p.parse().ok()).context("the API port")?;
    let names: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
    let fabric = Fabric::new(&names, Some(port))?;
    for node in &fabric.nodes {
        detail(&format!("{:<7} netns {}, macvlan master {}", node.name, node.netns.name, node.master));
    }

    step.say("starting one reconciler per node (hereabouts-reconciler run, the DaemonSet's identity)");
    let mut reconcilers = Vec::new();
    for node in NODES {
        reconcilers.push(Reconciler::start(cluster, &ReconcilerOptions::new(node, &ns)).await);
    }
    detail("each watches its node's pods and, every 2 s, sweeps what no live pod holds (grace period 1 s)");

    step.say(&format!("creating {PODS} pods across the nodes: Pod object, pod netns, `cnitool add {NETWORK}`"));
    let mut pods = Vec::new();
    for i in 0..PODS {
        let node = i % NODES.len();
        let name = format!("web-{i}");
        let obj = runtime::create_pod(&admin, &ns, &name, NODES[node], &[]).await?;
        let who = PodRef { namespace: ns.clone(), name: name.clone(), uid: obj.metadata.uid.unwrap_or_default() };
        let netns = fabric.pod_netns(&name)?;
        let t = Instant::now();
        let result = runtime.add(&fabric.nodes[node], NETWORK, &netns, &who)?;
        let ip = *result_ips(&result).first().context("no address in the result")?;
        let on_link = netns.addresses("net1")?;
        if on_link != vec![ip] {
            bail!("{name}: net1 holds {on_link:?}, the result said {ip}");
        }
        detail(&format!(
            "{name:<7} on {:<7} net1 {ip}/24  ({} ms; read back with `ip -n {} addr show net1`)",
            NODES[node],
            t.elapsed().as_millis(),
            netns.name
        ));
        pods.push(DemoPod { name, node, netns, who, ip });
    }

    step.say("pinging across nodes: each pod sends an ICMP echo to the next pod, on another node");
    let mut ok = 0;
    for (i, pod) in pods.iter().enumerate() {
        let to = &pods[(i + 1) % pods.len()];
        let t = Instant::now();
        let answered = netns::ping(&pod.netns.name, to.ip, Duration::from_secs(3))?;
        ok += usize::from(answered);
        detail(&format!(
            "{:<7} ({}) -> {:<7} ({}) {:<15} {}",
            pod.name,
            NODES[pod.node],
            to.name,
            NODES[to.node],
            to.ip,
            if answered { format!("reply in {:.1} ms", t.elapsed().as_secs_f64() * 1000.0) } else { "NO REPLY".into() }
        ));
    }
    if ok != pods.len() {
        bail!("{} of {} pings got no reply", pods.len() - ok, pods.len());
    }

    step.say("the pool as the API server holds it");
    print_pool(&pool(&admin, &ns).await?);

    let doomed: Vec<usize> = vec![1, 4, 6, 11];
    step.say(&format!("deleting {} pods the hard way: their netns and Pod objects go, no CNI DEL runs", doomed.len()));
    let t = Instant::now();
    for &i in &doomed {
        pods[i].netns.delete()?;
        runtime::force_delete_pod(&admin, &ns, &pods[i].name).await?;
        detail(&format!("{} ({}) gone, its address {} still allocated", pods[i].name, NODES[pods[i].node], pods[i].ip));
    }

    step.say("waiting for the reconcilers to give the addresses back");
    let mut pending: BTreeMap<String, IpAddr> =
        doomed.iter().map(|&i| (format!("{ns}/{}", pods[i].name), pods[i].ip)).collect();
    while !pending.is_empty() {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("not released after 30 s: {:?}", pending.keys().collect::<Vec<_>>());
        }
        let held: Vec<String> = pool(&admin, &ns).await?.spec.allocations.values().map(|a| a.podref.clone()).collect();
        let freed: Vec<String> = pending.keys().filter(|p| !held.contains(p)).cloned().collect();
        for podref in freed {
            let ip = pending.remove(&podref).unwrap();
            detail(&format!("{ip} of {podref} released after {:.1} s", t.elapsed().as_secs_f64()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    print_pool(&pool(&admin, &ns).await?);

    step.say("a new pod gets the lowest free address again");
    let obj = runtime::create_pod(&admin, &ns, "web-new", NODES[0], &[]).await?;
    let who = PodRef { namespace: ns.clone(), name: "web-new".into(), uid: obj.metadata.uid.unwrap_or_default() };
    let netns = fabric.pod_netns("web-new")?;
    let result = runtime.add(&fabric.nodes[0], NETWORK, &netns, &who)?;
    let ip = *result_ips(&result).first().context("no address")?;
    detail(&format!("web-new on {} net1 {ip}/24", NODES[0]));
    pods.push(DemoPod { name: "web-new".into(), node: 0, netns, who, ip });

    step.say("tearing down: `cnitool del` for every live pod, then the namespaces, reconcilers and control plane");
    let mut deleted = 0;
    for pod in pods.iter().filter(|p| p.netns.exists()) {
        runtime.del(&fabric.nodes[pod.node], NETWORK, &pod.netns, &pod.who)?;
        deleted += 1;
    }
    let left = pool(&admin, &ns).await?.spec.allocations.len();
    drop(pods);
    drop(fabric);
    drop(reconcilers);
    let stray = netns::list().into_iter().filter(|n| n.starts_with(netns::PREFIX)).count();

    println!();
    println!(
        "summary: {} nodes, {} pods attached, {} of {} cross-node pings answered,",
        NODES.len(),
        PODS + 1,
        ok,
        PODS
    );
    println!(
        "         {} addresses given back by the reconcilers without CNI DEL, {deleted} released by CNI DEL,",
        doomed.len()
    );
    println!(
        "         {left} left allocated, {stray} demo namespaces left, in {:.1} s",
        step.t0.elapsed().as_secs_f64()
    );
    Ok(())
}
