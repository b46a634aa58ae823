//! `kubectl-hereabouts`, the compiled binary, against the test API server: `ipam show` against the objects,
//! `ipam release` refusing a live pod's address, and `lint` over NetworkAttachmentDefinitions.

use std::collections::BTreeSet;

use hereabouts_ipam::crd::IpPool;
use hereabouts_tests::ctl::ctl;
use hereabouts_tests::fixture::CniFixture;
use hereabouts_tests::objects::{mk_entry, mk_pool};
use hereabouts_tests::{Identity, runtime};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

async fn age_entries(fx: &CniFixture, pool: &str, secs: i64) {
    let at = (k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(secs)).to_string();
    let current = fx.pool(pool).await;
    let allocations: serde_json::Map<String, Value> =
        current.spec.allocations.keys().map(|k| (k.clone(), json!({"allocated": at}))).collect();
    let patch = Patch::Merge(json!({"spec": {"allocations": allocations}}));
    Api::<IpPool>::namespaced(fx.admin.clone(), &fx.ns).patch(pool, &PatchParams::default(), &patch).await.unwrap();
}

/// `ipam show`'s numbers are the objects' (capacity from the range and its excludes as the creating config had
/// them), as a table and as JSON; `--ip` names the holder, its container, interface and node, or says free.
#[tokio::test]
async fn ipam_show_matches_the_pools_and_names_the_holder_of_an_address() {
    let fx = CniFixture::new("ctl-show").await;
    let admin = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let a = fx.netconf("1.0.0", "net-a", json!({"range": "198.18.96.0/24", "exclude": ["198.18.96.0/28"]}));
    let b = fx.netconf("1.0.0", "net-b", json!({"range": "198.18.97.0/29", "network_name": "blue"}));
    for pod in ["p1", "p2", "p3"] {
        assert!(fx.invocation("ADD", &a, pod, &format!("c-{pod}")).with_env("NODENAME", "node-a").run().await.success);
    }
    assert!(fx.invocation("ADD", &b, "q1", "c-q1").with_env("NODENAME", "node-b").run().await.success);

    let json_out = ctl(&admin, &fx.ns, &["ipam", "show", "-o", "json"]).await;
    assert!(json_out.success, "{}", json_out.stderr);
    let rows: Vec<Value> = serde_json::from_str(&json_out.stdout).unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        let pool = fx.pool(row["pool"].as_str().unwrap()).await;
        assert_eq!(row["range"], pool.spec.range);
        assert_eq!(row["allocated"], pool.spec.allocations.len());
    }
    assert_eq!(
        (
            rows[0]["pool"].as_str(),
            rows[0]["capacity"].as_str(),
            rows[0]["allocated"].as_u64(),
            rows[0]["free"].as_str()
        ),
        (Some("198.18.96.0-24"), Some("239"), Some(3), Some("236")),
        "254 usable less the 15 the exclude takes (.0 is no host)"
    );
    assert_eq!(
        (rows[1]["pool"].as_str(), rows[1]["network"].as_str(), rows[1]["capacity"].as_str(), rows[1]["free"].as_str()),
        (Some("blue-198.18.97.0-29"), Some("blue"), Some("6"), Some("5"))
    );

    let table = ctl(&admin, &fx.ns, &["ipam", "show"]).await;
    eprintln!("$ kubectl hereabouts -n {} ipam show\n{}", fx.ns, table.stdout);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(lines[0].starts_with("POOL") && lines[0].contains("CAPACITY  ALLOCATED  FREE"), "{}", table.stdout);
    let words: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(words, ["198.18.96.0-24", "198.18.96.0/24", "-", "-", "239", "3", "236"], "{}", table.stdout);

    let held = ctl(&admin, &fx.ns, &["ipam", "show", "--ip", "198.18.96.17"]).await;
    eprintln!("$ kubectl hereabouts -n {} ipam show --ip 198.18.96.17\n{}", fx.ns, held.stdout);
    let says = format!(
        "198.18.96.17 is held by {}/p2 in pool 198.18.96.0-24, container c-p2, interface net1, on node node-a, since ",
        fx.ns
    );
    assert!(held.stdout.starts_with(&says), "{}", held.stdout);
    assert!(held.stdout.trim_end().ends_with("; reserved cluster-wide"), "{}", held.stdout);
    let free = ctl(&admin, &fx.ns, &["ipam", "show", "--ip", "198.18.97.6"]).await;
    assert_eq!(free.stdout.trim(), "198.18.97.6 is free in pool blue-198.18.97.0-29");
    let nowhere = ctl(&admin, &fx.ns, &["ipam", "show", "--ip", "2001:db8::1"]).await;
    assert_eq!(nowhere.stdout.trim(), format!("2001:db8::1: in no pool of namespace {}", fx.ns));
}

/// `ipam release` refuses a live pod's address and one an ADD may still be writing, saying why, and changes
/// nothing; `--force` releases the live one; once the gone pod's entry is older than any ADD, it goes without.
#[tokio::test]
async fn ipam_release_refuses_a_live_pod_unless_forced() {
    let fx = CniFixture::new("ctl-release").await;
    let admin = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let cfg = fx.netconf("1.0.0", "rel", json!({"range": "198.18.98.0/24"}));
    runtime::create_pod(&fx.admin, &fx.ns, "live", "node-a", &[]).await.unwrap();
    assert!(fx.add(&cfg, "live", "c-live").await.success);
    assert!(fx.add(&cfg, "gone", "c-gone").await.success);

    let refused = ctl(&admin, &fx.ns, &["ipam", "release", "--ip", "198.18.98.1"]).await;
    eprintln!("$ kubectl hereabouts -n {} ipam release --ip 198.18.98.1\n{}", fx.ns, refused.stdout);
    assert!(!refused.success, "exit status 1");
    assert!(
        refused.stdout.contains(&format!("is held by {}/live: its pod is alive (uid ", fx.ns)),
        "{}",
        refused.stdout
    );
    assert!(refused.stdout.contains("--force releases it anyway"), "{}", refused.stdout);
    let fresh = ctl(&admin, &fx.ns, &["ipam", "release", "--ip", "198.18.98.2"]).await;
    assert!(!fresh.success);
    assert!(fresh.stdout.contains("an ADD may still be under way"), "{}", fresh.stdout);
    let (pool, reservations) = (fx.pool("198.18.98.0-24").await, fx.reservations().await);
    assert_eq!((pool.spec.allocations.len(), reservations.len()), (2, 2), "nothing changed");

    let forced = ctl(&admin, &fx.ns, &["ipam", "release", "--ip", "198.18.98.1", "--force"]).await;
    eprintln!("$ kubectl hereabouts -n {} ipam release --ip 198.18.98.1 --force\n{}", fx.ns, forced.stdout);
    assert!(forced.success, "{}{}", forced.stdout, forced.stderr);
    assert!(forced.stdout.contains("released 198.18.98.1 in pool 198.18.98.0-24"), "{}", forced.stdout);
    assert!(forced.stdout.contains("forced over: its pod is alive"), "{}", forced.stdout);

    age_entries(&fx, "198.18.98.0-24", 600).await;
    let gone = ctl(&admin, &fx.ns, &["ipam", "release", "--ip", "198.18.98.2"]).await;
    assert!(gone.success, "{}{}", gone.stdout, gone.stderr);
    assert!(gone.stdout.contains("(pod_deleted)"), "{}", gone.stdout);
    let (pool, reservations) = (fx.pool("198.18.98.0-24").await, fx.reservations().await);
    assert_eq!((pool.spec.allocations.len(), reservations.len()), (0, 0), "entries and reservations gone");
    let again = ctl(&admin, &fx.ns, &["ipam", "release", "--ip", "198.18.98.2"]).await;
    assert_eq!(again.stdout.trim(), format!("198.18.98.2: no pool of namespace {} holds it", fx.ns));
}

/// `lint` loads every NetworkAttachmentDefinition of a namespace with hereabouts' rules: one Whereabouts accepts
/// with a camelCase `rangeStart` is flagged with the key named and the exit status says so; a plugin list is read
/// plugin by plugin; NADs of other IPAMs are not judged.
#[tokio::test]
async fn lint_flags_the_nads_hereabouts_would_refuse() {
    let fx = CniFixture::new("ctl-lint").await;
    let admin = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let crd = runtime::nad_crd_path()
        .expect("the NetworkAttachmentDefinition CRD is built by hack/testenv.sh (`make testenv`): run it first");
    runtime::install_nad_crd(&fx.admin, &crd).await.unwrap();
    let conf = |ipam: Value| json!({"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "ipam": ipam});
    runtime::create_nad(&fx.admin, &fx.ns, "good", &conf(json!({"type": "whereabouts", "range": "198.18.99.0/24"})))
        .await
        .unwrap();
    let camel = conf(json!({"type": "whereabouts", "range": "198.18.99.0/24", "rangeStart": "198.18.99.10"}));
    runtime::create_nad(&fx.admin, &fx.ns, "camel", &camel).await.unwrap();
    let list = json!({"cniVersion": "1.0.0", "name": "l", "plugins": [
        {"type": "macvlan", "ipam": {"type": "hereabouts", "range": "198.18.99.0/33"}},
        {"type": "tuning"},
    ]});
    runtime::create_nad(&fx.admin, &fx.ns, "list", &list).await.unwrap();
    runtime::create_nad(&fx.admin, &fx.ns, "other", &conf(json!({"type": "host-local", "subnet": "10.1.0.0/24"})))
        .await
        .unwrap();

    let out = ctl(&admin, &fx.ns, &["lint"]).await;
    eprintln!("$ kubectl hereabouts -n {} lint\n{}", fx.ns, out.stdout);
    assert!(!out.success, "refusals make the exit status 1: {}", out.stdout);
    let ns = &fx.ns;
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", out.stdout);
    assert!(lines.contains(&format!("{ns}/good: ok").as_str()), "{}", out.stdout);
    let camel_line =
        lines.iter().find(|l| l.starts_with(&format!("{ns}/camel: refused (code 2): "))).expect(&out.stdout);
    assert!(camel_line.contains("rangeStart"), "{camel_line}");
    let list_line =
        lines.iter().find(|l| l.starts_with(&format!("{ns}/list plugins[0]: refused (code 7): "))).expect(&out.stdout);
    assert!(list_line.contains("198.18.99.0/33"), "{list_line}");
    assert_eq!(lines[3], "3 config(s) of hereabouts or whereabouts, 2 refused");
    assert!(!out.stdout.contains("other"), "a host-local NAD is not hereabouts': {}", out.stdout);
}

/// `ipam check` finds each kind of inconsistency planted in the cluster (exit status 1); `--repair` fixes exactly
/// the safe ones — the gone pod's entry, the orphaned reservation, the missing reservation — with the reconciler's
/// rule and writes, and leaves what needs a person: the address held twice, the offset Whereabouts cannot read,
/// the gone node's slice.
#[tokio::test]
async fn ipam_check_finds_each_planted_inconsistency_and_repair_fixes_exactly_the_safe_ones() {
    use hereabouts_ipam::crd::{NodeSlicePool, OverlappingRangeIpReservation};
    use kube::api::{DeleteParams, PostParams};

    let fx = CniFixture::new("ctl-check").await;
    let admin = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let ns = fx.ns.clone();
    let cfg = fx.netconf("1.0.0", "chk", json!({"range": "198.18.101.0/24"}));
    for pod in ["live", "held", "intruder"] {
        runtime::create_pod(&fx.admin, &ns, pod, "node-a", &[]).await.unwrap();
    }
    for pod in ["live", "gone", "held", "ghost"] {
        assert!(fx.add(&cfg, pod, &format!("c-{pod}")).await.success);
    }
    let reservations = Api::<OverlappingRangeIpReservation>::namespaced(fx.admin.clone(), &ns);
    reservations.delete("198.18.101.3", &DeleteParams::default()).await.unwrap();
    let pools = Api::<IpPool>::namespaced(fx.admin.clone(), &ns);
    let drop_ghost =
        Patch::Json::<()>(serde_json::from_value(json!([{"op": "remove", "path": "/spec/allocations/4"}])).unwrap());
    pools.patch("198.18.101.0-24", &PatchParams::default(), &drop_ghost).await.unwrap();
    let twice = mk_pool("198.18.101.0-25", "198.18.101.0/25").entry(1, mk_entry("c-x", &format!("{ns}/intruder")));
    pools.create(&PostParams::default(), &twice.build()).await.unwrap();
    let high = mk_pool("2001-db8-65---64", "2001:db8:65::/64")
        .entry("9223372036854775813", mk_entry("c-u", &format!("{ns}/intruder")));
    pools.create(&PostParams::default(), &high.build()).await.unwrap();
    let slices: NodeSlicePool = serde_json::from_value(json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "NodeSlicePool", "metadata": {"name": "slicenet"},
        "spec": {"range": "198.18.102.0/24", "sliceSize": "/26"},
        "status": {"allocations": [{"nodeName": "node-gone", "sliceRange": "198.18.102.0/26"},
                                   {"nodeName": "", "sliceRange": "198.18.102.64/26"}]}}))
    .unwrap();
    Api::<NodeSlicePool>::namespaced(fx.admin.clone(), &ns).create(&PostParams::default(), &slices).await.unwrap();

    // ages below the settle time would take the claims of ADDs under way: refused unless said to be meant
    let refused = ctl(&admin, &ns, &["ipam", "check", "--repair", "--orphan-age", "0s"]).await;
    assert!(!refused.success, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("--orphan-age 0 s is below the settle time (300 s)")
            && refused.stderr.contains("--unsafe-ages"),
        "{}",
        refused.stderr
    );
    assert!(!refused.stdout.contains("repaired"), "nothing repaired: {}", refused.stdout);
    let names: BTreeSet<String> = fx.reservations().await.into_iter().filter_map(|r| r.metadata.name).collect();
    assert!(names.contains("198.18.101.4"), "the orphan candidate is still there: {names:?}");
    let ages = ["--grace", "0s", "--orphan-age", "0s", "--unsafe-ages"];
    // ages are judged on the API server's clock, known to the second (its Date header) and taken at the second's
    // start: what was written within the last second is not yet older than a 0 s grace
    let aged = hereabouts_tests::wait::until(
        std::time::Duration::from_secs(10),
        "the planted entries a second old",
        || async {
            let check = ctl(&admin, &ns, &[&["ipam", "check"][..], &ages].concat()).await;
            check.stdout.contains("6 found").then_some(check)
        },
    )
    .await;
    let check = match aged {
        Ok(check) => check,
        Err(_) => ctl(&admin, &ns, &[&["ipam", "check"][..], &ages].concat()).await,
    };
    eprintln!("$ kubectl hereabouts -n {ns} ipam check --grace 0s --orphan-age 0s --unsafe-ages\n{}", check.stdout);
    assert!(!check.success, "findings make the exit status 1");
    let expected = [
        format!(
            "stale entry: 198.18.101.2 in pool 198.18.101.0-24 is held by {ns}/gone, whose pod is gone (pod_deleted)"
        ),
        format!("missing reservation: 198.18.101.3 in pool 198.18.101.0-24 is held by live pod {ns}/held without one"),
        format!("orphaned reservation: 198.18.101.4 ({ns}/ghost) has no entry in any pool"),
        format!("held twice: 198.18.101.1 by {ns}/intruder and {ns}/live"),
        "unreadable offset: pool 2001-db8-65---64 has an entry at 9223372036854775813, which Whereabouts cannot read"
            .to_string(),
        "gone node's slice: 198.18.102.0/26 of slicenet belongs to node node-gone, which is gone".to_string(),
        "6 found".to_string(),
    ];
    let lines: BTreeSet<&str> = check.stdout.lines().collect();
    for line in &expected {
        assert!(lines.contains(line.as_str()), "missing {line:?} in:\n{}", check.stdout);
    }
    assert_eq!(lines.len(), expected.len(), "{}", check.stdout);
    assert_eq!(fx.pool("198.18.101.0-24").await.spec.allocations.len(), 3, "check alone changes nothing");

    let repair = ctl(&admin, &ns, &[&["ipam", "check", "--repair"][..], &ages].concat()).await;
    eprintln!(
        "$ kubectl hereabouts -n {ns} ipam check --repair --grace 0s --orphan-age 0s --unsafe-ages\n{}",
        repair.stdout
    );
    assert!(!repair.success, "what needs a person is left: {}", repair.stdout);
    assert!(
        repair.stdout.contains("repaired: 1 entries released, 1 reservations released, 1 reservations restored"),
        "{}",
        repair.stdout
    );
    let left: Vec<&str> = repair.stdout.lines().filter(|l| l.starts_with("left: ")).collect();
    assert_eq!(left.len(), 3, "{}", repair.stdout);
    assert!(left.iter().any(|l| l.starts_with("left: held twice")), "{left:?}");
    assert!(left.iter().any(|l| l.starts_with("left: unreadable offset")), "{left:?}");
    assert!(left.iter().any(|l| l.starts_with("left: gone node's slice")), "{left:?}");
    let main_pool = fx.pool("198.18.101.0-24").await;
    let held: Vec<&String> = main_pool.spec.allocations.keys().collect();
    assert_eq!(held, ["1", "3"], "the gone pod's entry went, the live ones stayed");
    let names: BTreeSet<String> = fx.reservations().await.into_iter().filter_map(|r| r.metadata.name).collect();
    assert_eq!(
        names,
        BTreeSet::from(["198.18.101.1".to_string(), "198.18.101.3".to_string()]),
        "restored .3, released .4"
    );
}

/// Without `-n` the CLI finds the pools where hereabouts runs: the namespace of the DaemonSet labelled
/// `app.kubernetes.io/name=hereabouts`, not the kubeconfig context's (here `default`, as after `kubens`). A
/// namespace without pools says where to look instead of printing an empty table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_namespace_it_reads_the_pools_where_hereabouts_runs() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let fx = CniFixture::new("ctl-where").await;
    let config = fx.netconf("1.0.0", "where", json!({"range": "198.18.103.0/28"}));
    assert!(fx.invocation("ADD", &config, "p1", "c-p1").with_env("NODENAME", "node-a").run().await.success);
    let daemonset: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "hereabouts", "labels": {"app.kubernetes.io/name": "hereabouts"}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "hereabouts"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "hereabouts"}},
                "spec": {"nodeSelector": {"example.com/none": "none"}, "containers": [{"name": "c", "image": "none"}]}
            }
        }
    }))
    .unwrap();
    let sets = Api::<DaemonSet>::namespaced(fx.admin.clone(), &fx.ns);
    sets.create(&Default::default(), &daemonset).await.unwrap();
    let elsewhere = fx.cluster.kubeconfig(Identity::Admin, "default");

    let shown = hereabouts_tests::ctl::ctl_as_is(&elsewhere, &["ipam", "show", "-o", "json"]).await;
    sets.delete("hereabouts", &Default::default()).await.unwrap();
    assert!(shown.success, "{}", shown.stderr);
    let rows: Vec<Value> = serde_json::from_str(&shown.stdout).unwrap();
    let pools: Vec<&str> = rows.iter().filter_map(|r| r["pool"].as_str()).collect();
    assert_eq!(pools, ["198.18.103.0-28"], "the pools of {}, where the DaemonSet is", fx.ns);

    let empty = ctl(&elsewhere, "default", &["ipam", "show"]).await;
    assert!(empty.success, "{}", empty.stderr);
    assert!(empty.stderr.contains("no IPPools in namespace default"), "a hint: {}", empty.stderr);
}

/// `ipam check --report` writes what it found (and says on stderr what it reads: the pods of each namespace by
/// paged LISTs); `ipam release --from-report` gives back the report's stale entries, each judged again: one whose
/// address another pod took since the report is left alone, and a live pod's address is never touched. A report
/// of another namespace than `-n` is refused.
#[tokio::test]
async fn a_checks_report_releases_only_what_is_still_as_reported() {
    let fx = CniFixture::new("ctl-report").await;
    let admin = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let ns = fx.ns.clone();
    let cfg = fx.netconf("1.0.0", "rep", json!({"range": "198.18.104.0/24"}));
    runtime::create_pod(&fx.admin, &ns, "live", "node-a", &[]).await.unwrap();
    for pod in ["live", "gone-1", "gone-2"] {
        assert!(fx.add(&cfg, pod, &format!("c-{pod}")).await.success);
    }
    age_entries(&fx, "198.18.104.0-24", 600).await;
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let report_arg = report.to_str().unwrap();

    let check = ctl(&admin, &ns, &["ipam", "check", "--report", report_arg]).await;
    eprintln!("$ kubectl hereabouts -n {ns} ipam check --report report.json\n{}{}", check.stdout, check.stderr);
    assert!(!check.success, "findings: exit status 1");
    assert!(check.stdout.contains("2 found"), "{}", check.stdout);
    assert!(check.stderr.contains("checking: 1 pools with 3 entries and 3 reservations"), "{}", check.stderr);
    assert!(check.stderr.contains(&format!("checking: namespace 1/1: {ns}, 1 pods")), "{}", check.stderr);
    let written: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(written["namespace"], ns.as_str());
    assert_eq!(written["findings"].as_array().unwrap().len(), 2, "{written}");

    // since the report: gone-2's address was released and a new pod took it
    let by_hand = ctl(&admin, &ns, &["ipam", "release", "--ip", "198.18.104.3"]).await;
    assert!(by_hand.success, "{}", by_hand.stdout);
    runtime::create_pod(&fx.admin, &ns, "newcomer", "node-a", &[]).await.unwrap();
    assert!(fx.add(&cfg, "newcomer", "c-newcomer").await.success);
    let pool = fx.pool("198.18.104.0-24").await;
    assert_eq!(pool.spec.allocations["3"].podref, format!("{ns}/newcomer"), "the newcomer took .3");

    let elsewhere = ctl(&admin, "default", &["ipam", "release", "--from-report", report_arg]).await;
    assert!(!elsewhere.success);
    assert!(
        elsewhere.stderr.contains(&format!("the report is of namespace {ns}, not default")),
        "{}",
        elsewhere.stderr
    );
    let forced = ctl(&admin, &ns, &["ipam", "release", "--from-report", report_arg, "--force"]).await;
    assert!(!forced.success, "--force is for one address, never a report: {}", forced.stdout);
    assert!(forced.stderr.contains("cannot be used with"), "{}", forced.stderr);

    let released = hereabouts_tests::ctl::ctl_as_is(&admin, &["ipam", "release", "--from-report", report_arg]).await;
    eprintln!("$ kubectl hereabouts ipam release --from-report report.json\n{}", released.stdout);
    assert!(released.success, "{}{}", released.stdout, released.stderr);
    assert!(
        released
            .stdout
            .contains(&format!("released 198.18.104.2 in pool 198.18.104.0-24 from {ns}/gone-1 (pod_deleted)")),
        "{}",
        released.stdout
    );
    assert!(
        released
            .stdout
            .contains(&format!("left alone: 198.18.104.3 in pool 198.18.104.0-24 is no longer held by {ns}/gone-2")),
        "{}",
        released.stdout
    );
    let held: BTreeSet<String> =
        fx.pool("198.18.104.0-24").await.spec.allocations.values().map(|e| e.podref.clone()).collect();
    assert_eq!(held, BTreeSet::from([format!("{ns}/live"), format!("{ns}/newcomer")]), "the live pods keep theirs");
}

/// `-A` lists the pools of every namespace with a NAMESPACE column; `-o yaml` says what `-o json` says; the
/// completion script names the commands.
#[tokio::test]
async fn ipam_show_reads_every_namespace_and_speaks_yaml() {
    let fx = CniFixture::new("ctl-all").await;
    let admin = fx.cluster.kubeconfig(Identity::Admin, &fx.ns);
    let cfg = fx.netconf("1.0.0", "all", json!({"range": "198.18.105.0/28"}));
    assert!(fx.add(&cfg, "p1", "c-p1").await.success);

    let json_rows: Vec<Value> =
        serde_json::from_str(&ctl(&admin, &fx.ns, &["ipam", "show", "-o", "json"]).await.stdout).unwrap();
    let yaml = ctl(&admin, &fx.ns, &["ipam", "show", "-o", "yaml"]).await;
    assert!(yaml.success, "{}", yaml.stderr);
    let yaml_rows: Vec<Value> = serde_yaml_ng::from_str(&yaml.stdout).unwrap();
    assert_eq!(yaml_rows, json_rows);
    assert_eq!(json_rows[0]["namespace"], fx.ns.as_str());

    let every = hereabouts_tests::ctl::ctl_as_is(&admin, &["ipam", "show", "-A"]).await;
    assert!(every.success, "{}", every.stderr);
    let lines: Vec<&str> = every.stdout.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header[..2], ["NAMESPACE", "POOL"], "{}", every.stdout);
    let ours = lines.iter().find(|l| l.starts_with(&format!("{} ", fx.ns))).expect("a row of this namespace");
    let words: Vec<&str> = ours.split_whitespace().collect();
    assert_eq!(words[1..], ["198.18.105.0-28", "198.18.105.0/28", "-", "-", "14", "1", "13"], "{}", every.stdout);

    let completion = hereabouts_tests::ctl::ctl_as_is(&admin, &["completion", "bash"]).await;
    assert!(completion.success, "{}", completion.stderr);
    for word in ["kubectl-hereabouts", "ipam", "release", "--from-report", "--all-namespaces"] {
        assert!(completion.stdout.contains(word), "the bash completion knows {word}");
    }
}
