//! The warm reserve (`warm_addresses`) through the node agent, against the real API server: pods start from the
//! node's reserve while the API server is stopped, and every address is handed over to its pod once it returns;
//! a cluster that runs Whereabouts' reconciler gets no reserve.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use futures::stream;
use hereabouts_tests::agent::Agent;
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::plugin::{Invocation, Output};
use hereabouts_tests::{Identity, TestCluster, wait};
use serde_json::{Value, json};

const NODES: [&str; 2] = ["node-a", "node-b"];
const PER_NODE: usize = 16;

async fn warm_agent(fx: &CniFixture, name: &str, node: &str) -> Agent {
    let own = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let socket = fx.cluster.dir().join(format!("{}-{name}.sock", fx.ns));
    Agent::start_with(&socket, node, &[("KUBECONFIG", own.as_path())]).await
}

fn via(inv: Invocation, node: &str, socket: &Path) -> Invocation {
    inv.with_env("NODENAME", node).with_env("HEREABOUTS_AGENT_SOCKET", socket.to_str().unwrap())
}

/// The warm entries of `node` the namespace's pools hold.
async fn warm_of(fx: &CniFixture, node: &str) -> usize {
    let token = format!("hereabouts-warm:{node}");
    fx.pools().await.iter().flat_map(|p| p.spec.allocations.values()).filter(|a| a.podref == token).count()
}

/// Who holds each address: entries and reservations, by podref.
async fn holders(fx: &CniFixture) -> (BTreeMap<IpAddr, Vec<String>>, BTreeMap<String, String>) {
    let mut entries: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    for pool in fx.pools().await {
        for (offset, a) in &pool.spec.allocations {
            let ip = hereabouts_ipam::claim::address_of(&pool, offset.parse().unwrap()).unwrap();
            entries.entry(ip).or_default().push(a.podref.clone());
        }
    }
    let reservations =
        fx.reservations().await.into_iter().map(|r| (r.metadata.name.unwrap_or_default(), r.spec.podref)).collect();
    (entries, reservations)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// Each node's reserve holds 16 addresses; the API server is stopped; 16 pods per node start (and one per node
/// is deleted and replaced) from the reserves alone; the API server comes back, and every address is handed
/// over to its pod — entry and reservation — with none held twice and none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_api_server_stopped_pods_start_from_the_reserve_and_are_handed_over_when_it_returns() {
    let cluster = TestCluster::own(module_path!());
    let fx = CniFixture::on(cluster, "warm-away").await;
    // an agent uses its reserve only while its Node exists (the reconciler gives a gone Node's reserve back)
    for node in NODES {
        hereabouts_tests::objects::mk_node(node).create(&fx.admin).await;
    }
    let config = fx.netconf(
        "1.1.0",
        "warm",
        json!({"range": "198.18.125.0/24", "node_slice_size": "/26", "warm_addresses": PER_NODE}),
    );
    let mut agents = Vec::new();
    for node in NODES {
        agents.push((node, warm_agent(&fx, node, node).await));
    }
    let run = |node: &'static str, socket: &Path, command: &'static str, pod: String| {
        via(fx.invocation(command, &config, &pod, &format!("c-{pod}")), node, socket)
    };
    // each node's first ADD claims its own address and starts its reserve
    let mut live: BTreeMap<String, IpAddr> = BTreeMap::new();
    for (node, agent) in &agents {
        let pod = format!("{node}-first");
        let out = run(node, &agent.socket, "ADD", pod.clone()).run().await;
        assert!(out.success, "{}\n{}", out.stdout, out.stderr);
        live.insert(pod, out.ips()[0]);
    }
    let filling = Instant::now();
    for (node, agent) in &agents {
        wait::until(Duration::from_secs(60), "the reserve to fill", || async {
            (warm_of(&fx, node).await == PER_NODE).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    }
    eprintln!("reserves of {PER_NODE} on {} nodes filled in {:?}", NODES.len(), filling.elapsed());
    for (_, agent) in &agents {
        let full = format!("hereabouts_agent_warm_addresses{{network=\"warm\"}} {PER_NODE}");
        wait::until(Duration::from_secs(10), "the reserve's gauge", || async {
            agent.get("/metrics").filter(|m| m.contains(&full)).map(drop)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.get("/metrics").unwrap_or_default()));
    }

    cluster.kill_apiserver();
    let burst: Vec<(&'static str, &Agent, String)> = agents
        .iter()
        .flat_map(|(node, agent)| (0..PER_NODE).map(move |i| (*node, agent, format!("{node}-p{i}"))))
        .collect();
    let timed = |(node, agent, pod): (&'static str, &Agent, String)| {
        let inv = run(node, &agent.socket, "ADD", pod.clone());
        async move {
            let t0 = Instant::now();
            let out = inv.run().await;
            (pod, out, t0.elapsed())
        }
    };
    let outputs: Vec<(String, Output, Duration)> = stream::iter(burst).map(timed).buffer_unordered(32).collect().await;
    let mut took: Vec<Duration> = Vec::new();
    for (pod, out, elapsed) in outputs {
        assert!(out.success, "{pod} while the API server is away: {}\n{}", out.stdout, out.stderr);
        live.insert(pod, out.ips()[0]);
        took.push(elapsed);
    }
    took.sort();
    eprintln!(
        "{} ADDs with the API server stopped: p50 {:?}, p99 {:?}, max {:?}",
        took.len(),
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        took.last().unwrap()
    );
    // one pod per node deleted and one more started, still without the API server: the slot goes back and is taken
    for (node, agent) in &agents {
        let gone = format!("{node}-p0");
        let out = run(node, &agent.socket, "DEL", gone.clone()).run().await;
        assert!(out.success, "DEL while away: {}\n{}", out.stdout, out.stderr);
        live.remove(&gone);
        let pod = format!("{node}-late");
        let out = run(node, &agent.socket, "ADD", pod.clone()).run().await;
        assert!(out.success, "ADD after a DEL while away: {}\n{}", out.stdout, out.stderr);
        live.insert(pod, out.ips()[0]);
    }
    // while away, the gauge shows what waits for its hand-over
    let (_, first_agent) = &agents[0];
    wait::until(Duration::from_secs(10), "the pending gauge", || async {
        first_agent
            .get("/metrics")
            .filter(|m| m.contains(&format!("hereabouts_agent_warm_pending {PER_NODE}")))
            .map(drop)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", first_agent.get("/metrics").unwrap_or_default()));
    let told: BTreeSet<IpAddr> = live.values().copied().collect();
    assert_eq!(told.len(), live.len(), "an address told to two pods: {live:?}");
    for (_, agent) in &agents {
        assert!(agent.logs().contains("ADD done from the warm reserve"), "{}", agent.logs());
    }

    cluster.start_apiserver().await;
    let back = Instant::now();
    let want: BTreeMap<IpAddr, String> = live.iter().map(|(pod, ip)| (*ip, format!("{}/{pod}", fx.ns))).collect();
    let handed = wait::until(Duration::from_secs(120), "every address handed over", || async {
        let (entries, reservations) = holders(&fx).await;
        want.iter()
            .all(|(ip, podref)| {
                entries.get(ip) == Some(&vec![podref.clone()])
                    && reservations.get(&hereabouts_ipam::names::reservation_name("", *ip)) == Some(podref)
            })
            .then_some(())
    })
    .await;
    if let Err(e) = handed {
        let (entries, _) = holders(&fx).await;
        panic!("{e}\nwant {want:?}\nfound {entries:?}\n{}", agents[0].1.logs());
    }
    eprintln!("every entry and reservation handed over {:?} after the API server was ready", back.elapsed());
    let (entries, _) = holders(&fx).await;
    for (ip, podrefs) in &entries {
        assert_eq!(podrefs.len(), 1, "{ip} held twice: {podrefs:?}");
        let warm = podrefs[0].starts_with("hereabouts-warm:");
        assert!(warm || want.get(ip) == Some(&podrefs[0]), "{ip} left to {podrefs:?}");
    }
    let of_pod = |pod: &str| entries.values().filter(|p| p[0] == format!("{}/{pod}", fx.ns)).count();
    for node in NODES {
        assert_eq!(of_pod(&format!("{node}-p0")), 0, "the deleted pod holds nothing");
    }

    // node-b's Node object deleted: its agent stops taking from the reserve, and its ADDs claim their own
    let (node, agent) = (NODES[1], &agents[1].1);
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(fx.admin.clone());
    nodes.delete(node, &Default::default()).await.unwrap();
    wait::until(Duration::from_secs(30), "the agent to see its Node gone", || async {
        agent.logs().contains("the Node is missing").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let taken = |a: &Agent| a.logs().matches("took a warm slot").count();
    let before = taken(agent);
    let out = run(node, &agent.socket, "ADD", format!("{node}-nodeless")).run().await;
    assert!(out.success, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(taken(agent), before, "no slot taken while the Node is gone:\n{}", agent.logs());
}

/// A cluster that runs Whereabouts' reconciler (its DaemonSet's `ip-control-loop`) would free the node's warm
/// entries as entries of no pod: the agent keeps no reserve there, says why, and ADDs claim their own.
#[tokio::test]
async fn no_reserve_where_whereabouts_reconciler_runs() {
    let fx = CniFixture::new("warm-fleet").await;
    let daemonset: Value = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "whereabouts", "namespace": fx.ns},
        "spec": {
            "selector": {"matchLabels": {"app": "whereabouts"}},
            "template": {
                "metadata": {"labels": {"app": "whereabouts"}},
                "spec": {"containers": [{
                    "name": "whereabouts", "image": "ghcr.io/k8snetworkplumbingwg/whereabouts:v0.9.2",
                    "command": ["/bin/sh", "-c", "SLEEP=false source /install-cni.sh && /ip-control-loop -log-level debug"],
                }]},
            },
        },
    });
    let sets: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> = kube::Api::namespaced(fx.admin.clone(), &fx.ns);
    sets.create(&Default::default(), &serde_json::from_value(daemonset).unwrap()).await.unwrap();
    // the agent lists every namespace: another test's may be named beside this one
    refused_for(&fx, "fleet", &format!("DaemonSet {}/whereabouts", fx.ns)).await;
    sets.delete("whereabouts", &Default::default()).await.unwrap();
}

/// Whereabouts v0.9.4 runs its reconciler (`ip-reconciler`) in a Deployment, `whereabouts-reconciler`: found as
/// well, and the reserve refused.
#[tokio::test]
async fn no_reserve_where_whereabouts_reconciler_runs_as_a_deployment() {
    let fx = CniFixture::new("warm-fleet-dep").await;
    let deployment: Value = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "whereabouts-reconciler", "namespace": fx.ns},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"name": "whereabouts-reconciler"}},
            "template": {
                "metadata": {"labels": {"name": "whereabouts-reconciler"}},
                "spec": {"containers": [{
                    "name": "whereabouts-reconciler", "image": "ghcr.io/k8snetworkplumbingwg/whereabouts:v0.9.4",
                    "command": ["/ip-reconciler"], "args": ["-log-level", "debug"],
                }]},
            },
        },
    });
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(fx.admin.clone(), &fx.ns);
    deployments.create(&Default::default(), &serde_json::from_value(deployment).unwrap()).await.unwrap();
    refused_for(&fx, "fleet-dep", &format!("Deployment {}/whereabouts-reconciler", fx.ns)).await;
    deployments.delete("whereabouts-reconciler", &Default::default()).await.unwrap();
}

/// An agent of a Node of its own, with a warm network: ADDs succeed, claim their own, and the agent says `says`
/// of its refusal (log and gauge).
async fn refused_for(fx: &CniFixture, name: &str, says: &str) {
    // a Node of its own: an agent uses a reserve only while its Node exists
    let node = format!("{}-node", fx.ns);
    hereabouts_tests::objects::mk_node(&node).create(&fx.admin).await;
    let agent = warm_agent(fx, name, &node).await;
    let config = fx.netconf(
        "1.1.0",
        "warmfleet",
        json!({"range": "198.18.126.0/24", "node_slice_size": "/26", "warm_addresses": 4}),
    );
    for i in 0..3 {
        let pod = format!("p{i}");
        let out = via(fx.invocation("ADD", &config, &pod, &format!("c-{pod}")), &node, &agent.socket).run().await;
        assert!(out.success, "{}\n{}", out.stdout, out.stderr);
    }
    wait::until(Duration::from_secs(20), "the refusal in the agent's log", || async {
        agent.logs().contains("warm reserve refused").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let refusal = agent.logs().lines().find(|l| l.contains("warm reserve refused")).unwrap_or_default().to_string();
    assert!(refusal.contains(says) && refusal.contains("Whereabouts' reconciler"), "{}", agent.logs());
    assert_eq!(warm_of(fx, &node).await, 0, "nothing claimed in advance");
    wait::until(Duration::from_secs(10), "the refused gauge", || async {
        agent.get("/metrics").filter(|m| m.contains("hereabouts_agent_warm_refused 1")).map(drop)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.get("/metrics").unwrap_or_default()));
    assert!(!agent.logs().contains("ADD done from the warm reserve"));
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(fx.admin.clone());
    nodes.delete(&node, &Default::default()).await.unwrap();
}
