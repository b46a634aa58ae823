//! hereabouts and upstream Whereabouts on one cluster, under Whereabouts' own CRD schema: what either writes, the
//! other reads, extends and releases, and no address is handed out twice between them. The CRDs are swapped for
//! Whereabouts' on a control plane of this module's own, which no other test sees.

use std::collections::BTreeSet;
use std::net::IpAddr;

use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::plugin::Invocation;
use hereabouts_tests::{TestCluster, testenv};
use serde_json::json;
use tokio::sync::OnceCell;

static WHEREABOUTS_SCHEMA: OnceCell<()> = OnceCell::const_new();

/// This module's control plane, whose CRDs are Whereabouts' once [`under_whereabouts_schema`] ran.
fn cluster() -> &'static TestCluster {
    TestCluster::own(module_path!())
}

/// Swaps our CRDs for the ones Whereabouts v0.9.2 ships (once, on this module's control plane).
async fn under_whereabouts_schema() {
    WHEREABOUTS_SCHEMA
        .get_or_init(|| async {
            let dir = testenv::bin_dir().join("whereabouts-crds");
            assert!(dir.is_dir(), "{} is missing: run `make testenv`", dir.display());
            cluster().replace_crds(&dir).await.expect("install Whereabouts' CRDs");
        })
        .await;
}

fn whereabouts(fx: &CniFixture, command: &'static str, config: &serde_json::Value, pod: &str, cid: &str) -> Invocation {
    hereabouts_tests::plugin::whereabouts(fx.cluster, &fx.ns, command, config, pod, cid)
}

#[tokio::test]
async fn each_reads_and_extends_what_the_other_wrote() {
    under_whereabouts_schema().await;
    let fx = CniFixture::on(cluster(), "compat-mixed").await;
    let config = fx.netconf("1.0.0", "mixed", json!({"range": "198.18.30.0/24"}));
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();

    assert_eq!(fx.add(&config, "h1", "hc1").await.ips(), vec![ip("198.18.30.1")]);
    let wb = whereabouts(&fx, "ADD", &config, "w1", "wc1").run().await;
    assert_eq!(wb.ips(), vec![ip("198.18.30.2")], "Whereabouts reads the pool hereabouts wrote: {}", wb.stderr);
    assert_eq!(fx.add(&config, "h2", "hc2").await.ips(), vec![ip("198.18.30.3")], "and the reverse");

    // What hereabouts wrote parses under Whereabouts' schema; our optional fields are pruned by it, not refused.
    let pool = fx.pool("198.18.30.0-24").await;
    let owners: BTreeSet<&str> = pool.spec.allocations.values().map(|a| a.podref.as_str()).collect();
    assert_eq!(owners.len(), 3, "{:?}", pool.spec.allocations);
    assert!(pool.spec.allocations.values().all(|a| a.poduid.is_none() && a.node.is_none()));

    // hereabouts releases what Whereabouts allocated, and Whereabouts what hereabouts did.
    assert!(fx.del(&config, "w1", "wc1").await.success);
    let del = whereabouts(&fx, "DEL", &config, "h1", "hc1").run().await;
    assert!(del.success, "{} {}", del.stdout, del.stderr);
    let keys: BTreeSet<String> = fx.pool("198.18.30.0-24").await.spec.allocations.into_keys().collect();
    assert_eq!(keys, BTreeSet::from(["3".to_string()]));
}

#[tokio::test]
async fn concurrent_adds_of_both_never_share_an_address() {
    under_whereabouts_schema().await;
    let fx = CniFixture::on(cluster(), "compat-race").await;
    let config = fx.netconf("1.0.0", "race", json!({"range": "198.18.31.0/24"}));
    let runs = (0..24).map(|i| {
        let inv = if i % 2 == 0 {
            fx.invocation("ADD", &config, &format!("h{i}"), &format!("hc{i}"))
        } else {
            whereabouts(&fx, "ADD", &config, &format!("w{i}"), &format!("wc{i}"))
        };
        async move { inv.run().await }
    });
    let outputs = futures::future::join_all(runs).await;
    let mut ips = Vec::new();
    let mut failed_whereabouts = BTreeSet::new();
    for (i, out) in outputs.iter().enumerate() {
        if i % 2 == 1 && !out.success {
            // Whereabouts gives up (rather than picking again) when its reservation create meets one of ours;
            // the runtime retries. That is a failed ADD, never a shared address.
            assert!(out.stdout.contains("already exists"), "w{i}: {}", out.stdout);
            failed_whereabouts.insert(format!("{}/w{i}", fx.ns));
            continue;
        }
        ips.extend(out.ips());
    }
    let distinct: BTreeSet<IpAddr> = ips.iter().copied().collect();
    assert!(ips.len() >= 12, "every hereabouts ADD succeeds: {} of 24 did in all", ips.len());
    assert_eq!(
        distinct.len(),
        ips.len(),
        "an address was handed out twice between hereabouts and Whereabouts: {ips:?}"
    );
    let pool = fx.pool("198.18.31.0-24").await;
    let held: BTreeSet<IpAddr> =
        pool.spec.allocations.keys().map(|k| format!("198.18.31.{k}").parse().unwrap()).collect();
    assert!(distinct.is_subset(&held), "every address handed out is recorded");
    // Whereabouts writes the pool before its reservation and does not roll back when the reservation fails: such
    // entries are its own leaks (for the reconciler), owned by the ADDs that failed, never by a live attachment.
    for (key, entry) in &pool.spec.allocations {
        let ip: IpAddr = format!("198.18.31.{key}").parse().unwrap();
        assert!(distinct.contains(&ip) || failed_whereabouts.contains(&entry.podref), "{key}: {entry:?}");
    }
    eprintln!("compat: {} of 12 Whereabouts ADDs succeeded alongside 12 of hereabouts", ips.len() - 12);
}

/// Defect 3's second half: a /64 with `random` picked offsets of 2^63 and more, which Whereabouts cannot read and
/// drops on its next write of the pool, freeing the address under the pod that holds it. Offsets stay below.
#[tokio::test]
async fn a_random_ipv6_range_survives_a_whereabouts_add_into_the_same_pool() {
    under_whereabouts_schema().await;
    let fx = CniFixture::on(cluster(), "compat-v6").await;
    let ours = fx.netconf("1.0.0", "v6", json!({"range": "2001:db8:6::/64", "allocation_strategy": "random"}));
    let mut held = BTreeSet::new();
    for i in 0..12 {
        held.insert(fx.add(&ours, &format!("h{i}"), &format!("hc{i}")).await.ips()[0]);
    }
    let wb = whereabouts(&fx, "ADD", &ours, "w", "wc").run().await;
    assert!(wb.success, "Whereabouts ADD: {} {}", wb.stdout, wb.stderr);
    let pool = fx.pool("2001-db8-6---64").await;
    let keys: Vec<u128> = pool.spec.allocations.keys().map(|k| k.parse().unwrap()).collect();
    assert!(keys.iter().all(|&k| k <= i64::MAX as u128), "every offset readable by Whereabouts: {keys:?}");
    let owners: BTreeSet<String> = pool.spec.allocations.values().map(|a| a.podref.clone()).collect();
    for i in 0..12 {
        assert!(owners.contains(&format!("{}/h{i}", fx.ns)), "h{i} lost its entry: {owners:?}");
    }
    assert_eq!(pool.spec.allocations.len(), 13);
    assert_eq!(held.len(), 12);
}

/// Finding 3 of issue 25: under Whereabouts' schema `spec.released` is pruned. An ADD that needs it fails naming the
/// CRD; a release never waits for a record that can never be written (the entry used to stay for good, DEL
/// exiting 0); and the drift is loud: the leader's log, a Warning Event on the CRD, a gauge, `ipam check`, `lint`.
#[tokio::test]
async fn a_pruned_field_fails_the_add_that_needs_it_never_keeps_a_release_and_is_reported() {
    use hereabouts_tests::reconciler::{Reconciler, ReconcilerOptions};
    under_whereabouts_schema().await;
    let fx = CniFixture::on(cluster(), "compat-pruned").await;
    let plain = fx.netconf("1.0.0", "pruned", json!({"range": "198.18.31.0/30"}));
    let cooling = fx.netconf("1.0.0", "pruned", json!({"range": "198.18.31.0/30", "reuse_cooldown_seconds": 5}));

    let refused = fx.add(&cooling, "c0", "cc0").await;
    assert_eq!(refused.error_code(), 103, "{}", refused.stdout);
    for part in ["ippools.whereabouts.cni.cncf.io", "spec.released", "reuse_cooldown_seconds", "crds/"] {
        assert!(refused.stdout.contains(part), "{part}: {}", refused.stdout);
    }
    assert_eq!(fx.object_count().await.1, 0, "no reservation left");

    // the refused ADD left no cooldown behind: an ADD without one succeeds
    let ip = fx.add(&plain, "h1", "hc1").await.ips()[0];
    // a pool given its cooldown under hereabouts' schema keeps the annotation once Whereabouts' CRD is applied, and
    // loses its books: the release of an entry is not kept hostage to a record that can never be written
    let pools = kube::Api::<hereabouts_ipam::crd::IpPool>::namespaced(fx.admin.clone(), &fx.ns);
    let cooled = json!({"metadata": {"annotations": {"hereabouts.cni.cncf.io/reuse-cooldown-seconds": "5"}}});
    pools.patch("198.18.31.0-30", &Default::default(), &kube::api::Patch::Merge(&cooled)).await.unwrap();
    let del = fx.del(&cooling, "h1", "hc1").await;
    assert!(del.success, "{}", del.stderr);
    assert!(fx.pool("198.18.31.0-30").await.spec.allocations.is_empty(), "{ip} released, not kept hostage");
    assert!(del.stderr.contains("prunes spec.released"), "{}", del.stderr);

    let admin = cluster().admin().await;
    hereabouts_tests::deploy::apply_rbac(admin.clone()).await;
    hereabouts_tests::deploy::create_lease(&admin, &fx.ns).await;
    let reconciler = Reconciler::start(cluster(), &ReconcilerOptions::new("node-a", &fx.ns)).await;
    let seen = hereabouts_tests::wait::until(std::time::Duration::from_secs(20), "the drift reported", || async {
        let drift = reconciler.metric(r#"hereabouts_crd_schema_drift{crd="ippools.whereabouts.cni.cncf.io"}"#).await;
        (drift > 0.0 && reconciler.logs().contains("CRD schema drift")).then_some(())
    })
    .await;
    if let Err(e) = seen {
        panic!("{e}\n{}", reconciler.logs());
    }
    let events = kube::Api::<k8s_openapi::api::events::v1::Event>::all(admin.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("SchemaDrift")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("ippools.whereabouts.cni.cncf.io")),
        "a Warning Event on the CRD"
    );
    let kubeconfig = cluster().kubeconfig(hereabouts_tests::Identity::Admin, &fx.ns);
    let check = hereabouts_tests::ctl::ctl(&kubeconfig, &fx.ns, &["ipam", "check"]).await;
    assert!(check.stdout.contains("schema drift: ippools.whereabouts.cni.cncf.io prunes"), "{}", check.stdout);
    assert!(check.stdout.contains("spec.released"), "{}", check.stdout);
    // lint reads the NetworkAttachmentDefinitions too
    let nad_crd = hereabouts_tests::testenv::tool("networks-crd.yaml");
    hereabouts_tests::runtime::install_nad_crd(&admin, &nad_crd).await.unwrap();
    let lint = hereabouts_tests::ctl::ctl(&kubeconfig, &fx.ns, &["lint"]).await;
    assert!(
        !lint.success && lint.stdout.contains("crd/ippools.whereabouts.cni.cncf.io"),
        "{}\n{}",
        lint.stdout,
        lint.stderr
    );
}
