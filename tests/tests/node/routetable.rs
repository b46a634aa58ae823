//! The routing-table datastore (`"datastore": "routetable"`) and the Kubernetes mode's `announce_routes`, with the
//! compiled plugin in simulated nodes' namespaces and real routing daemons: BIRD 2 on every node, full-mesh eBGP
//! over the fabric, running `deploy/bird/hereabouts.conf` unchanged ([`RoutedFabric`]).
//!
//! Collisions are forced, not hoped for: with the fabric held (no BGP message gets through while the sessions stay
//! established, as on a congested network), claims made on different nodes cannot see each other until it is
//! released inside the propagation wait.
//!
//! The readiness gate is proven against what breaks a session for real: `birdc disable`/`enable`, BIRD killed
//! (SIGKILL) and restarted, ADDs fired while BIRD has not converged; in each, the ADD answers 11 while a peer is
//! not ready and no address is ever held twice. The reconciler's claim checker is shown a conflict made by hand.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hereabouts_tests::bird::{KernelRoute, NODE_FLAT_FILE, RoutedFabric, fabric_v4, fabric_v6};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::objects::mk_pod;
use hereabouts_tests::plugin::{Invocation, Output};
use hereabouts_tests::reconciler::{PodFixture, Reconciler, ReconcilerOptions};
use hereabouts_tests::runtime::{CniRuntime, PodRef, result_ips};
use hereabouts_tests::{netns, wait};
use serde_json::{Value, json};

const PROTO: u8 = 192;
const BIRD_PROTO: u8 = 12;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i}")).collect()
}

fn root() {
    assert!(netns::is_root(), "the routing-table tests make network namespaces and run BIRD: run them as root");
}

/// A routing-table network, `extra` over the ipam keys; where its routes and records go is each node's own flat
/// file's say ([`RoutedFabric::node_file`]).
fn netconf(name: &str, extra: Value) -> Value {
    let mut ipam = json!({
        "type": "hereabouts",
        "datastore": "routetable",
        "log_level": "debug",
    });
    ipam.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    json!({"cniVersion": "1.0.0", "name": name, "type": "macvlan", "master": "fab0", "ipam": ipam})
}

/// One invocation of the plugin in node `n`'s namespace.
fn on(rf: &RoutedFabric, n: usize, command: &'static str, config: &Value, container: &str) -> Invocation {
    Invocation::new(command, config, "default", &format!("pod-{container}"), container)
        .in_netns(&rf.fabric.nodes[n].netns.name)
}

/// The `collisions=N` of a successful ADD's log line.
fn collisions(out: &Output) -> u32 {
    let line =
        out.stderr.lines().find(|l| l.contains("ADD done")).unwrap_or_else(|| panic!("no ADD done: {}", out.stderr));
    let n = line.split("collisions=").nth(1).and_then(|r| r.split_whitespace().next()).expect("collisions=");
    n.parse().unwrap()
}

/// The plugin's routes on each node, address -> (node, metric).
fn claims(rf: &RoutedFabric, nodes: usize) -> BTreeMap<IpAddr, Vec<(usize, u32)>> {
    let mut out: BTreeMap<IpAddr, Vec<(usize, u32)>> = BTreeMap::new();
    for n in 0..nodes {
        for r in rf.host_routes(n, "main").into_iter().filter(|r| r.protocol == PROTO) {
            out.entry(r.dst).or_default().push((n, r.metric));
        }
    }
    out
}

/// Waits until node `n`'s plugin answers STATUS with success: every BGP session of its BIRD established and
/// settled. Returns how long it took.
async fn ready(rf: &RoutedFabric, n: usize) -> Duration {
    let config = netconf("ready", json!({"range": "198.19.254.0/30"}));
    let t0 = Instant::now();
    let mut last = None;
    while t0.elapsed() < Duration::from_secs(60) {
        let out = on(rf, n, "STATUS", &config, "").run().await;
        if out.success {
            return t0.elapsed();
        }
        last = Some(out);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("node-{n} not ready after 60 s: {last:?}\n{}", rf.birds[n].log());
}

/// Every node ready ([`ready`]).
async fn all_ready(rf: &RoutedFabric) {
    for n in 0..rf.birds.len() {
        ready(rf, n).await;
    }
}

/// The number of records node `n` keeps for network `name`.
fn records(rf: &RoutedFabric, n: usize, name: &str) -> usize {
    std::fs::read_dir(rf.state_dir(n).join(name)).map_or(0, Iterator::count)
}

/// Every node has the claim of `holder` on `ip` as its own or learned from `holder` (metric + 1, via `holder`).
fn everyone_sees(routes: &[KernelRoute], n: usize, ip: IpAddr, holder: usize, metric: u32) -> bool {
    if n == holder {
        return routes.iter().any(|r| r.dst == ip && r.protocol == PROTO && r.metric == metric);
    }
    let via = if ip.is_ipv4() { fabric_v4(holder) } else { fabric_v6(holder) };
    routes.iter().any(|r| {
        r.dst == ip && r.protocol == BIRD_PROTO && r.metric == metric + 1 && r.gateway == Some(via.parse().unwrap())
    })
}

/// ADD on node a through the runtime path (cnitool, macvlan) installs host routes that nodes b and c learn with
/// the claim's metric; pods on two nodes reach each other; DEL withdraws the routes everywhere. IPv4 and IPv6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_is_learned_by_every_node_and_withdrawn_everywhere_on_del() {
    root();
    let rf = RoutedFabric::new(&names(3), None).unwrap();
    // one runtime per node (cnitool's cache); the records are where each node's flat file says
    let runtimes: Vec<CniRuntime> = (0..2).map(|_| CniRuntime::new().unwrap()).collect();
    all_ready(&rf).await;
    for rt in &runtimes {
        let ipam = json!({"type": "hereabouts", "datastore": "routetable", "range": "198.19.1.0/28",
            "ipRanges": [{"range": "2001:db8:1::/120"}], "log_file": rt.log_file("rt")});
        rt.write_conflist("rt", vec![json!({"type": "macvlan", "master": "fab0", "mode": "bridge", "ipam": ipam})])
            .unwrap();
    }
    let who = |name: &str| PodRef { namespace: "default".into(), name: name.into(), uid: format!("uid-{name}") };
    let pod_a = rf.fabric.pod_netns("a").unwrap();
    let pod_b = rf.fabric.pod_netns("b").unwrap();

    let a = result_ips(&runtimes[0].add(&rf.fabric.nodes[0], "rt", &pod_a, &who("a")).unwrap());
    assert_eq!(a.len(), 2, "one address per range: {a:?}");
    let local = rf.host_routes(0, "main");
    let metric_of = |ip: IpAddr| {
        let r = local.iter().find(|r| r.dst == ip && r.protocol == PROTO).unwrap_or_else(|| panic!("{ip}: {local:?}"));
        assert_eq!(r.metric % 2, 0, "a local claim's metric is even");
        assert_eq!(r.gateway, None);
        r.metric
    };
    let metrics: Vec<u32> = a.iter().map(|ip| metric_of(*ip)).collect();
    rf.wait_routes(Duration::from_secs(10), |n, routes| {
        a.iter().zip(&metrics).all(|(ip, m)| everyone_sees(routes, n, *ip, 0, *m))
    })
    .unwrap();
    eprintln!("node-1 learned: {:?}", rf.host_routes(1, "main"));

    let b = result_ips(&runtimes[1].add(&rf.fabric.nodes[1], "rt", &pod_b, &who("b")).unwrap());
    assert!(b.iter().all(|ip| !a.contains(ip)), "{a:?} {b:?}");
    for (from, to) in [(&pod_b, a[0]), (&pod_a, b[0]), (&pod_b, a[1]), (&pod_a, b[1])] {
        assert!(netns::ping(&from.name, to, Duration::from_secs(10)).unwrap(), "{} cannot reach {to}", from.name);
    }

    runtimes[0].del(&rf.fabric.nodes[0], "rt", &pod_a, &who("a")).unwrap();
    rf.wait_routes(Duration::from_secs(10), |_, routes| routes.iter().all(|r| !a.contains(&r.dst))).unwrap();
    runtimes[1].del(&rf.fabric.nodes[1], "rt", &pod_b, &who("b")).unwrap();
    rf.wait_routes(Duration::from_secs(10), |_, routes| routes.iter().all(|r| !b.contains(&r.dst))).unwrap();
}

/// Twelve ADDs at once on three nodes into ranges of fourteen addresses, the fabric held until every first claim
/// is made: the claims collide, the later claimant withdraws and picks again, and once the routes have spread no
/// address is held twice, every node sees every claim, and DEL leaves nothing. Three rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_into_a_tiny_range_collide_and_end_with_no_address_held_twice() {
    root();
    let rf = RoutedFabric::new(&names(3), None).unwrap();
    all_ready(&rf).await;
    let config = netconf(
        "tiny",
        json!({"range": "198.19.2.0/28",
            "ipRanges": [{"range": "2001:db8:2::/124"}], "propagation_timeout_ms": 5000, "timeout_seconds": 60}),
    );
    let configs: Vec<Value> = vec![config; 3];
    let (mut forced, mut adds, mut rounds_taken) = (0u32, 0u32, Vec::new());
    for round in 0..3 {
        rf.hold();
        let mut running = Vec::new();
        for k in 0..12 {
            let n = k % 3;
            let container = format!("r{round}-{k}");
            running.push((n, container.clone(), on(&rf, n, "ADD", &configs[n], &container).start().await));
        }
        // every first claim made (12 per family) while the fabric is held; then the routes get through within the
        // wait. Released 2 s after the start at the latest, TCP's retransmission (at 3 s after a claim at the
        // latest) still reaches every node before the first re-check (5 s).
        let t0 = Instant::now();
        while claims(&rf, 3).values().map(Vec::len).sum::<usize>() < 24 && t0.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let first = claims(&rf, 3);
        let doubled = first.values().filter(|holders| holders.len() > 1).count();
        let must_withdraw: usize = first.values().map(|holders| holders.len() - 1).sum();
        rf.release();
        let mut held: BTreeMap<IpAddr, (usize, String)> = BTreeMap::new();
        let mut withdrawn = 0;
        for (n, container, run) in running {
            let out = run.wait().await;
            let ips = out.ips();
            withdrawn += collisions(&out);
            adds += 1;
            for ip in ips {
                assert!(held.insert(ip, (n, container.clone())).is_none(), "{ip} handed out twice in round {round}");
            }
        }
        assert_eq!(held.len(), 24);
        // every node sees every claim: its own, or learned from its holder with the claim's metric
        let now = claims(&rf, 3);
        for (ip, holders) in &now {
            assert_eq!(holders.len(), 1, "{ip} is claimed on several nodes after the ADDs: {holders:?}");
            assert_eq!(held.get(ip).map(|h| h.0), Some(holders[0].0), "{ip}: the route is not its holder's");
        }
        assert_eq!(now.keys().collect::<HashSet<_>>(), held.keys().collect::<HashSet<_>>());
        // of the claims made at once, the earliest (lowest metric) kept its address; claims of the same
        // millisecond both withdraw, and the address went to whoever picked it next
        for (ip, claimants) in first.iter().filter(|(_, c)| c.len() > 1) {
            let earliest = claimants.iter().min_by_key(|c| c.1).unwrap();
            if claimants.iter().filter(|c| c.1 == earliest.1).count() > 1 {
                eprintln!("{ip}: claims of the same millisecond {claimants:?}, all withdrawn");
                continue;
            }
            assert_eq!(now.get(ip), Some(&vec![*earliest]), "{ip}: claims {claimants:?}, held {:?}", now.get(ip));
        }
        rf.wait_routes(Duration::from_secs(10), |n, routes| {
            now.iter().all(|(ip, h)| everyone_sees(routes, n, *ip, h[0].0, h[0].1))
        })
        .unwrap();
        eprintln!(
            "round {round}: {doubled} addresses claimed on several nodes at once while the fabric was held, \
             {withdrawn} claims withdrawn"
        );
        assert!(withdrawn as usize >= must_withdraw, "{must_withdraw} claims had to be withdrawn, {withdrawn} were");
        forced += withdrawn;
        rounds_taken.push(doubled);

        for (ip, (n, container)) in &held {
            if ip.is_ipv4() {
                assert!(on(&rf, *n, "DEL", &configs[*n], container).run().await.success);
            }
        }
        rf.wait_routes(Duration::from_secs(10), |_, routes| routes.iter().all(|r| !held.contains_key(&r.dst))).unwrap();
        for n in 0..3 {
            assert_eq!(records(&rf, n, "tiny"), 0, "node-{n} keeps records after DEL");
        }
    }
    eprintln!(
        "routetable collisions: {adds} ADDs in 3 rounds, addresses claimed twice at once per round {rounds_taken:?}, \
         {forced} claims withdrawn by the later claimant, which then claimed another address"
    );
    assert!(forced > 0, "no collision was forced");
}

/// A requested address asked for on two nodes at once: the earlier claim keeps it, the later withdraws, waits
/// (requested_address_retry_ms) and is refused with code 101 when its budget ends, holding nothing anywhere; once
/// the holder lets go, a waiting request gets it. exclude_first/exclude_last keep the ends of the range out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requested_addresses_wait_for_their_address_and_the_exclude_counts_hold() {
    root();
    let rf = RoutedFabric::new(&names(2), None).unwrap();
    all_ready(&rf).await;
    let config = |_n: usize, extra: Value| {
        let mut base = json!({"range": "198.19.3.0/29", "propagation_timeout_ms": 3000, "timeout_seconds": 8,
            "requested_address_retry_ms": 100});
        base.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        netconf("req", base)
    };
    let wanted = ip("198.19.3.5");
    let with_ip = |n: usize, c: &str| {
        let mut inv = on(&rf, n, "ADD", &config(n, json!({})), c);
        inv.args = format!("{};IP={wanted}", inv.args);
        inv
    };
    rf.hold();
    let first = with_ip(0, "x").start().await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    let second = with_ip(1, "y").start().await;
    wait::until_every(Duration::from_secs(2), Duration::from_millis(10), "both claims to be made", || async {
        (claims(&rf, 2).get(&wanted).map_or(0, Vec::len) >= 2).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", claims(&rf, 2)));
    rf.release();
    let (first, second) = (first.wait().await, second.wait().await);
    assert_eq!(first.ips(), [wanted], "the earlier claim keeps the address");
    assert_eq!(second.error_code(), 101, "{}", second.stdout);
    assert!(second.stdout.contains("198.19.3.5"), "{}", second.stdout);
    assert!(second.stderr.contains("collision"), "the later claim met the earlier one: {}", second.stderr);
    let now = claims(&rf, 2);
    assert_eq!(now.get(&wanted), Some(&vec![(0, now[&wanted][0].1)]), "only node-0 holds it: {now:?}");
    assert_eq!(records(&rf, 1, "req"), 0, "node-1 keeps no record");

    // a request that finds its address taken waits for it
    let waiting = with_ip(1, "z").start().await;
    // time for it to find the address taken and wait (nothing outside the process shows that it does): about seven
    // of its 100 ms retries before the holder lets go
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(on(&rf, 0, "DEL", &config(0, json!({})), "x").run().await.success);
    assert_eq!(waiting.wait().await.ips(), [wanted], "the waiting request got the address once it was free");
    assert!(on(&rf, 1, "DEL", &config(1, json!({})), "z").run().await.success);

    // exclude counts: of .1-.6, only .3 and .4 are handed out
    let excl = |n: usize| config(n, json!({"exclude_first": 2, "exclude_last": 2, "propagation_timeout_ms": 100}));
    let mut got = Vec::new();
    for (k, n) in [0usize, 1].into_iter().enumerate() {
        got.extend(on(&rf, n, "ADD", &excl(n), &format!("e{k}")).run().await.ips());
    }
    got.sort();
    assert_eq!(got, [ip("198.19.3.3"), ip("198.19.3.4")]);
    rf.wait_routes(Duration::from_secs(10), |_, routes| got.iter().all(|g| routes.iter().any(|r| r.dst == *g)))
        .unwrap();
    let out = on(&rf, 0, "ADD", &excl(0), "e2").run().await;
    assert_eq!(out.error_code(), 100, "{}", out.stdout);
    assert_eq!(records(&rf, 0, "req"), 1, "the refused ADD left nothing");
}

/// CHECK passes while the attachment's route is there and fails with 102 once it is gone; GC releases what the
/// runtime no longer lists (routes withdrawn on every node) and keeps what it does; bad input changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_gc_and_bad_input_follow_the_spec() {
    root();
    let rf = RoutedFabric::new(&names(2), None).unwrap();
    all_ready(&rf).await;
    let config = netconf("cg", json!({"range": "2001:db8:4::/124", "timeout_seconds": 1}));
    let kept = on(&rf, 0, "ADD", &config, "kept").run().await.ips()[0];
    let gone = on(&rf, 0, "ADD", &config, "gone").run().await.ips()[0];
    rf.wait_routes(Duration::from_secs(10), |_, r| [kept, gone].iter().all(|a| r.iter().any(|x| x.dst == *a))).unwrap();

    let check = on(&rf, 0, "CHECK", &config, "kept").run().await;
    assert!(check.success && check.stdout.trim().is_empty(), "{} {}", check.stdout, check.stderr);
    let m = claims(&rf, 1)[&kept][0].1;
    rf.fabric.nodes[0]
        .netns
        .ip(&["-6", "route", "del", &format!("{kept}/128"), "proto", "192", "metric", &m.to_string()])
        .unwrap();
    let check = on(&rf, 0, "CHECK", &config, "kept").run().await;
    assert_eq!(check.error_code(), 102, "{}", check.stdout);
    assert!(check.stdout.contains("is gone"), "{}", check.stdout);
    assert_eq!(on(&rf, 0, "CHECK", &config, "never").run().await.error_code(), 102);
    // DEL tidies the record whose route is already gone
    assert!(on(&rf, 0, "DEL", &config, "kept").run().await.success);
    let kept = on(&rf, 0, "ADD", &config, "kept").run().await.ips()[0];

    // an ADD killed in its propagation wait (a runtime's timeout): its claim stays, so no other node takes the
    // address, until GC releases it
    let slow = netconf("cg", json!({"range": "2001:db8:4::/124", "propagation_timeout_ms": 5000}));
    let killed = on(&rf, 0, "ADD", &slow, "killed").start().await;
    let known = [kept, gone];
    let claimed = || async { claims(&rf, 1).keys().find(|ip| !known.contains(ip)).copied() };
    let orphan =
        wait::until_every(Duration::from_secs(3), Duration::from_millis(10), "the killed ADD's claim", claimed)
            .await
            .unwrap_or_else(|e| panic!("{e}: the killed ADD made no claim"));
    killed.kill().await;
    rf.wait_routes(Duration::from_secs(10), |_, r| r.iter().any(|x| x.dst == orphan)).unwrap();
    let other = netconf("cg", json!({"range": "2001:db8:4::/124"}));
    let mut elsewhere = Vec::new();
    for k in 0..11 {
        elsewhere.extend(on(&rf, 1, "ADD", &other, &format!("o{k}")).run().await.ips());
    }
    assert!(!elsewhere.contains(&orphan), "node-1 took the address of the killed ADD");
    assert_eq!(on(&rf, 1, "ADD", &other, "o11").run().await.error_code(), 100, "the range is full");
    for k in 0..11 {
        assert!(on(&rf, 1, "DEL", &other, &format!("o{k}")).run().await.success);
    }

    // GC: records younger than the ADD budget (1 s) stay; past it, what the runtime does not list goes
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut gc = config.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "kept", "ifname": "net1"}]);
    let out = on(&rf, 0, "GC", &gc, "").run().await;
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    rf.wait_routes(Duration::from_secs(10), |_, r| {
        r.iter().any(|x| x.dst == kept) && r.iter().all(|x| x.dst != gone && x.dst != orphan)
    })
    .unwrap();
    assert_eq!(on(&rf, 0, "GC", &config, "").run().await.error_code(), 7, "GC without the list is refused");

    // bad input: refused with the right code, and neither a route nor a record is made. The node keys are the
    // node's flat file's alone: a network's config that sets them (pointing the plugin at another directory,
    // socket or table of the host) is refused naming the key
    let before = (rf.host_routes(0, "main"), records(&rf, 0, "cg"));
    let node_key = "a node setting: only the node's own flat file sets it";
    let bad = [
        (json!({"range": "198.19.4.0/28", "route_device": "nope0"}), None, 7u64, node_key),
        (json!({"range": "198.19.4.0/28", "route_state_dir": "/etc"}), None, 7, node_key),
        (json!({"range": "198.19.4.0/28", "bird_socket": "/run/containerd/containerd.sock"}), None, 7, node_key),
        (json!({"range": "198.19.4.0/28", "route_table": 100}), None, 7, node_key),
        (json!({"range": "198.19.4.0/28", "configuration_path": NODE_FLAT_FILE}), None, 7, "configuration_path"),
        // addresses the host sends elsewhere already: the node's own, its DNS server, the metadata service's
        (json!({"range": "198.18.0.0/24"}), Some("198.18.0.1"), 7, "an address of this node"),
        (json!({"range": "198.19.4.0/28"}), Some("198.19.4.2"), 7, "a DNS server of this node"),
        (json!({"range": "169.254.169.0/24"}), Some("169.254.169.254"), 7, "a cloud metadata service's address"),
        (json!({"range": "198.19.4.0/28", "datastore": "etcd3"}), None, 7, "expected \"kubernetes\""),
        (json!({"range": "198.19.4.0/28", "node_slice_size": "/30"}), None, 7, "needs the API server"),
        (json!({"range": "198.19.4.0/28", "exclude_first": 10, "exclude_last": 4}), None, 7, "leave no address"),
        (json!({"range": "198.19.4.0/28", "route_protocol": 3}), None, 7, "0 to 4 are the kernel's"),
        (json!({"range": "198.19.4.0/28", "propagation_timeout_ms": "fast"}), None, 6, "propagation_timeout_ms"),
    ];
    // node-0's DNS server, as its own /etc/resolv.conf names it
    let resolv = std::path::Path::new("/etc/netns").join(&rf.fabric.nodes[0].netns.name).join("resolv.conf");
    std::fs::write(&resolv, "nameserver 198.19.4.2\n").unwrap();
    for (extra, requested, code, says) in bad {
        let config = netconf("cg", extra.clone());
        let mut inv = on(&rf, 0, "ADD", &config, "bad");
        if let Some(ip) = requested {
            inv.args = format!("{};IP={ip}", inv.args);
        }
        let out = inv.run().await;
        assert_eq!(out.error_code(), code, "{extra}: {}", out.stdout);
        let details = out.json()["details"].as_str().unwrap_or_default().to_string();
        assert!(details.contains(says), "{extra}: {details}");
    }
    let after = (rf.host_routes(0, "main"), records(&rf, 0, "cg"));
    assert_eq!(before, after);
    // and a range holding them is still used, its other addresses handed out
    let dns_range = netconf("cg", json!({"range": "198.19.4.0/30"}));
    assert_eq!(on(&rf, 0, "ADD", &dns_range, "dns").run().await.ips(), [ip("198.19.4.1")], "not .2");
    assert!(on(&rf, 0, "DEL", &dns_range, "dns").run().await.success);
}

/// The Kubernetes datastore with `announce_routes`: each allocated address gets a host route with the configured
/// protocol in the configured table, DEL removes it; with the defaults, the other node learns it through BIRD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_mode_announces_each_address_as_a_host_route() {
    root();
    let fx = CniFixture::new("announce").await;
    let port = fx.cluster.server().rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse().ok()).unwrap();
    let rf = RoutedFabric::new(&names(2), Some(port)).unwrap();
    let node0 = rf.fabric.nodes[0].netns.name.clone();
    let run = |config: &Value, verb: &'static str, pod: &str| {
        fx.invocation(verb, config, pod, &format!("c-{pod}")).with_env("NODENAME", "node-0").in_netns(&node0)
    };

    rf.node_file(0, json!({"route_table": 100, "route_protocol": 201})).unwrap();
    let custom = fx.netconf("1.0.0", "ann", json!({"range": "198.19.5.0/28", "announce_routes": true}));
    let a = run(&custom, "ADD", "a").run().await.ips();
    assert_eq!(a, [ip("198.19.5.1")], "the Kubernetes datastore allocates as ever");
    let table100 = rf.host_routes(0, "100");
    assert!(table100.iter().any(|r| r.dst == a[0] && r.protocol == 201), "{table100:?}");
    assert!(rf.host_routes(0, "main").iter().all(|r| r.dst != a[0]), "only in table 100");
    assert!(run(&custom, "DEL", "a").run().await.success);
    assert!(rf.host_routes(0, "100").iter().all(|r| r.dst != a[0]), "DEL removed the route");
    assert!(fx.pools().await.iter().all(|p| p.spec.allocations.is_empty()), "DEL released the allocation");

    // defaults (table main, protocol 192): BIRD spreads it
    rf.node_file(0, json!({})).unwrap();
    let plain = fx.netconf("1.0.0", "ann2", json!({"range": "198.19.6.0/28", "announce_routes": true}));
    let b = run(&plain, "ADD", "b").run().await.ips()[0];
    let m = claims(&rf, 1)[&b][0].1;
    rf.wait_routes(Duration::from_secs(10), |n, routes| everyone_sees(routes, n, b, 0, m)).unwrap();

    // an announcement that cannot be made fails the ADD and takes the allocation back
    rf.node_file(0, json!({"route_device": "nope0"})).unwrap();
    let broken = fx.netconf("1.0.0", "ann3", json!({"range": "198.19.7.0/28", "announce_routes": true}));
    let out = run(&broken, "ADD", "c").run().await;
    assert_eq!(out.error_code(), 7, "{}", out.stdout);
    rf.node_file(0, json!({})).unwrap();
    let pools = fx.pools().await;
    let held: Vec<_> = pools
        .iter()
        .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.contains("198.19.7.0")))
        .flat_map(|p| p.spec.allocations.keys().cloned())
        .collect();
    assert!(held.is_empty(), "the failed ADD rolled its allocation back: {held:?}");

    assert!(run(&plain, "DEL", "b").run().await.success);
    rf.wait_routes(Duration::from_secs(10), |_, routes| routes.iter().all(|r| r.dst != b)).unwrap();
}

/// The tiny network of the readiness tests: a /30, two addresses.
fn pair() -> Value {
    netconf("pair", json!({"range": "198.19.9.0/30", "propagation_timeout_ms": 200, "timeout_seconds": 5}))
}

/// Node-0 holds both addresses of [`pair`], and node-1 has learned both claims.
async fn node0_holds_the_pair(rf: &RoutedFabric) -> Vec<IpAddr> {
    let mut held = Vec::new();
    for c in ["h1", "h2"] {
        held.extend(on(rf, 0, "ADD", &pair(), c).run().await.ips());
    }
    held.sort();
    assert_eq!(held, [ip("198.19.9.1"), ip("198.19.9.2")]);
    rf.wait_routes(Duration::from_secs(10), |n, routes| {
        n == 0 || held.iter().all(|a| routes.iter().any(|r| r.dst == *a && r.protocol == BIRD_PROTO))
    })
    .unwrap();
    held
}

/// No address of [`pair`] is claimed (a route of protocol 192) on more than one node.
fn none_held_twice(rf: &RoutedFabric) {
    for (ip, holders) in claims(rf, rf.birds.len()) {
        assert_eq!(holders.len(), 1, "{ip} is claimed on several nodes: {holders:?}");
    }
}

/// An ADD on node `n` of [`pair`]: 11 while the daemon is not ready, naming what is not (`says`), with nothing
/// written; returns the output when it is not 11.
async fn add_pair(rf: &RoutedFabric, n: usize, container: &str) -> Output {
    let out = on(rf, n, "ADD", &pair(), container).run().await;
    none_held_twice(rf);
    if !out.success && out.error_code() == 11 {
        assert_eq!(records(rf, n, "pair"), if n == 0 { 2 } else { 0 }, "an ADD answered 11 wrote a record");
    }
    out
}

/// Runs ADDs on node `n` every 100 ms until one is not 11, at most `within`; each must be 11 or 100 (the pair is
/// node-0's), never an address. Returns how long the 11s lasted and how many there were.
async fn adds_until_ready(rf: &RoutedFabric, n: usize, within: Duration) -> (Duration, u32) {
    let t0 = Instant::now();
    let mut refused = 0;
    loop {
        let out = add_pair(rf, n, &format!("try{refused}")).await;
        assert!(!out.success, "node-{n} took {:?} of node-0's pair: {}", out.json()["ips"], out.stderr);
        match out.error_code() {
            11 => refused += 1,
            100 => return (t0.elapsed(), refused),
            other => panic!("ADD answered {other}: {}", out.stdout),
        }
        assert!(t0.elapsed() < within, "node-{n} still answers 11 after {within:?}: {}", out.stdout);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A session disabled by hand (`birdc disable`: a Cease, both sides flush the other's routes, no graceful
/// restart): node-1 no longer sees node-0's claims, and its ADD answers 11 naming the session instead of taking
/// one of them; STATUS says "not available". Enabled again, ADDs answer 11 until the session has settled, then
/// 100: both addresses are node-0's, and no address is ever claimed on both nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_disabled_and_enabled_again_never_lets_an_address_be_taken_twice() {
    root();
    let rf = RoutedFabric::new(&names(2), None).unwrap();
    all_ready(&rf).await;
    let held = node0_holds_the_pair(&rf).await;

    rf.birds[1].disable("peer0_4");
    rf.wait_routes(Duration::from_secs(10), |n, routes| n == 0 || routes.iter().all(|r| !held.contains(&r.dst)))
        .unwrap();
    let out = add_pair(&rf, 1, "while-down").await;
    assert_eq!(out.error_code(), 11, "{}", out.stdout);
    let details = out.json()["details"].as_str().unwrap().to_string();
    assert!(details.contains("BGP session peer0_4 (neighbor 198.18.0.1)"), "{details}");
    assert!(details.contains("not established"), "{details}");
    let status = on(&rf, 1, "STATUS", &pair(), "").run().await;
    assert_eq!(status.error_code(), 50, "{}", status.stdout);
    assert!(status.stdout.contains("peer0_4"), "{}", status.stdout);

    let t0 = Instant::now();
    rf.birds[1].enable("peer0_4");
    let (waited, refused) = adds_until_ready(&rf, 1, Duration::from_secs(60)).await;
    eprintln!(
        "routetable readiness: after birdc enable, node-1's ADDs answered 11 for {waited:?} ({refused} tries), \
         {:?} after the enable",
        t0.elapsed()
    );
    assert!(refused > 0, "the first ADD after enable came after the session settled: nothing was shown");
    rf.wait_routes(Duration::from_secs(10), |n, routes| {
        n == 0 || held.iter().all(|a| routes.iter().any(|r| r.dst == *a && r.protocol == BIRD_PROTO))
    })
    .unwrap();
    none_held_twice(&rf);
}

/// A hold timer that expires (the fabric held past a 3 s hold time, as in a partition): with long-lived graceful
/// restart node-1 keeps node-0's claims, stale, instead of freeing their addresses, and its ADDs answer 11 until the
/// session is back and settled, then 100. No address is ever claimed on both nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_timer_that_expires_keeps_claims_and_adds_wait() {
    root();
    let rf = RoutedFabric::with_sessions(&names(2), None, "hold time 3; keepalive time 1;").unwrap();
    all_ready(&rf).await;
    let held = node0_holds_the_pair(&rf).await;
    let learned = |rf: &RoutedFabric| {
        let routes = rf.host_routes(1, "main");
        held.iter().all(|a| routes.iter().any(|r| r.dst == *a && r.protocol == BIRD_PROTO))
    };
    rf.hold();
    wait::until(Duration::from_secs(20), "the hold timer to expire on node-1", || async {
        let shown = rf.birds[1].birdc(&["show", "protocols", "peer0_4"]).unwrap_or_default();
        (!shown.contains("Established")).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", rf.birds[1].log()));
    let shown = rf.birds[1].birdc(&["show", "protocols", "all", "peer0_4"]).unwrap_or_default();
    assert!(shown.contains("Neighbor graceful restart active"), "{shown}");
    assert!(learned(&rf), "long-lived graceful restart keeps node-0's claims: {:?}", rf.host_routes(1, "main"));
    let out = add_pair(&rf, 1, "partitioned").await;
    assert_eq!(out.error_code(), 11, "{}", out.stdout);
    assert!(out.stdout.contains("peer0_4"), "{}", out.stdout);
    rf.release();
    let (waited, refused) = adds_until_ready(&rf, 1, Duration::from_secs(60)).await;
    eprintln!(
        "routetable readiness: after a hold timer expired, node-1's ADDs answered 11 for {waited:?} ({refused} tries)"
    );
    assert!(learned(&rf), "node-0's claims are there once the session is back");
    none_held_twice(&rf);
}

/// BIRD killed (SIGKILL) and started again (`-R`), on the node that asks and on the node that holds the claims.
/// While node-1's BIRD is dead its ADDs answer 11 (no control socket), and after its restart until its recovery
/// and sessions are done; node-0's BIRD killed, node-1 keeps its claims (graceful restart: stale, not gone) and
/// answers 11 until node-0 is back and has sent them again. No ADD on node-1 ever gets an address, and no address
/// is claimed on both nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bird_killed_and_restarted_keeps_claims_and_adds_wait_for_it() {
    root();
    let mut rf = RoutedFabric::new(&names(2), None).unwrap();
    all_ready(&rf).await;
    let held = node0_holds_the_pair(&rf).await;
    let learned = |rf: &RoutedFabric| {
        let routes = rf.host_routes(1, "main");
        held.iter().all(|a| routes.iter().any(|r| r.dst == *a && r.protocol == BIRD_PROTO))
    };

    rf.birds[1].kill();
    let out = add_pair(&rf, 1, "dead").await;
    assert_eq!(out.error_code(), 11, "{}", out.stdout);
    assert!(out.stdout.contains("cannot connect to BIRD's control socket"), "{}", out.stdout);
    assert!(learned(&rf), "the dead daemon's learned claims stay in the kernel");
    rf.birds[1].restart().unwrap();
    let (waited, refused) = adds_until_ready(&rf, 1, Duration::from_secs(60)).await;
    eprintln!("routetable readiness: node-1's BIRD restarted, its ADDs answered 11 for {waited:?} ({refused} tries)");
    assert!(refused > 0);
    assert!(learned(&rf), "node-1 has node-0's claims again: {:?}", rf.host_routes(1, "main"));

    // the holder's daemon dies: node-1 keeps its claims, stale, and waits for it
    rf.birds[0].kill();
    let out = add_pair(&rf, 1, "holder-dead").await;
    assert_eq!(out.error_code(), 11, "{}", out.stdout);
    assert!(out.stdout.contains("peer0_4"), "{}", out.stdout);
    assert!(learned(&rf), "graceful restart keeps node-0's claims on node-1: {:?}", rf.host_routes(1, "main"));
    rf.birds[0].restart().unwrap();
    let (waited, refused) = adds_until_ready(&rf, 1, Duration::from_secs(60)).await;
    eprintln!(
        "routetable readiness: node-0's BIRD restarted, node-1's ADDs answered 11 for {waited:?} ({refused} tries)"
    );
    assert!(learned(&rf), "node-1 kept node-0's claims through its restart");
    // node-0 still holds both, and says so: its own ADD is refused as full, once its daemon is ready
    ready(&rf, 0).await;
    let out = on(&rf, 0, "ADD", &pair(), "h3").run().await;
    assert_eq!(out.error_code(), 100, "{}", out.stdout);
    none_held_twice(&rf);
}

/// Sandboxes started before BIRD converged: node-1 comes up as after a reboot (no daemon, none of node-0's claims
/// in its table), its BIRD is started, and ADDs are fired on it at once and every 100 ms: each answers 11 until
/// the sessions are established and settled, then 100. On a node that asked nobody, the first would have taken
/// one of node-0's addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_before_convergence_wait_for_it() {
    root();
    let mut rf = RoutedFabric::new(&names(2), None).unwrap();
    all_ready(&rf).await;
    let held = node0_holds_the_pair(&rf).await;
    rf.birds[1].kill();
    // a reboot forgets what the kernel held
    for a in &held {
        rf.fabric.nodes[1].netns.ip(&["route", "del", &format!("{a}/32"), "proto", "bird"]).unwrap();
    }
    assert!(rf.host_routes(1, "main").iter().all(|r| !held.contains(&r.dst)));
    let out = add_pair(&rf, 1, "before").await;
    assert_eq!(out.error_code(), 11, "{}", out.stdout);

    let t0 = Instant::now();
    rf.birds[1].restart().unwrap();
    let (waited, refused) = adds_until_ready(&rf, 1, Duration::from_secs(60)).await;
    eprintln!(
        "routetable readiness: BIRD started on node-1, its ADDs answered 11 for {waited:?} ({refused} tries), \
         {:?} after the start",
        t0.elapsed()
    );
    assert!(refused > 0);
    none_held_twice(&rf);
}

/// The reconciler's claim checker, on node-0 (its flat file makes the routing-table datastore the node's
/// default): a pod's claim that another node contests with an earlier claim — a route installed by hand on
/// node-1 with an earlier claim time, as a node that could not hear node-0 would have — is reported within
/// seconds: a Warning Event AddressConflict on the pod, `hereabouts_routetable_conflicts` 1, and CHECK fails with
/// 102. The pod keeps its claim. When the competing claim goes, the metric is 0 again and CHECK passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_reported_by_the_checker_within_seconds() {
    root();
    let fx = PodFixture::new("rt-check", "198.19.10.0/28").await;
    let port = fx.cluster.server().rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse().ok()).unwrap();
    let rf = RoutedFabric::new(&names(2), Some(port)).unwrap();
    rf.node_file(0, json!({"datastore": "routetable"})).unwrap();
    all_ready(&rf).await;
    let pod = mk_pod(&fx.ns, "victim").create(&fx.admin).await;
    let uid = pod.metadata.uid.clone().unwrap();
    let config = netconf("chk", json!({"range": "198.19.10.0/28", "propagation_timeout_ms": 200}));
    let invocation = |verb: &'static str| {
        let mut inv =
            Invocation::new(verb, &config, &fx.ns, "victim", "c-victim").in_netns(&rf.fabric.nodes[0].netns.name);
        inv.args = format!("{};K8S_POD_UID={uid}", inv.args);
        inv
    };
    let ip = invocation("ADD").run().await.ips()[0];
    let ours = claims(&rf, 1)[&ip][0].1;

    let opts = ReconcilerOptions {
        netns: Some(rf.fabric.nodes[0].netns.name.clone()),
        flat_file: Some(NODE_FLAT_FILE.into()),
        extra_args: vec!["--routetable-check-interval".into(), "1s".into()],
        ..ReconcilerOptions::new("node-0", &fx.ns)
    };
    let reconciler = Reconciler::start(fx.cluster, &opts).await;
    reconciler.wait_for_more("hereabouts_routetable_checks_total", 1.0).await;
    assert_eq!(reconciler.metric("hereabouts_routetable_claims").await, 1.0, "{}", reconciler.logs());
    assert_eq!(reconciler.metric("hereabouts_routetable_conflicts").await, 0.0);

    // node-1 claims the address too, 10 s earlier than node-0 did
    let earlier = (ours - 20_000).to_string();
    let t0 = Instant::now();
    rf.fabric.nodes[1]
        .netns
        .ip(&["route", "add", &format!("{ip}/32"), "dev", "fab0", "proto", "192", "metric", &earlier])
        .unwrap();
    let events = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.admin.clone(), &fx.ns);
    let event = wait::until(Duration::from_secs(30), "an AddressConflict Event on the pod", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("AddressConflict")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("victim")
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", reconciler.logs()));
    let delay = t0.elapsed();
    eprintln!("routetable checker: the conflict was reported {delay:?} after the competing claim was installed");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event.note.as_deref().unwrap_or_default().starts_with(&format!("{ip} (chk net1) is also claimed")),
        "{event:?}"
    );
    // the gauge is set as the pass that published the Event ends: one more pass, and it holds
    reconciler.wait_for_more("hereabouts_routetable_checks_total", 1.0).await;
    assert_eq!(reconciler.metric("hereabouts_routetable_conflicts").await, 1.0);
    assert_eq!(reconciler.metric("hereabouts_routetable_conflicts_seen_total").await, 1.0);
    let check = invocation("CHECK").run().await;
    assert_eq!(check.error_code(), 102, "{}", check.stdout);
    assert!(check.stdout.contains("another claim as early as ours or earlier"), "{}", check.stdout);
    assert_eq!(claims(&rf, 1)[&ip], [(0, ours)], "the pod keeps its claim");

    // the competing claim goes
    rf.fabric.nodes[1].netns.ip(&["route", "del", &format!("{ip}/32"), "proto", "192", "metric", &earlier]).unwrap();
    wait::until(Duration::from_secs(30), "the conflict to be over", || async {
        (reconciler.metric("hereabouts_routetable_conflicts").await == 0.0).then_some(())
    })
    .await
    .unwrap();
    let check = invocation("CHECK").run().await;
    assert!(check.success, "{} {}", check.stdout, check.stderr);
    assert!(invocation("DEL").run().await.success);
}
