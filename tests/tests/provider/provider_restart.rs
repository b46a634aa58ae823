//! IaaS provider mode under a restarted API server: 40 pods ADDed 8 at a time from 4 nodes into a node-warm pool
//! (node-0's) and a global pool behind it, while the API server is SIGKILLed and restarted in the middle of the
//! burst. An ADD that fails is torn down (DEL) and retried with a new sandbox, as a kubelet does. Asserted: every
//! pod attached, no address held by two pods, no entry or reservation that no attached pod holds, and every
//! address of the global pool with its sub-interface recorded on its pod's node and present in the cloud.
//!
//! It restarts the API server, which every test using it shares: it runs on a control plane of its own.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hereabouts_ipam::crd::IpPool;
use hereabouts_ipam::range::IpRange;
use hereabouts_tests::TestCluster;
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::provider::{ProviderOptions, ReferenceProvider};
use hereabouts_tests::wait;
use kube::api::Api;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

const PODS: usize = 40;
const AT_ONCE: usize = 8;
const NODES: usize = 4;
const TRIES: usize = 6;

/// ADDs pod `i` on its node until it gets an address, a DEL of the failed sandbox before each retry. Returns the
/// address and how many tries failed.
async fn attach(fx: &CniFixture, config: &Value, i: usize) -> (IpAddr, usize) {
    let node = format!("node-{}", i % NODES);
    let pod = format!("pod-{i}");
    for attempt in 0..TRIES {
        let container = format!("c-{i}-{attempt}");
        let add = fx.invocation("ADD", config, &pod, &container).with_env("NODENAME", &node).run().await;
        if add.success {
            if add.stderr.contains("not recorded") {
                eprintln!("{pod}: {}", add.stderr);
            }
            return (add.ips()[0], attempt);
        }
        eprintln!("{pod} try {attempt}: {}", add.stdout.trim());
        // the runtime tears the failed sandbox down before it retries; a DEL that fails is retried later too
        for _ in 0..TRIES {
            let del = fx.invocation("DEL", config, &pod, &container).with_env("NODENAME", &node).run().await;
            if del.success {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("{pod}: no address after {TRIES} tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_adds_across_an_apiserver_restart_never_share_an_address_or_leave_a_claim() {
    let fx = Arc::new(CniFixture::on(TestCluster::own(module_path!()), "iaas-restart").await);
    let provider = Arc::new(ReferenceProvider::start(ProviderOptions::default()).await);
    let section = json!({"url": provider.url(), "ca_file": provider.ca_file(), "parent_interface": "lo",
        "http_request_timeout": "20s"});
    let config = Arc::new(fx.netconf(
        "1.0.0",
        "iaas",
        json!({"ipRanges": [{"range": "198.18.104.0/28", "node_name": "node-0"}, {"range": "198.18.105.0/26"}],
               "iaas_provider": section, "timeout_seconds": 30}),
    ));
    let pools: Api<IpPool> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let warm = IpRange::parse("198.18.104.0/28", None, None, &[]).unwrap();
    provider.prewarm(&pools, "198.18.104.0-28", &warm, "node-0", 6).await.unwrap();

    let done = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(AT_ONCE));
    let mut adds = tokio::task::JoinSet::new();
    for i in 0..PODS {
        let (fx, config, done, gate) = (fx.clone(), config.clone(), done.clone(), gate.clone());
        adds.spawn(async move {
            let _slot = gate.acquire_owned().await.unwrap();
            let got = attach(&fx, &config, i).await;
            done.fetch_add(1, Ordering::Relaxed);
            (i, got)
        });
    }
    wait::until(Duration::from_secs(300), "a third of the burst", || async {
        (done.load(Ordering::Relaxed) >= PODS / 3).then_some(())
    })
    .await
    .unwrap();
    let down = fx.cluster.restart_apiserver().await;
    let mut attached: BTreeMap<usize, IpAddr> = BTreeMap::new();
    let (mut retried_pods, mut failed_tries) = (0, 0);
    while let Some(joined) = adds.join_next().await {
        let (i, (ip, failed)) = joined.unwrap();
        retried_pods += usize::from(failed > 0);
        failed_tries += failed;
        attached.insert(i, ip);
    }
    eprintln!(
        "API server down {} ms; {retried_pods} of {PODS} pods needed a retry ({failed_tries} failed tries); {} provider calls",
        down.as_millis(),
        provider.allocate_calls()
    );

    let mut by_ip: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for (i, ip) in &attached {
        if let Some(other) = by_ip.insert(*ip, *i) {
            panic!("{ip} handed to pod-{other} and pod-{i}");
        }
    }
    let podref = |i: usize| format!("{}/pod-{i}", fx.ns);
    let enis = provider.sub_enis();
    let mut entries = 0;
    for (name, cidr) in [("198.18.104.0-28", "198.18.104.0/28"), ("198.18.105.0-26", "198.18.105.0/26")] {
        let range = IpRange::parse(cidr, None, None, &[]).unwrap();
        let pool = fx.pool(name).await;
        for (offset, entry) in &pool.spec.allocations {
            entries += 1;
            let ip = range.addr_at(offset.parse().unwrap());
            let i = *by_ip.get(&ip).unwrap_or_else(|| panic!("{ip} is claimed by {entry:?}, which no pod got"));
            assert_eq!(entry.podref, podref(i), "{ip}");
            let node = format!("node-{}", i % NODES);
            if name.starts_with("198.18.104") {
                assert_eq!(node, "node-0", "{ip}: only node-0 takes from its warm pool");
            }
            let record = &pool.spec.sub_interfaces[offset];
            assert_eq!((record.node.as_str(), record.vlan != -1), (node.as_str(), true), "{ip}: {record:?}");
            let eni = enis.get(&ip.to_string()).unwrap_or_else(|| panic!("{ip}: no sub-interface in the cloud"));
            assert_eq!(eni.node, node, "{ip}: the cloud has it on {}", eni.node);
        }
    }
    assert_eq!(entries, PODS, "one entry per pod, none left by a failed try");
    let reservations = fx.reservations().await;
    assert_eq!(reservations.len(), PODS, "one reservation per pod");
    for r in &reservations {
        let ip: IpAddr = r.metadata.name.as_deref().unwrap().parse().unwrap();
        assert_eq!(Some(&r.spec.podref), by_ip.get(&ip).map(|i| podref(*i)).as_ref(), "reservation {ip}");
    }
}
