//! The node agent's warm reserve (`warm_addresses`) on a real node: the chart's agent keeps addresses claimed in
//! advance after a network's first ADD there, pods the kubelet starts afterwards get theirs from it, each take is
//! handed over to its pod (entry and reservation), the reserve refills, and DEL through the kubelet releases the
//! pods' addresses while the reserve's stay.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use futures::future::join_all;
use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_tests::node::workload::*;
use hereabouts_tests::node::{self, Multus, Node};
use hereabouts_tests::{TestCluster, wait};
use kube::api::{Api, ListParams};
use serde_json::json;

/// The network's range: its own, apart from the other node tests'; slices of /27 leave room for the first pod,
/// the burst and a refilled reserve in the node's one slice.
const RANGE: &str = "198.18.2.0/24";
/// How many addresses the reserve keeps.
const WARM: usize = 8;
/// How many pods start at once from a full reserve.
const BURST: usize = 6;
/// The agent's journal, on the host (the chart mounts it there): outside the node's directory, so left by no
/// earlier run.
const JOURNAL_DIR: &str = "/var/lib/hereabouts/warm";
const FROM_THE_RESERVE: &str = "ADD done from the warm reserve";

/// What the system namespace holds: each pool entry as `(podref, container id)`, each reservation's podref.
#[derive(Debug)]
struct Held {
    entries: Vec<(String, String)>,
    reservations: Vec<String>,
}

impl Held {
    async fn read(cluster: &TestCluster) -> Held {
        let client = cluster.admin().await;
        let lp = ListParams::default();
        let pools = Api::<IpPool>::namespaced(client.clone(), SYSTEM).list(&lp).await.unwrap().items;
        let entries =
            pools.iter().flat_map(|p| p.spec.allocations.values()).map(|a| (a.podref.clone(), a.id.clone())).collect();
        let reservations = Api::<OverlappingRangeIpReservation>::namespaced(client, SYSTEM).list(&lp).await.unwrap();
        Held { entries, reservations: reservations.items.into_iter().map(|r| r.spec.podref).collect() }
    }

    /// The container ids of the entries of `podref`.
    fn entries_of(&self, podref: &str) -> Vec<&str> {
        self.entries.iter().filter(|(p, _)| p == podref).map(|(_, id)| id.as_str()).collect()
    }

    fn reservations_of(&self, podref: &str) -> usize {
        self.reservations.iter().filter(|p| *p == podref).count()
    }
}

/// One pod claims its own address and starts the node's reserve of 8; six pods then start at once from it, get
/// distinct addresses without asking the API server, and are handed over (entry and reservation) while the reserve
/// refills; deleting every pod through the API runs DEL through the kubelet, which leaves exactly the reserve.
/// The chart's node policy is in force (the hand-over is written with the node's token): it failed here while the
/// policy let a node change an entry or a reservation only for the same pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_start_from_the_nodes_warm_reserve_and_are_handed_over() {
    start_from_the_warm_reserve(Multus::Thin).await;
}

/// The same under Multus' thick plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_start_from_the_nodes_warm_reserve_and_are_handed_over_under_thick_multus() {
    start_from_the_warm_reserve(Multus::Thick).await;
}

async fn start_from_the_warm_reserve(multus: Multus) {
    let (cluster, node) = fresh_node_with(multus).await;
    let _ = std::fs::remove_dir_all(JOURNAL_DIR);
    helm_install(cluster, &node, &[]);
    daemonset_ready(cluster, &node, node::IMAGE).await;
    let ns = cluster.namespace("warm").await;
    node::default_service_account(cluster, &ns).await;
    let mut ipam = hereabouts_ipam(&node, "hereabouts", "hereabouts.d/hereabouts.conf", RANGE);
    ipam["node_slice_size"] = json!("/27");
    ipam["warm_addresses"] = json!(WARM);
    create_nad(cluster, &ns, "warm", ipam).await;
    let agent = || node.container_logs(SYSTEM, "hereabouts-", "agent");
    let warm = format!("hereabouts-warm:{}", node::NAME);
    let range: ipnet::IpNet = RANGE.parse().unwrap();

    // the network's first ADD on the node claims its own address and starts the reserve
    create_pod(cluster, &ns, "first", "warm").await;
    let first = running(cluster, &node, &ns, "first", "warm").await.1;
    assert!(!agent().contains(FROM_THE_RESERVE), "the first ADD found no reserve:\n{}", agent());
    let t0 = Instant::now();
    let filled = wait::until(Duration::from_secs(60), "the reserve to hold 8 warm entries", || async {
        if let Some(refused) = agent().lines().find(|l| l.contains("warm reserve refused")) {
            return Some(Err(refused.to_string()));
        }
        let held = Held::read(cluster).await;
        (held.entries_of(&warm).len() == WARM && held.reservations_of(&warm) == WARM).then_some(Ok(()))
    })
    .await;
    match filled {
        Ok(Ok(())) => eprintln!("warm: the reserve of {WARM} filled in {:.1} s", t0.elapsed().as_secs_f64()),
        Ok(Err(refused)) => panic!("the agent refused the reserve: {refused}\nagent:\n{}", agent()),
        Err(e) => panic!("{e:#}\nheld: {:#?}\nagent:\n{}", Held::read(cluster).await, agent()),
    }

    let names: Vec<String> = (0..BURST).map(|i| format!("pod-{i}")).collect();
    let t0 = Instant::now();
    join_all(names.iter().map(|name| create_pod(cluster, &ns, name, "warm"))).await;
    let pods = join_all(names.iter().map(|name| running(cluster, &node, &ns, name, "warm"))).await;
    eprintln!("warm: {BURST} pods created at once, all Running in {:.1} s", t0.elapsed().as_secs_f64());
    let mut addresses: BTreeSet<IpAddr> = pods.iter().map(|(_, ip)| *ip).collect();
    addresses.insert(first);
    assert_eq!(addresses.len(), BURST + 1, "every pod its own address: {first} and {pods:?}");
    assert!(addresses.iter().all(|ip| range.contains(ip)), "all in {RANGE}: {addresses:?}");

    // each take is handed over to its pod, entry and reservation, and the reserve refills
    let all: Vec<String> = std::iter::once("first".to_string()).chain(names.iter().cloned()).collect();
    let t0 = Instant::now();
    let handed = wait::until(Duration::from_secs(60), "the hand-over and the refill", || async {
        let held = Held::read(cluster).await;
        let ours = all.iter().map(|name| format!("{ns}/{name}"));
        let handed = ours.into_iter().all(|p| held.entries_of(&p).len() == 1 && held.reservations_of(&p) == 1);
        let full = held.entries_of(&warm).len() == WARM && held.reservations_of(&warm) == WARM;
        (handed && full).then_some(held)
    })
    .await;
    let held = match handed {
        Ok(held) => held,
        Err(e) => panic!("{e:#}\nheld: {:#?}\nagent:\n{}", Held::read(cluster).await, agent()),
    };
    eprintln!("warm: handed over and refilled {:.1} s after all were Running", t0.elapsed().as_secs_f64());
    assert_eq!(held.entries.len(), all.len() + WARM, "the pods' entries and the reserve's, nothing else: {held:#?}");
    assert_eq!(held.reservations.len(), all.len() + WARM, "and as many reservations: {held:#?}");

    // the burst's sandboxes (the ids their entries record) were answered from the reserve
    let log = agent();
    let served: Vec<&str> = log.lines().filter(|l| l.contains(FROM_THE_RESERVE)).collect();
    for name in &names {
        let id = held.entries_of(&format!("{ns}/{name}"))[0];
        let line = format!("container_id={id}");
        assert!(served.iter().any(|l| l.contains(&line)), "{name}'s ADD ({id}) came from the reserve:\n{log}");
    }
    assert!(served.len() >= BURST, "{} ADDs from the reserve:\n{log}", served.len());
    let handed_over: usize = log
        .lines()
        .filter(|l| l.contains("warm hand-over"))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("handed=")))
        .filter_map(|n| n.parse::<usize>().ok())
        .sum();
    assert!(handed_over >= BURST, "the hand-over rounds handed {handed_over}:\n{log}");

    delete_pods(cluster, &node, &ns, &all).await;
    let left = Held::read(cluster).await;
    assert!(
        left.entries.iter().all(|(p, _)| *p == warm) && left.entries.len() == WARM,
        "DEL through the kubelet released the pods' entries; the reserve's are left: {left:#?}"
    );
    assert!(
        left.reservations.iter().all(|p| *p == warm) && left.reservations.len() == WARM,
        "and their reservations: {left:#?}"
    );
    assert_eq!(cni_failures(cluster, &ns).await, vec![], "no ADD or DEL failed");
    clean_up(node);
}

/// Stops the node, then removes the journal it left on the host.
fn clean_up(node: Node) {
    drop(node);
    let _ = std::fs::remove_dir_all(JOURNAL_DIR);
    let _ = std::fs::remove_dir(std::path::Path::new(JOURNAL_DIR).parent().unwrap());
}
