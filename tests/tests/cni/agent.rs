//! The node agent (`hereabouts-reconciler agent`): the binary hands it each invocation on its socket and prints
//! its answer, and does the work itself whenever no agent answers — absent, crashed, silent, or killed mid-burst.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use futures::stream;
use hereabouts_tests::agent::Agent;
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::plugin::Invocation;
use serde_json::json;

async fn agent_of(fx: &CniFixture, name: &str) -> Agent {
    Agent::start(&fx.cluster.dir().join(format!("{}-{name}.sock", fx.ns)), "node-a").await
}

/// `inv` on node-a, handed to the agent at `socket`.
fn via(inv: Invocation, socket: &Path) -> Invocation {
    inv.with_env("NODENAME", "node-a").with_env("HEREABOUTS_AGENT_SOCKET", socket.to_str().unwrap())
}

/// The invocations of `container` the agent says it served.
fn served(agent: &Agent, command: &str, container: &str) -> usize {
    let logs = agent.logs();
    logs.lines()
        .filter(|l| l.contains("served") && l.contains(command) && l.contains(&format!("={container} ")))
        .count()
}

#[tokio::test]
async fn add_check_and_del_are_served_by_the_agent_as_the_binary_serves_them() {
    let fx = CniFixture::new("agent-verbs").await;
    let agent = agent_of(&fx, "verbs").await;
    let config = fx.netconf("1.1.0", "agnet", json!({"range": "198.18.120.0/29"}));
    let add = via(fx.invocation("ADD", &config, "p1", "c1"), &agent.socket).run().await;
    assert!(add.success, "{}\n{}", add.stdout, add.stderr);
    assert_eq!(served(&agent, "ADD", "c1"), 1, "{}", agent.logs());
    // the binary on its own, beside the agent, on the same pool
    let direct = fx.invocation("ADD", &config, "p2", "c2").with_env("NODENAME", "node-a").run().await;
    assert!(direct.success && direct.ips() != add.ips(), "{} / {}", direct.stdout, add.stdout);
    assert_eq!(served(&agent, "ADD", "c2"), 0);
    // a retried ADD through the agent gets its address back; CHECK finds it
    let again = via(fx.invocation("ADD", &config, "p1", "c1"), &agent.socket).run().await;
    assert_eq!(again.ips(), add.ips(), "{}", again.stdout);
    let check = via(fx.invocation("CHECK", &config, "p1", "c1"), &agent.socket).run().await;
    assert!(check.success, "{}", check.stdout);

    // a mistake in the config: the agent's answer is the binary's, and nothing is written
    let bad = fx.netconf("1.1.0", "agnet", json!({"range": "198.18.120.0/29", "exclude": ["not-a-cidr"]}));
    let before = fx.object_count().await;
    let from_agent = via(fx.invocation("ADD", &bad, "p3", "c3"), &agent.socket).run().await;
    let from_binary = fx.invocation("ADD", &bad, "p3", "c3").with_env("NODENAME", "node-a").run().await;
    assert_eq!(from_agent.error_code(), 7, "{}", from_agent.stdout);
    assert_eq!(from_agent.stdout, from_binary.stdout);
    assert_eq!(served(&agent, "ADD", "c3"), 1, "the agent answered it");
    assert_eq!(fx.object_count().await, before, "nothing written");

    let del = via(fx.invocation("DEL", &config, "p1", "c1"), &agent.socket).run().await;
    assert!(del.success, "{}", del.stdout);
    assert_eq!(served(&agent, "DEL", "c1"), 1);
    // and counts them: ADD c1 twice and CHECK ok, ADD c3 failed, DEL ok
    assert_eq!(agent.get("/readyz").as_deref(), Some("ok"));
    let metrics = agent.get("/metrics").unwrap_or_default();
    for line in [
        r#"hereabouts_agent_invocations_total{command="ADD",outcome="ok"} 2"#,
        r#"hereabouts_agent_invocations_total{command="ADD",outcome="failed"} 1"#,
        r#"hereabouts_agent_invocations_total{command="CHECK",outcome="ok"} 1"#,
        r#"hereabouts_agent_invocations_total{command="DEL",outcome="ok"} 1"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
    let pool = fx.pool("198.18.120.0-29").await;
    let owners: Vec<&str> = pool.spec.allocations.values().map(|a| a.podref.as_str()).collect();
    assert_eq!(owners, [format!("{}/p2", fx.ns)], "p1's address given back, p2's kept");
}

#[tokio::test]
async fn the_binary_does_the_work_when_no_agent_answers() {
    let fx = CniFixture::new("agent-gone").await;
    let config = fx.netconf("1.1.0", "agone", json!({"range": "198.18.121.0/28"}));
    let dir = fx.cluster.dir().join(format!("{}-sockets", fx.ns));
    std::fs::create_dir_all(&dir).unwrap();

    // no socket at all
    let out = via(fx.invocation("ADD", &config, "p1", "c1"), &dir.join("none.sock")).run().await;
    assert!(out.success && !out.stderr.contains("done here instead"), "{}\n{}", out.stdout, out.stderr);

    // the socket of an agent that crashed
    let mut agent = agent_of(&fx, "crashed").await;
    agent.kill();
    assert!(agent.socket.exists(), "a crash leaves the socket file");
    let out = via(fx.invocation("ADD", &config, "p2", "c2"), &agent.socket).run().await;
    assert!(out.success, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("done here instead"), "{}", out.stderr);

    // a peer that takes the connection and never says a word: the binary waits only for the acceptance
    let silent = dir.join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&silent).unwrap();
    let held = std::thread::spawn(move || listener.accept().map(|(stream, _)| stream));
    let started = Instant::now();
    let out = via(fx.invocation("ADD", &config, "p3", "c3"), &silent).run().await;
    assert!(out.success, "{}\n{}", out.stdout, out.stderr);
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    drop(held.join());

    let ips: BTreeSet<IpAddr> = fx
        .pools()
        .await
        .iter()
        .flat_map(|p| p.spec.allocations.keys().cloned())
        .map(|k| format!("198.18.121.{k}").parse().unwrap())
        .collect();
    assert_eq!(ips.len(), 3, "three pods, three addresses");
}

/// An agent killed while it serves a burst (a crash, an OOM kill, a DaemonSet pod replaced): every ADD still
/// succeeds — those it was serving are done again by their binaries, the later ones by the binary at once — and
/// no address is held twice or by a pod twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_burst_fails_no_add_and_gives_no_address_twice() {
    let fx = CniFixture::new("agent-kill").await;
    let mut agent = agent_of(&fx, "burst").await;
    let socket = agent.socket.clone();
    let config = fx.netconf("1.1.0", "akill", json!({"range": "198.18.122.0/24", "node_slice_size": "/28"}));
    let pods: Vec<String> = (0..48).map(|i| format!("p{i}")).collect();
    let burst = stream::iter(pods.iter().map(|pod| {
        let inv = via(fx.invocation("ADD", &config, pod, &format!("c-{pod}")), &socket);
        async move { inv.run().await }
    }))
    .buffered(16)
    .collect::<Vec<_>>();
    let killer = async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while agent.logs().lines().filter(|l| l.contains("served")).count() < 12 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        agent.kill();
    };
    let (outputs, ()) = futures::join!(burst, killer);
    let mut ips = BTreeSet::new();
    for (out, pod) in outputs.iter().zip(&pods) {
        assert!(out.success, "{pod}: {}\n{}", out.stdout, out.stderr);
        assert!(ips.insert(out.ips()[0]), "{pod} got an address already given: {}", out.stdout);
    }
    let served = agent.logs().lines().filter(|l| l.contains("served")).count();
    assert!((12..48).contains(&served), "killed mid-burst: {served} served by the agent");
    let pools = fx.pools().await;
    let mut holders: Vec<String> =
        pools.iter().flat_map(|p| p.spec.allocations.values().map(|a| a.podref.clone())).collect();
    holders.sort();
    let expected: Vec<String> = {
        let mut all: Vec<String> = pods.iter().map(|p| format!("{}/{p}", fx.ns)).collect();
        all.sort();
        all
    };
    assert_eq!(holders, expected, "one entry per pod, none left by the agent's half-done ADDs");
    eprintln!("agent killed after {served} of 48 ADDs; the binary did the rest");
}

/// Thirty-two first ADDs at once through one agent against the real API server: their writes of the node's slice
/// pool go in fewer PATCHes than ADDs (group commit). Then sixteen more while a proxy loses the answers of the next
/// two pool PATCHes (applied, never answered): each write of a batch whose answer was lost is read back by its
/// ADD. Every pod has one address of its own, one entry and one reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_through_the_agent_share_patches_and_read_back_a_lost_one() {
    use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
    let fx = CniFixture::new("agent-batch").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let kubeconfig = proxy.kubeconfig(fx.cluster, hereabouts_tests::Identity::Cni, &fx.ns);
    let config = hereabouts_tests::plugin::netconf(
        "1.1.0",
        "abatch",
        &kubeconfig,
        json!({"range": "198.18.123.0/24", "node_slice_size": "/26"}),
    );
    let agent = agent_of(&fx, "batch").await;
    let burst = |pods: Vec<String>| {
        let (fx, config, socket) = (&fx, &config, agent.socket.clone());
        stream::iter(pods.into_iter().map(move |pod| {
            let inv = via(fx.invocation("ADD", config, &pod, &format!("c-{pod}")), &socket);
            async move { inv.run().await }
        }))
        .buffer_unordered(32)
        .collect::<Vec<_>>()
    };
    let first: Vec<String> = (0..32).map(|i| format!("p{i}")).collect();
    let mut outputs = burst(first.clone()).await;
    let patches = proxy.seen().iter().filter(|s| s.is(Verb::Patch, "ippools")).count();
    assert!(patches < 32, "32 ADDs' entries went in {patches} pool PATCHes: none shared");
    let gets = proxy.seen().iter().filter(|s| s.is(Verb::Get, "ippools")).count();
    eprintln!("32 ADDs through the agent: {patches} pool PATCHes, {gets} pool GETs, {} requests", proxy.seen().len());

    proxy.add_rule(Rule { times: 2, ..Rule::nth(Verb::Patch, "ippools", 1, Action::DropResponse) });
    let second: Vec<String> = (32..48).map(|i| format!("p{i}")).collect();
    outputs.extend(burst(second.clone()).await);
    let seen = proxy.seen();
    let dropped =
        seen.iter().filter(|s| s.is(Verb::Patch, "ippools") && s.action == Some(Action::DropResponse)).count();
    assert_eq!(dropped, 2, "two pool PATCH answers lost: {seen:?}");

    let mut ips: BTreeSet<IpAddr> = BTreeSet::new();
    for out in &outputs {
        assert!(out.success, "{}\n{}", out.stdout, out.stderr);
        assert!(ips.insert(out.ips()[0]), "an address given twice: {}", out.stdout);
    }
    let served = agent.logs().lines().filter(|l| l.contains("served") && l.contains("ADD")).count();
    assert_eq!(served, 48, "every ADD served by the agent:\n{}", agent.logs());
    let pools = fx.pools().await;
    let mut holders: Vec<String> =
        pools.iter().flat_map(|p| p.spec.allocations.values().map(|a| a.podref.clone())).collect();
    holders.sort();
    let mut expected: Vec<String> = first.iter().chain(&second).map(|p| format!("{}/{p}", fx.ns)).collect();
    expected.sort();
    assert_eq!(holders, expected, "one entry per pod");
    let reserved: BTreeSet<String> = fx.reservations().await.iter().map(|r| r.spec.podref.clone()).collect();
    assert_eq!(reserved, expected.into_iter().collect(), "one reservation per pod");
}

/// The agent's copies are hints. node-a's agent last saw a slice as its own with an empty pool (its pod gone), and
/// its watch then stalls (a proxy holds every watch request: the copies stay as they were). The NodeSlicePool is
/// lost and re-created by node-b, which claims that slice for an address it asks for. A new pod's first ADD
/// through node-a's agent plans on the copies and writes into node-a's pool of that slice: the first entry of an
/// empty pool is followed by a read of the slice's owner, so node-a gives it back and takes its other slice.
/// Without reservations nothing else would keep the two nodes from handing out one slice.
#[tokio::test]
async fn an_entry_planned_on_a_stale_copy_in_a_slice_that_changed_hands_is_given_back() {
    use hereabouts_ipam::crd::NodeSlicePool;
    use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
    use kube::api::{Api, DeleteParams};
    let fx = CniFixture::new("agent-hands").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    for resource in ["ippools", "nodeslicepools"] {
        proxy.add_rule(Rule { times: 1000, ..Rule::nth(Verb::Watch, resource, 1, Action::Hold) });
    }
    let kubeconfig = proxy.kubeconfig(fx.cluster, hereabouts_tests::Identity::Cni, &fx.ns);
    let agent = agent_of(&fx, "hands").await;
    let ipam = json!({"range": "198.18.124.0/29", "node_slice_size": "/30", "enable_overlapping_ranges": false});
    let config = hereabouts_tests::plugin::netconf("1.1.0", "hands", &kubeconfig, ipam);
    let first = via(fx.invocation("ADD", &config, "p1", "c1"), &agent.socket).run().await;
    assert!(first.success, "{}\n{}", first.stdout, first.stderr);
    let taken = first.ips()[0];
    let slice_of = |ip: IpAddr| -> ipnet::IpNet { ipnet::IpNet::new(ip, 30).unwrap().trunc() };
    let del = via(fx.invocation("DEL", &config, "p1", "c1"), &agent.socket).run().await;
    assert!(del.success, "{}", del.stdout);

    let slices = Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns);
    slices.delete("hands", &DeleteParams::default()).await.unwrap();
    let IpAddr::V4(v4) = taken else { unreachable!() };
    let wanted = IpAddr::V4((u32::from(v4) + 1).into());
    let mut on_b = fx.invocation("ADD", &config, "p2", "c2").with_env("NODENAME", "node-b");
    on_b.args.push_str(&format!(";IP={wanted}"));
    let b = on_b.run().await;
    assert_eq!(b.ips(), [wanted], "node-b re-created the NodeSlicePool and claimed the slice: {}", b.stdout);

    let third = via(fx.invocation("ADD", &config, "p3", "c3"), &agent.socket).run().await;
    assert!(third.success, "{}\n{}", third.stdout, third.stderr);
    assert_ne!(slice_of(third.ips()[0]), slice_of(taken), "node-a took an address of node-b's slice: {}", third.stdout);
    let pools = fx.pools().await;
    let holding: Vec<&str> = pools
        .iter()
        .filter(|p| p.spec.range.parse::<ipnet::IpNet>().is_ok_and(|r| r.trunc() == slice_of(taken)))
        .filter(|p| !p.spec.allocations.is_empty())
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    assert_eq!(holding.len(), 1, "one node's pool of the slice holds entries: {holding:?}");
    assert!(holding[0].contains("node-b"), "{holding:?}");
    assert!(agent.logs().contains("changed hands"), "the agent gave its entry back:\n{}", agent.logs());
}

/// The agent's copies are fed by a watch. An agent that follows the network's kubeconfig from its start (as the
/// chart's follows install-cni's) lists node-a's slice pool and the NodeSlicePool before it serves; an entry
/// another process writes afterwards reaches its copy through the watch; a new pod's first ADD through it then
/// reads nothing: one reservation POST and one pool PATCH, planned on the copies (a stale copy would have
/// planned the offset the other process took, and its refused write would have read the pool).
#[tokio::test]
async fn a_first_add_through_an_agent_that_follows_the_pools_reads_nothing() {
    use hereabouts_tests::faultproxy::{FaultProxy, Verb};
    let fx = CniFixture::new("agent-follow").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let kubeconfig = proxy.kubeconfig(fx.cluster, hereabouts_tests::Identity::Cni, &fx.ns);
    let ipam = json!({"range": "198.18.125.0/24", "node_slice_size": "/26"});
    let config = hereabouts_tests::plugin::netconf("1.1.0", "follow", &kubeconfig, ipam);
    let on_a = |pod: &str| fx.invocation("ADD", &config, pod, &format!("c-{pod}")).with_env("NODENAME", "node-a");
    let mut ips = BTreeSet::new();
    let first = on_a("p0").run().await;
    assert!(first.success, "{}\n{}", first.stdout, first.stderr);
    ips.insert(first.ips()[0]);

    let socket = fx.cluster.dir().join(format!("{}-follow.sock", fx.ns));
    let agent = Agent::start_following(&socket, "node-a", &kubeconfig).await;
    assert!(agent.logs().contains("listed=true"), "it listed before serving:\n{}", agent.logs());
    let copies = || agent.get("/metrics").and_then(|m| metric(&m, "hereabouts_agent_copies_total"));
    let listed = copies().expect("the agent's metrics");
    assert_eq!(listed, 2, "the node's slice pool and the NodeSlicePool");
    let second = on_a("p1").run().await;
    assert!(second.success, "{}\n{}", second.stdout, second.stderr);
    ips.insert(second.ips()[0]);
    let watched = hereabouts_tests::wait::until(Duration::from_secs(20), "the watch to copy p1's entry", || async {
        copies().filter(|n| *n > listed).map(|_| ())
    })
    .await;
    assert!(watched.is_ok(), "the watch copied the pool p1 changed:\n{}", agent.logs());

    let before = proxy.seen().len();
    let third = via(fx.invocation("ADD", &config, "p2", "c-p2"), &agent.socket).run().await;
    assert!(third.success, "{}\n{}", third.stdout, third.stderr);
    assert!(ips.insert(third.ips()[0]), "an address given twice: {}", third.stdout);
    assert_eq!(served(&agent, "ADD", "c-p2"), 1, "the agent served it:\n{}", agent.logs());
    let path: Vec<String> = proxy.seen()[before..]
        .iter()
        .filter(|s| !matches!(s.request.verb, Verb::Watch | Verb::List))
        .map(|s| format!("{:?} {}", s.request.verb, s.request.resource))
        .collect();
    assert_eq!(
        path,
        ["Create overlappingrangeipreservations", "Patch ippools"],
        "the first ADD's requests: no read of the pool or the NodeSlicePool"
    );
    let pools = fx.pools().await;
    let entries: usize = pools.iter().map(|p| p.spec.allocations.len()).sum();
    assert_eq!(entries, 3, "one entry per pod");
}

/// The value of the sample `name` (no labels) in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok().map(|v| v as u64))
}

/// A network of slice mode: the agent (with its own identity, allowed to watch NetworkAttachmentDefinitions) claims
/// its node's slice and makes the slice's pool as the definition appears, with the CNI's identity, so the node's
/// first ADD writes its entry and its reservation only. Claims ahead stop once half of the range is claimed: of four
/// nodes on four slices, three claim ahead, and the fourth's first ADD claims the last.
#[tokio::test]
async fn the_agent_claims_its_nodes_slice_as_the_network_appears() {
    use hereabouts_ipam::crd::NodeSlicePool;
    use hereabouts_tests::{Identity, runtime, wait};
    // names no other test's agents use (theirs claim nothing ahead either)
    const NODES: [&str; 4] = ["ahead-a", "ahead-b", "ahead-c", "ahead-d"];
    let fx = CniFixture::new("agent-ahead").await;
    let crd = runtime::nad_crd_path().expect("the NetworkAttachmentDefinition CRD is missing: run hack/testenv.sh");
    runtime::install_nad_crd(&fx.admin, &crd).await.unwrap();
    let own = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let mut agents = Vec::new();
    for node in NODES {
        let socket = fx.cluster.dir().join(format!("{}-ahead-{node}.sock", fx.ns));
        agents.push(Agent::start_claiming_ahead(&socket, node, &[("KUBECONFIG", own.as_path())]).await);
    }
    let logs = || agents.iter().map(|a| a.logs()).collect::<Vec<_>>().join("\n---\n");
    let config = fx.netconf("1.0.0", "ahead", json!({"range": "198.18.121.0/26", "node_slice_size": "/28"}));
    runtime::create_nad(&fx.admin, &fx.ns, "ahead", &config).await.unwrap();

    let listing = kube::Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &fx.ns);
    let owners = || async {
        let pool = listing.get_opt("ahead").await.unwrap()?;
        Some(pool.status?.allocations.into_iter().map(|s| (s.node_name, s.slice_range)).collect::<Vec<_>>())
    };
    let held = wait::until(Duration::from_secs(30), "three nodes' slices claimed ahead", || async {
        let owners = owners().await?;
        (owners.iter().filter(|(node, _)| !node.is_empty()).count() == 3).then_some(owners)
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", logs()));
    // the fourth agent saw a quarter of the range free, and claims nothing (it logs that at debug level only)
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(owners().await.as_ref(), Some(&held), "{}", logs());
    let claimed: BTreeSet<&str> = held.iter().map(|(node, _)| node.as_str()).filter(|n| !n.is_empty()).collect();
    assert_eq!(claimed.len(), 3, "one slice each: {held:?}");
    // the slices' pools are made, empty; no reservation is written ahead
    let pools = fx.pools().await;
    assert_eq!(pools.len(), 3, "{pools:#?}");
    assert!(pools.iter().all(|p| p.spec.allocations.is_empty()), "{pools:#?}");
    assert!(fx.reservations().await.is_empty());

    // a node's first ADD writes into its slice and claims nothing
    let (index, node) = NODES.iter().enumerate().find(|(_, n)| claimed.contains(*n)).unwrap();
    let slice: ipnet::IpNet = held.iter().find(|(n, _)| n == node).unwrap().1.parse().unwrap();
    let before = listing.get("ahead").await.unwrap().metadata.resource_version;
    let on = |inv: Invocation, i: usize| {
        inv.with_env("NODENAME", NODES[i]).with_env("HEREABOUTS_AGENT_SOCKET", agents[i].socket.to_str().unwrap())
    };
    let add = on(fx.invocation("ADD", &config, "p1", "c1"), index).run().await;
    assert!(add.success, "{}\n{}", add.stdout, add.stderr);
    assert!(add.ips().iter().all(|ip| slice.contains(ip)), "{:?} in {node}'s slice {slice}", add.ips());
    assert_eq!(listing.get("ahead").await.unwrap().metadata.resource_version, before, "no claim on the ADD's path");
    assert_eq!(served(&agents[index], "ADD", "c1"), 1, "{}", logs());
    // the fourth node's first ADD claims the last slice
    let last = NODES.iter().position(|n| !claimed.contains(n)).unwrap();
    let add = on(fx.invocation("ADD", &config, "p2", "c2"), last).run().await;
    assert!(add.success, "{}\n{}", add.stdout, add.stderr);
    let owners = owners().await.unwrap();
    assert!(owners.iter().all(|(node, _)| !node.is_empty()), "every slice claimed: {owners:?}");
}
