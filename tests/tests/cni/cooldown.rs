//! Reuse cooldown, the compiled plugin (and `kubectl-hereabouts`) against the test API server: a released address
//! waits out the pool's cooldown, an ADD that finds every free address cooling says so with code 11 and writes
//! nothing, the books stay bounded, every releaser keeps them, and concurrent ADDs and DELs whose answers are lost
//! never hand an address to another pod early.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hereabouts_ipam::cooldown::COOLDOWN_ANNOTATION;
use hereabouts_tests::Identity;
use hereabouts_tests::ctl::ctl;
use hereabouts_tests::faultproxy::{Action, FaultProxy, Rule, Verb};
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::plugin::netconf;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The pool's release records, offset -> time.
async fn released(fx: &CniFixture, pool: &str) -> BTreeMap<String, String> {
    fx.pool(pool).await.spec.released.unwrap_or_default()
}

/// Sleeps until `secs` seconds after the release recorded at `at`, and a little more.
async fn wait_past(at: &str, secs: u64) {
    let until: Timestamp = at.parse().unwrap();
    let left = until.as_millisecond() + secs as i64 * 1000 + 300 - Timestamp::now().as_millisecond();
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left as u64)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_address_waits_out_the_cooldown_and_the_books_stay_bounded() {
    let fx = CniFixture::new("cooldown").await;
    let pool = "198.18.140.0-30";
    let config = fx.netconf("1.0.0", "cool", json!({"range": "198.18.140.0/30", "reuse_cooldown_seconds": 3}));

    assert_eq!(fx.add_on(&config, "node-1", "a").await.ips(), [ip("198.18.140.1")]);
    let read = fx.pool(pool).await;
    let annotations = read.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations.get(COOLDOWN_ANNOTATION).map(String::as_str), Some("3"), "the pool carries the policy");
    assert_eq!(read.spec.released, Some(BTreeMap::new()));

    assert!(fx.del_on(&config, "node-1", "a").await.success);
    let books = released(&fx, pool).await;
    assert_eq!(books.keys().collect::<Vec<_>>(), ["1"], "DEL recorded the release of .1");
    // the lowest address was just given back: the next pod gets the other one
    assert_eq!(fx.add_on(&config, "node-1", "b").await.ips(), [ip("198.18.140.2")]);

    // the only free address is cooling: try again later, and nothing written
    let before = (fx.pool(pool).await.spec, fx.object_count().await);
    let out = fx.add_on(&config, "node-1", "c").await;
    assert_eq!(out.error_code(), 11, "{}", out.stdout);
    let said = out.json()["msg"].as_str().unwrap().to_string() + out.json()["details"].as_str().unwrap_or_default();
    eprintln!("while cooling: {}", out.stdout.trim());
    assert!(
        said.contains(&format!(
            "pool {pool}: every free address was released less than the pool's reuse cooldown ago (1 cooling"
        )),
        "{said}"
    );
    assert_eq!((fx.pool(pool).await.spec, fx.object_count().await), before);

    wait_past(&books["1"], 3).await;
    assert_eq!(fx.add_on(&config, "node-1", "c").await.ips(), [ip("198.18.140.1")], "after the cooldown");

    // bounded: a release prunes the records that have expired
    assert!(fx.del_on(&config, "node-1", "b").await.success);
    let books = released(&fx, pool).await;
    assert_eq!(books.keys().collect::<Vec<_>>(), ["2"], "this release pruned the expired record of .1");
    wait_past(&books["2"], 3).await;
    assert!(fx.del_on(&config, "node-1", "c").await.success);
    assert_eq!(released(&fx, pool).await.keys().collect::<Vec<_>>(), ["1"], ".2 expired and was pruned");

    // 0 takes the cooldown away: the address just released is handed out at once
    let off = fx.netconf("1.0.0", "cool", json!({"range": "198.18.140.0/30", "reuse_cooldown_seconds": 0}));
    assert_eq!(fx.add_on(&off, "node-1", "d").await.ips(), [ip("198.18.140.1")]);
    assert!(!fx.pool(pool).await.metadata.annotations.unwrap_or_default().contains_key(COOLDOWN_ANNOTATION));
    // and a release without a cooldown writes no record
    let records = released(&fx, pool).await;
    assert!(fx.del_on(&off, "node-1", "d").await.success);
    assert_eq!(released(&fx, pool).await, records);
}

/// The reconciler's release (here through `kubectl hereabouts ipam release --force`, which makes the same guarded
/// write) keeps the books too: it knows no config, only the pool's annotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcilers_release_records_it_too() {
    let fx = CniFixture::new("cooldown-ctl").await;
    let pool = "198.18.141.0-30";
    let config = fx.netconf("1.0.0", "cool", json!({"range": "198.18.141.0/30", "reuse_cooldown_seconds": 30}));
    assert_eq!(fx.add_on(&config, "node-1", "gone").await.ips(), [ip("198.18.141.1")]);
    let admin = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let out = ctl(&admin, &fx.ns, &["ipam", "release", "--ip", "198.18.141.1", "--force"]).await;
    assert!(out.success, "{}", out.stderr);
    let books = released(&fx, pool).await;
    assert_eq!(books.keys().collect::<Vec<_>>(), ["1"]);
    let said = ctl(&admin, &fx.ns, &["ipam", "show", "--ip", "198.18.141.1"]).await.stdout;
    eprintln!("ipam show --ip: {said}");
    assert!(said.contains(&format!("198.18.141.1 is free in pool {pool}, cooling until ")), "{said}");
    assert_eq!(fx.add_on(&config, "node-1", "next").await.ips(), [ip("198.18.141.2")], ".1 is cooling");
}

/// Eight pods, each attached and detached three times, ADDs and DELs at once through a proxy that loses the
/// answers of some pool patches (claims and releases) after the server applied them. Whoever got an address,
/// no other pod got it before the cooldown had passed since the DEL of its last holder began; and the books
/// never hold more than one record per address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_and_dels_with_lost_answers_never_hand_an_address_out_early() {
    const COOLDOWN: Duration = Duration::from_secs(2);
    let fx = CniFixture::new("cooldown-storm").await;
    let proxy = FaultProxy::start(fx.cluster).await;
    let kubeconfig = proxy.kubeconfig(fx.cluster, Identity::Cni, &fx.ns);
    let pool = "198.18.142.0-28";
    let config =
        netconf("1.0.0", "storm", &kubeconfig, json!({"range": "198.18.142.0/28", "reuse_cooldown_seconds": 2}));
    proxy.add_rule(Rule {
        verb: Verb::Patch,
        resource: "ippools".into(),
        nth: 3,
        times: 3,
        action: Action::DropResponse,
    });
    proxy.add_rule(Rule::nth(Verb::Patch, "ippools", 20, Action::DropResponse));
    proxy.add_rule(Rule::nth(Verb::Patch, "ippools", 31, Action::DropResponse));

    let start = Instant::now();
    // per pod: (address, when its ADD ended, when its DEL began)
    let runs = (0..8).map(|p| {
        let (fx, config) = (&fx, &config);
        async move {
            let mut held = Vec::new();
            for round in 0..3 {
                let name = format!("p{p}-r{round}");
                // the pods' rounds staggered, so ADDs and DELs of different pods interleave
                tokio::time::sleep(Duration::from_millis(40 * p as u64)).await;
                let got = loop {
                    let out = fx.add_on(config, ["node-1", "node-2"][p % 2], &name).await;
                    if out.success {
                        break out.ips()[0];
                    }
                    // the runtime's retry after code 11 (every free address cooling)
                    assert_eq!(out.error_code(), 11, "{name}: {}", out.stdout);
                    assert!(fx.del_on(config, ["node-1", "node-2"][p % 2], &name).await.success);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                };
                let added = start.elapsed();
                // the pod runs a while before it goes
                tokio::time::sleep(Duration::from_millis(200)).await;
                let del_began = start.elapsed();
                assert!(fx.del_on(config, ["node-1", "node-2"][p % 2], &name).await.success, "DEL {name}");
                held.push((got, name, added, del_began));
            }
            held
        }
    });
    let all: Vec<_> = futures::future::join_all(runs).await.into_iter().flatten().collect();
    let lost = proxy.seen().iter().filter(|s| s.action == Some(Action::DropResponse)).count();
    eprintln!("{} attachments, {lost} answers lost", all.len());
    assert!(lost >= 5, "the faults fired");

    let mut by_ip: BTreeMap<IpAddr, Vec<&(IpAddr, String, Duration, Duration)>> = BTreeMap::new();
    for h in &all {
        by_ip.entry(h.0).or_default().push(h);
    }
    let mut reused = 0;
    for (addr, mut holders) in by_ip {
        holders.sort_by_key(|h| h.2);
        for pair in holders.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            reused += 1;
            assert!(
                after.2 >= before.3 + COOLDOWN,
                "{addr}: {} got it {:?} after {} began giving it up",
                after.1,
                after.2.saturating_sub(before.3),
                before.1
            );
        }
    }
    eprintln!("{reused} addresses went to another pod, each after the cooldown");
    assert!(reused > 0, "14 addresses for 24 attachments: some are reused");
    let books = released(&fx, pool).await;
    assert!(books.len() <= 14, "one record per address at most: {books:?}");
    assert_eq!(fx.pool(pool).await.spec.allocations.len(), 0, "every address given back");
    assert_eq!(fx.reservations().await.len(), 0);
}
