//! Killing and restarting the test kube-apiserver (same flags, same port, same etcd), as the fault campaign
//! does. On a control plane of its own: a restart stops the control plane of every test using it.

use std::path::Path;

use hereabouts_ipam::crd::IpPool;
use hereabouts_tests::faultproxy::{FaultProxy, Verb};
use hereabouts_tests::objects::mk_pool;
use hereabouts_tests::{Identity, TestCluster};
use kube::api::{Api, PostParams};

/// Asserts that `result` failed without an answer from the server.
fn assert_unanswered<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(status)) => panic!("{what}: the stopped API server answered {status:?}"),
        Err(e) => eprintln!("{what} while the API server is down: {e}"),
        Ok(value) => panic!("{what}: the stopped API server answered {value:?}"),
    }
}

/// Checks that `kube-apiserver.pid` names `pid` and that `pid` is a live kube-apiserver.
fn assert_live_apiserver(cluster: &TestCluster, pid: u32) {
    let recorded = std::fs::read_to_string(cluster.dir().join("kube-apiserver.pid")).unwrap();
    assert_eq!(recorded.trim(), pid.to_string(), "kube-apiserver.pid names the running process");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the apiserver process is alive");
    assert!(String::from_utf8_lossy(&cmdline).contains("kube-apiserver"), "pid {pid} is not kube-apiserver");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apiserver_restarts_on_its_port_with_its_data() {
    let cluster = TestCluster::own(module_path!());
    let ns = cluster.namespace("restart").await;
    let pools: Api<IpPool> = Api::namespaced(cluster.admin().await, &ns);
    let before = pools.create(&PostParams::default(), &mk_pool("before", "198.18.50.0/24").build()).await.unwrap();
    let proxy = FaultProxy::start(cluster).await;
    let via: Api<IpPool> = Api::namespaced(proxy.client(cluster, Identity::Admin).await, &ns);
    via.get("before").await.expect("through the proxy, before the restart");
    let first = cluster.apiserver_pid().expect("the API server runs");
    assert_live_apiserver(cluster, first);

    cluster.kill_apiserver();
    assert_eq!(cluster.apiserver_pid(), None);
    assert!(!Path::new(&format!("/proc/{first}")).exists(), "the killed API server is gone");
    assert_unanswered("a direct get", pools.get("before").await);
    assert_unanswered("a get through the proxy", via.get("before").await);

    cluster.start_apiserver().await;
    let second = cluster.apiserver_pid().expect("the API server runs again");
    assert_ne!(second, first);
    assert_live_apiserver(cluster, second);
    let after = pools.get("before").await.expect("the pool survives the restart");
    assert_eq!(after.metadata.uid, before.metadata.uid);
    via.get("before").await.expect("through the proxy, after the restart");
    let failed = proxy.seen().into_iter().filter(|s| s.is(Verb::Get, "ippools") && s.error.is_some()).count();
    assert_eq!(failed, 1, "the proxy recorded the get it could not forward: {:#?}", proxy.seen());

    let downtime = cluster.restart_apiserver().await;
    eprintln!("kube-apiserver restart: down for {:.1} s", downtime.as_secs_f64());
    let third = cluster.apiserver_pid().expect("the API server runs again");
    assert_ne!(third, second);
    assert_live_apiserver(cluster, third);
    pools.create(&PostParams::default(), &mk_pool("after", "198.18.51.0/24").build()).await.expect("writes work");
    let names: Vec<String> =
        pools.list(&Default::default()).await.unwrap().items.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, vec!["after".to_string(), "before".to_string()]);
}
