//! The verbs over the in-memory store, in the cases a fleet mixed with Whereabouts or its maintained fork makes:
//! objects those tools wrote, as they write them.

use std::path::{Path, PathBuf};

use super::*;
use crate::crd::{IpAllocation, IpPool, IpPoolSpec, OverlappingRangeIpReservationSpec};
use crate::store::{Claim, MemoryStore, ReservationStore};

/// One machine: the shared in-memory store, no routing table, no host lock, and no attachment marks.
struct TestHost(MemoryStore);

impl TestHost {
    /// The same machine with attachment marks ([`crate::marks`]) in `dir`, in its first boot.
    fn marked(self, dir: &Path) -> MarkedHost {
        MarkedHost(self, dir.to_path_buf(), "boot-1".into())
    }
}

/// A [`TestHost`] that keeps attachment marks in a directory, and the boot it is in.
struct MarkedHost(TestHost, PathBuf, String);

impl MarkedHost {
    /// The same machine after a reboot.
    fn rebooted(self) -> MarkedHost {
        let boot = format!("{}-again", self.2);
        MarkedHost(self.0, self.1, boot)
    }
}

impl Host for MarkedHost {
    type Store = MemoryStore;
    type Table = KernelTable;

    async fn connect(&self, kubeconfig: &Path) -> Result<MemoryStore, ConnectError> {
        self.0.connect(kubeconfig).await
    }

    fn table(&self) -> Result<KernelTable, TableError> {
        self.0.table()
    }

    fn lock_dir(&self) -> Option<PathBuf> {
        self.0.lock_dir()
    }

    fn marks_dir(&self) -> Option<PathBuf> {
        Some(self.1.clone())
    }

    fn boot_id(&self) -> Option<String> {
        Some(self.2.clone())
    }
}

impl Host for TestHost {
    type Store = MemoryStore;
    type Table = KernelTable;

    async fn connect(&self, _kubeconfig: &Path) -> Result<MemoryStore, ConnectError> {
        Ok(self.0.clone())
    }

    fn table(&self) -> Result<KernelTable, TableError> {
        Err(TableError::Netlink { op: "open a netlink socket", detail: "not in these tests".into() })
    }

    fn lock_dir(&self) -> Option<PathBuf> {
        None
    }
}

const NS: &str = "kube-system";

fn config(ipam: serde_json::Value, pod: &str) -> IpamConfig {
    let mut ipam = ipam;
    ipam["type"] = "hereabouts".into();
    ipam["kubernetes"] = serde_json::json!({"kubeconfig": "/k"});
    let stdin = serde_json::json!({"cniVersion": "1.0.0", "name": "net", "type": "macvlan", "ipam": ipam}).to_string();
    let args = format!("K8S_POD_NAMESPACE=ns;K8S_POD_NAME={pod};K8S_POD_UID={pod}-uid");
    crate::config::load_with_paths(&crate::config::Input { stdin: stdin.as_bytes(), cni_args: &args }, &[]).unwrap()
}

fn request(container: &str, node: &str) -> Request {
    Request { container_id: container.into(), ifname: "net1".into(), node: node.into() }
}

#[tokio::test]
async fn an_address_the_fork_reserved_under_its_ipv6_name_is_not_handed_out() {
    let store = MemoryStore::new(NS);
    let fork = Claim {
        spec: OverlappingRangeIpReservationSpec {
            podref: "ns/forks-pod".into(),
            ifname: "net1".into(),
            containerid: String::new(),
            ipamclaim: None,
        },
        node: "node-b".into(),
        at: crate::clock::now(),
    };
    let held = crate::names::expanded_reservation_name("", "2001:db8::1".parse().unwrap()).unwrap();
    store.create_reservation(&held, &fork).await.unwrap();
    let cfg = config(serde_json::json!({"range": "2001:db8::/125"}), "web-0");
    let assigned = add(&TestHost(store.clone()), &cfg, &request("c1", "node-a")).await.unwrap();
    assert_eq!(assigned[0].ip.to_string(), "2001:db8::2", "::1 is the fork's");
    let names: Vec<String> = store.reservations().into_iter().filter_map(|r| r.metadata.name).collect();
    assert!(!names.contains(&"2001-db8--1".to_string()), "no claim of ours left on ::1: {names:?}");
}

#[tokio::test]
async fn gc_leaves_an_entry_whereabouts_took_over_for_a_new_sandbox() {
    let store = MemoryStore::new(NS);
    // written by hereabouts' ADD of web-0's first sandbox on node-a, long ago; then web-0 was recreated and
    // Whereabouts' ADD of its new sandbox (on node-b) reused the entry by rewriting only `id`
    let entry = IpAllocation {
        id: "whereabouts-sandbox".into(),
        podref: "ns/web-0".into(),
        ifname: "net1".into(),
        poduid: Some("uid-of-the-old-pod".into()),
        allocated: Some("2026-01-01T00:00:00Z".into()),
        node: Some("node-a".into()),
        network: Some("net".into()),
        reserved: true,
        statefulset: None,
        ipamclaim: None,
        recorded_for: Some("hereabouts-sandbox".into()),
    };
    let spec = IpPoolSpec {
        range: "198.18.0.0/29".into(),
        allocations: [("1".to_string(), entry)].into(),
        ..IpPoolSpec::default()
    };
    store.put_pool(IpPool::new("198.18.0.0-29", spec));
    let cfg = ReleaseConfig::from(config(serde_json::json!({"range": "198.18.0.0/29"}), "gc"));
    // node-a's runtime no longer has the first sandbox
    let released = gc(&TestHost(store.clone()), &cfg, &request("", "node-a"), &[]).await.unwrap();
    assert_eq!(released, 0, "the entry is the new sandbox's now: its node and UID are the old one's");
    assert_eq!(store.pools()[0].spec.allocations.len(), 1);
}

#[tokio::test]
async fn a_release_time_a_fast_clock_wrote_cools_for_the_cooldown_only() {
    let store = MemoryStore::new(NS);
    let other = IpAllocation { id: "c0".into(), podref: "ns/other".into(), ..IpAllocation::default() };
    let hours_ahead = (crate::clock::now() + k8s_openapi::jiff::SignedDuration::from_hours(3)).to_string();
    let spec = IpPoolSpec {
        range: "198.18.0.0/30".into(),
        allocations: [("2".to_string(), other)].into(),
        released: Some([("1".to_string(), hours_ahead.clone())].into()),
        ..IpPoolSpec::default()
    };
    let mut pool = IpPool::new("198.18.0.0-30", spec);
    pool.metadata.annotations = Some([(crate::cooldown::COOLDOWN_ANNOTATION.to_string(), "1".to_string())].into());
    store.put_pool(pool);
    let cfg = config(serde_json::json!({"range": "198.18.0.0/30", "reuse_cooldown_seconds": 1}), "web-0");
    let host = TestHost(store.clone());
    let cooling = add(&host, &cfg, &request("c1", "node-a")).await.unwrap_err();
    assert_eq!(cooling.code, Code::TryAgainLater, "{}", cooling.details);
    let record = store.pools()[0].spec.released.clone().unwrap()["1"].clone();
    assert_ne!(record, hours_ahead, "rewritten as the reader's now");
    // the cooldown must pass, from when the record was first read
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let assigned = add(&host, &cfg, &request("c1", "node-a")).await.unwrap();
    assert_eq!(assigned[0].ip.to_string(), "198.18.0.1", "free a cooldown after it was read, not hours later");
}

/// Re-assigns the slices of the NodeSlicePool: `owner` maps each slice and its owner to the new owner.
fn reassign(store: &MemoryStore, owner: impl Fn(&ipnet::IpNet, &str) -> String) {
    let mut slices = store.node_slices().pop().expect("the NodeSlicePool");
    for slice in &mut slices.status.as_mut().expect("its slices").allocations {
        slice.node_name = owner(&slice.slice_range.parse().unwrap(), &slice.node_name);
    }
    store.put_node_slices(slices);
}

/// The node whose slice holds `ip`, as the NodeSlicePool lists it.
fn owner_of(store: &MemoryStore, ip: std::net::IpAddr) -> String {
    let slices = store.node_slices()[0].status.clone().unwrap().allocations;
    slices.into_iter().find(|s| s.slice_range.parse::<ipnet::IpNet>().unwrap().contains(&ip)).unwrap().node_name
}

/// On a /28 in /30 slices: four nodes claim a slice each, then node-a's ADDs fill its own until one borrows.
/// Returns that attachment's config, its borrowed address, and how many attachments there are.
async fn until_node_a_borrows(host: &impl Host, store: &MemoryStore) -> (IpamConfig, std::net::IpAddr, usize) {
    let ipam = serde_json::json!({"range": "198.18.0.0/28", "node_slice_size": "/30"});
    for node in ["node-a", "node-b", "node-c", "node-d"] {
        add(host, &config(ipam.clone(), node), &request(node, node)).await.unwrap();
    }
    let mut attachments = 4;
    loop {
        let cfg = config(ipam.clone(), &format!("p{attachments}"));
        let ip = add(host, &cfg, &request(&format!("c{attachments}"), "node-a")).await.unwrap()[0].ip;
        attachments += 1;
        if owner_of(store, ip) != "node-a" {
            return (cfg, ip, attachments);
        }
        assert!(attachments < 8, "a /30 holds at most four");
    }
}

#[tokio::test]
async fn a_retried_add_finds_its_borrowed_entry_after_a_slice_is_freed() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let (cfg, borrowed, attachments) = until_node_a_borrows(&host, &store).await;
    // a node other than the lender left: its slice is free again; then the runtime retries the same ADD
    let lender = owner_of(&store, borrowed);
    reassign(&store, |_, node| if node == "node-a" || node == lender { node.to_string() } else { String::new() });
    let retried = request(&format!("c{}", attachments - 1), "node-a");
    let again = add(&host, &cfg, &retried).await.unwrap()[0].ip;
    assert_eq!(again, borrowed, "the retried ADD keeps its borrowed address");
    let entries: usize = store.pools().iter().map(|p| p.spec.allocations.len()).sum();
    assert_eq!(entries, attachments, "one entry per attachment: {:?}", store.pools());
}

#[tokio::test]
async fn every_slice_claimed_and_a_pool_not_made_yet_is_waited_for_not_called_full() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let ipam = serde_json::json!({"range": "198.18.0.0/28", "node_slice_size": "/30"});
    add(&host, &config(ipam.clone(), "first"), &request("c0", "node-a")).await.unwrap();
    del(&host, &ReleaseConfig::from(config(ipam.clone(), "first")), &request("c0", "node-a")).await.unwrap();
    // four other nodes claimed the four slices a moment ago; none has created its slice pool yet
    let others = ["node-b", "node-c", "node-d", "node-e"];
    let slices: Vec<ipnet::IpNet> = store.node_slices()[0]
        .status
        .clone()
        .unwrap()
        .allocations
        .iter()
        .map(|s| s.slice_range.parse().unwrap())
        .collect();
    reassign(&store, |cidr, _| others[slices.iter().position(|s| s == cidr).unwrap()].to_string());
    let owner = store.clone();
    let third = slices[2];
    let late = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        let name = crate::names::slice_pool_name("", "node-d", third);
        owner.create_pool(&crate::store::NewPool::new(&name, &third.to_string(), 4)).await.unwrap();
    });
    let got = add(&host, &config(ipam.clone(), "p1"), &request("c1", "node-a")).await;
    late.await.unwrap();
    let ip = got.expect("the range is not full: node-d's pool came")[0].ip;
    assert!(third.contains(&ip), "{ip} borrowed in node-d's slice {third}");
}

#[tokio::test]
async fn a_first_add_lists_no_reservations_and_a_retried_one_still_finds_its_borrowed_entry() {
    use crate::store::memory::{Fault, FaultPlan, Op};
    let marks = tempfile::tempdir().unwrap();
    let store = MemoryStore::new(NS);
    // every LIST of reservations refused: a first ADD that looked for a borrowed entry would fail
    let plan = (1..=64).fold(FaultPlan::quiet(1), |p, n| p.at(Op::ListReservations, n, Fault::Refused));
    let first = TestHost(store.handle("first-adds", plan)).marked(marks.path());
    let (cfg, borrowed, n) = until_node_a_borrows(&first, &store).await;
    // a slice frees; the runtime retries the same ADD: its mark is there, so it looks, and finds its entry
    let lender = owner_of(&store, borrowed);
    reassign(&store, |_, node| if node == "node-a" || node == lender { node.to_string() } else { String::new() });
    let retry = TestHost(store.clone()).marked(marks.path());
    let again = add(&retry, &cfg, &request(&format!("c{}", n - 1), "node-a")).await.unwrap()[0].ip;
    assert_eq!(again, borrowed, "the retried ADD keeps its borrowed address");
    let entries: usize = store.pools().iter().map(|p| p.spec.allocations.len()).sum();
    assert_eq!(entries, n, "one entry per attachment");
    // its DEL leaves the mark: a new sandbox of the pod, or its DEL arriving late, still finds it
    del(&retry, &ReleaseConfig::from(cfg.clone()), &request(&format!("c{}", n - 1), "node-a")).await.unwrap();
    assert!(!crate::marks::first_add(marks.path(), "boot-1", &cfg.name, &cfg.pod.to_string(), "net1"));
}

/// S12 of the fourth review: a pod borrowed an address in another node's slice; the node reboots and the pod's
/// sandbox is made again there, without a DEL of the old one. With the marks on a tmpfs its ADD was the first since
/// boot, which skipped the search of every pool and took a second address while the old entry stayed the pod's.
/// The marks of the boot before, kept on disk, make it look: it keeps its address.
#[tokio::test]
async fn a_pod_that_borrowed_before_a_reboot_keeps_its_address_after_it() {
    let disk = tempfile::tempdir().unwrap();
    let marks = disk.path().join("attachments");
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone()).marked(&marks);
    let (cfg, borrowed, n) = until_node_a_borrows(&host, &store).await;
    // the reboot; the pod's new sandbox is made on the same node
    let host = host.rebooted();
    let again = add(&host, &cfg, &request("after-reboot", "node-a")).await.unwrap()[0].ip;
    assert_eq!(again, borrowed, "the pod keeps the address it borrowed before the reboot");
    let entries: usize = store.pools().iter().map(|p| p.spec.allocations.len()).sum();
    assert_eq!(entries, n, "one entry per attachment: {:?}", held(&store));
}

#[tokio::test]
async fn the_node_slice_pool_spells_the_slice_size_as_the_config_does() {
    for spelled in ["26", "/26"] {
        let store = MemoryStore::new(NS);
        let cfg = config(serde_json::json!({"range": "198.18.0.0/24", "node_slice_size": spelled}), "p");
        add(&TestHost(store.clone()), &cfg, &request("c", "node-a")).await.unwrap();
        assert_eq!(store.node_slices()[0].spec.slice_size, spelled);
    }
}

/// The address each pod holds, by pod, over every pool.
fn held(store: &MemoryStore) -> Vec<(String, std::net::IpAddr)> {
    let mut found = Vec::new();
    for pool in store.pools() {
        let network = pool.spec.range.parse::<ipnet::IpNet>().unwrap().network();
        for (offset, entry) in &pool.spec.allocations {
            let offset: u128 = offset.parse().unwrap();
            let ip = match network {
                std::net::IpAddr::V4(n) => std::net::IpAddr::V4((u32::from(n) + offset as u32).into()),
                std::net::IpAddr::V6(n) => std::net::IpAddr::V6((u128::from(n) + offset).into()),
            };
            found.push((entry.podref.clone(), ip));
        }
    }
    found
}

fn assert_no_address_twice(store: &MemoryStore) {
    let held = held(store);
    let distinct: std::collections::BTreeSet<_> = held.iter().map(|(_, ip)| ip).collect();
    assert_eq!(distinct.len(), held.len(), "an address held twice: {held:?}");
}

#[tokio::test]
async fn a_lost_node_slice_pool_comes_back_with_the_slices_in_use() {
    // the finding: a /30 in /31 slices, overlap off; node-b's pod holds an address; the NodeSlicePool is deleted
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let ipam = serde_json::json!({"range": "198.18.200.0/30", "node_slice_size": "/31",
        "enable_overlapping_ranges": false});
    let b = add(&host, &config(ipam.clone(), "on-b"), &request("cb", "node-b")).await.unwrap()[0].ip;
    assert!(store.force_delete_node_slices("net"));
    for i in 0..2 {
        match add(&host, &config(ipam.clone(), &format!("on-a-{i}")), &request(&format!("ca{i}"), "node-a")).await {
            Ok(assigned) => assert_ne!(assigned[0].ip, b, "node-b's pod holds {b}"),
            Err(e) => assert_eq!(e.code, Code::RangeExhausted, "{}", e.details),
        }
    }
    assert_no_address_twice(&store);
    let owner_of_b = |store: &MemoryStore| {
        let listing = store.node_slices().pop().unwrap().status.unwrap().allocations;
        listing.into_iter().find(|s| s.slice_range.parse::<ipnet::IpNet>().unwrap().contains(&b)).unwrap().node_name
    };
    assert_eq!(owner_of_b(&store), "", "node-a re-created it with its own slices only");
    // the leader gives node-b its slice back
    let mut keeper = crate::slices::keep::Keeper::new(store.clone(), std::time::Duration::ZERO);
    let live = ["node-a", "node-b"].map(String::from).into();
    assert_eq!(keeper.pass(&live, &Default::default()).await.unwrap().returned, 1);
    assert_eq!(owner_of_b(&store), "node-b");
}

#[tokio::test]
async fn a_slice_freed_under_its_entries_is_not_claimed() {
    // Whereabouts' controller frees a gone node's slice whatever its pool holds
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let ipam = serde_json::json!({"range": "198.18.200.0/30", "node_slice_size": "/31",
        "enable_overlapping_ranges": false});
    let b = add(&host, &config(ipam.clone(), "on-b"), &request("cb", "node-b")).await.unwrap()[0].ip;
    reassign(&store, |_, _| String::new());
    for i in 0..3 {
        let _ = add(&host, &config(ipam.clone(), &format!("on-a-{i}")), &request(&format!("ca{i}"), "node-a")).await;
    }
    assert_no_address_twice(&store);
    assert!(held(&store).contains(&("ns/on-b".to_string(), b)));
}

#[tokio::test]
async fn under_whereabouts_schema_a_cooldown_add_fails_naming_the_crd_and_writes_nothing() {
    let store = MemoryStore::new(NS).with_whereabouts_schema();
    let cfg = config(serde_json::json!({"range": "198.18.0.0/30", "reuse_cooldown_seconds": 5}), "web-0");
    let err = add(&TestHost(store.clone()), &cfg, &request("c1", "node-a")).await.unwrap_err();
    assert_eq!(err.code, Code::StoreRefused, "{}", err.details);
    for part in ["ippools.whereabouts.cni.cncf.io", "spec.released", "reuse_cooldown_seconds", "crds/"] {
        assert!(err.details.contains(part), "{part} in {}", err.details);
    }
    assert!(held(&store).is_empty() && store.reservations().is_empty(), "nothing written is left");
    // nor the cooldown, which would refuse every later ADD of the pool, with a cooldown or not
    let plain = config(serde_json::json!({"range": "198.18.0.0/30"}), "web-1");
    add(&TestHost(store.clone()), &plain, &request("c2", "node-a")).await.unwrap();
}

#[tokio::test]
async fn under_whereabouts_schema_a_release_is_not_kept_hostage_to_its_cooldown_record() {
    // the entry was added by a config without the cooldown (or by Whereabouts); the DEL's config has one
    let store = MemoryStore::new(NS).with_whereabouts_schema();
    let host = TestHost(store.clone());
    add(&host, &config(serde_json::json!({"range": "198.18.0.0/30"}), "web-0"), &request("c1", "node-a"))
        .await
        .unwrap();
    let cooling = config(serde_json::json!({"range": "198.18.0.0/30", "reuse_cooldown_seconds": 5}), "web-0");
    del(&host, &ReleaseConfig::from(cooling), &request("c1", "node-a")).await.unwrap();
    assert!(held(&store).is_empty(), "released: {:?}", held(&store));
    assert!(store.reservations().is_empty());
}

#[tokio::test]
async fn under_whereabouts_schema_a_sticky_add_fails_naming_the_crd() {
    let store = MemoryStore::new(NS).with_whereabouts_schema();
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: "web".into(),
        controller: Some(true),
        ..Default::default()
    };
    let meta = crate::store::ObjectMeta { owner_references: Some(vec![owner]), ..Default::default() };
    store.put_core(crate::store::CoreObject::Pod, "ns", "web-0", meta);
    let cfg = config(serde_json::json!({"range": "198.18.0.0/30", "sticky_statefulset": true}), "web-0");
    refused_for_a_pruned_field(&store, &cfg, "spec.allocations.*.statefulset").await;
}

/// The ADD of `cfg` under Whereabouts' schema (`store`) fails with 103 naming `field`, and leaves nothing behind.
async fn refused_for_a_pruned_field(store: &MemoryStore, cfg: &IpamConfig, field: &str) {
    let err = add(&TestHost(store.clone()), cfg, &request("c1", "node-a")).await.unwrap_err();
    assert_eq!(err.code, Code::StoreRefused, "{}", err.details);
    assert!(err.details.contains(field), "{}", err.details);
    assert!(held(store).is_empty(), "rolled back: {:?}", held(store));
}

/// A range grown while pods hold addresses of the old one, with no reservations to say so (issue 28's finding:
/// `enable_overlapping_ranges: false`, a /30 grown to a /29 handed out .1 a second time): the grown range's pool
/// is a new one, and its ADDs never hand out an address the old pool still holds; the grown range fills up with
/// what is left.
#[tokio::test]
async fn a_grown_range_never_hands_out_what_the_old_range_still_holds() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let old = serde_json::json!({"range": "198.18.61.0/30", "enable_overlapping_ranges": false});
    let grown = serde_json::json!({"range": "198.18.61.0/29", "enable_overlapping_ranges": false});
    let mut old_held = Vec::new();
    for i in 0..2 {
        old_held.push(
            add(&host, &config(old.clone(), &format!("old-{i}")), &request(&format!("co{i}"), "n")).await.unwrap()[0]
                .ip,
        );
    }
    for i in 0..4 {
        let ip =
            add(&host, &config(grown.clone(), &format!("new-{i}")), &request(&format!("cn{i}"), "n")).await.unwrap()[0]
                .ip;
        assert!(!old_held.contains(&ip), "{ip} is still held in the old range's pool by a pod of {old_held:?}");
    }
    assert_no_address_twice(&store);
    let full = add(&host, &config(grown.clone(), "new-4"), &request("cn4", "n")).await.unwrap_err();
    assert_eq!(full.code, Code::RangeExhausted, "six usable, two held in the old pool: {}", full.details);

    // an old pod's DEL runs with the NAD as it is now: it finds the pod's entry in the pool the new one replaced
    let released = del(&host, &ReleaseConfig::from(config(grown.clone(), "old-0")), &request("co0", "n")).await;
    assert_eq!(released.unwrap(), 1, "the old pool's entry released");
    let old_pool = store.pools().into_iter().find(|p| p.spec.range == "198.18.61.0/30").unwrap();
    assert_eq!(old_pool.spec.allocations.len(), 1, "only old-1's entry is left");
    let reused = add(&host, &config(grown.clone(), "new-4"), &request("cn4", "n")).await.unwrap()[0].ip;
    assert_eq!(reused, old_held[0], "the address old-0 gave back");
    assert_no_address_twice(&store);
}

/// A reuse cooldown runs on across a grown range: an address given up in the old range's pool is not handed out by
/// the new pool until its cooldown is over, and the emptied old pool retires once no address in it cools (its
/// expired release records, which no ADD of the old config prunes any more, do not keep it).
#[tokio::test]
async fn a_reuse_cooldown_runs_on_across_a_grown_range_and_the_old_pool_retires_after_it() {
    use crate::reconcile::retire::retire_replaced;
    use k8s_openapi::jiff::SignedDuration;
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let old = serde_json::json!({"range": "198.18.64.0/30", "reuse_cooldown_seconds": 900});
    let grown = serde_json::json!({"range": "198.18.64.0/29", "reuse_cooldown_seconds": 900});
    let given = add(&host, &config(old.clone(), "old-0"), &request("co0", "n")).await.unwrap()[0].ip;
    assert_eq!(given, "198.18.64.1".parse::<std::net::IpAddr>().unwrap());
    del(&host, &ReleaseConfig::from(config(old.clone(), "old-0")), &request("co0", "n")).await.unwrap();
    let next = add(&host, &config(grown.clone(), "new-0"), &request("cn0", "n")).await.unwrap()[0].ip;
    assert_ne!(next, given, "{given} cools in the pool the grown range replaced");
    let old_pool = |store: &MemoryStore| store.pools().into_iter().find(|p| p.spec.range == "198.18.64.0/30");
    let now = crate::clock::now();
    let retire = |at: SignedDuration| {
        let store = store.clone();
        async move { retire_replaced(&store, &store.pools(), now + at, crate::SETTLE_TIME).await.unwrap() }
    };
    assert_eq!(retire(SignedDuration::from_mins(10)).await, 0, "still cooling: kept");
    assert!(old_pool(&store).is_some());
    assert_eq!(retire(SignedDuration::from_mins(20)).await, 1, "cooled: retired");
    assert!(old_pool(&store).is_none());
}

/// The same under concurrency and faults: the grown range's first ADDs race to create its pool (one of them losing
/// the answer to its create), each handle's writes lose answers or fail at random, and ADDs that fail are run
/// again; no address is ever held twice, across the old pool and the new.
#[tokio::test]
async fn a_grown_range_under_racing_adds_and_lost_answers_holds_no_address_twice() {
    use crate::store::memory::{Fault, FaultPlan, Op};
    for seed in 0..12u64 {
        let store = MemoryStore::new(NS);
        let host = TestHost(store.clone());
        let old = serde_json::json!({"range": "198.18.62.0/29", "enable_overlapping_ranges": false});
        let grown = serde_json::json!({"range": "198.18.62.0/28", "enable_overlapping_ranges": false});
        for i in 0..3 {
            add(&host, &config(old.clone(), &format!("old-{i}")), &request(&format!("co{i}"), "n")).await.unwrap();
        }
        // no timeouts: each waits out a budget, and what they leave is what a lost answer or a 500 leaves
        let kinds = [Fault::LostResponse, Fault::ServerError, Fault::Conflict];
        let adds = (0..6).map(|i| {
            let mut plan = FaultPlan::random(seed * 100 + i, 0.2, &kinds);
            if i == 0 {
                plan = plan.at(Op::CreatePool, 1, Fault::LostResponse);
            }
            let host = TestHost(store.handle(&format!("adder-{i}"), plan));
            let grown = grown.clone();
            async move {
                for attempt in 0..10 {
                    let cfg = config(grown.clone(), &format!("new-{i}"));
                    if add(&host, &cfg, &request(&format!("cn{i}-{attempt}"), "n")).await.is_ok() {
                        return;
                    }
                }
            }
        });
        futures::future::join_all(adds).await;
        assert_no_address_twice(&store);
    }
}

/// `max_slices_per_node: 1`: a node whose one slice is full borrows from another node's rather than claim a
/// second, and says why when there is nothing to borrow; the free slices stay for the other nodes.
#[tokio::test]
async fn a_node_at_its_slice_cap_borrows_and_leaves_the_free_slices() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let ipam = serde_json::json!({"range": "198.18.63.0/28", "node_slice_size": "/30", "max_slices_per_node": 1});
    let on = |node: &'static str, pod: String| {
        let (host, ipam) = (&host, ipam.clone());
        async move { add(host, &config(ipam, &pod), &request(&format!("c-{pod}"), node)).await }
    };
    // its one slice: 3 or 4 addresses (an edge slice gives up the range's network or broadcast address)
    let mut taken = 0;
    let capped = loop {
        match on("node-a", format!("a{taken}")).await {
            Ok(_) => taken += 1,
            Err(e) => break e,
        }
        assert!(taken <= 4, "node-a took a second slice");
    };
    assert!(taken >= 3, "{taken}");
    assert_eq!(capped.code, Code::RangeExhausted);
    assert!(capped.details.contains("holds 1 slices (max_slices_per_node)"), "{}", capped.details);
    on("node-b", "b0".into()).await.unwrap();
    let borrowed = on("node-a", format!("a{taken}")).await.unwrap()[0].ip;
    let owners = store.node_slices()[0].status.clone().unwrap().allocations;
    let owner_of = |ip: std::net::IpAddr| {
        owners.iter().find(|s| s.slice_range.parse::<ipnet::IpNet>().unwrap().contains(&ip)).unwrap().node_name.clone()
    };
    assert_eq!(owner_of(borrowed), "node-b", "borrowed from node-b's slice");
    assert_eq!(owners.iter().filter(|s| s.node_name == "node-a").count(), 1, "{owners:?}");
    assert_eq!(owners.iter().filter(|s| s.node_name.is_empty()).count(), 2, "left to other nodes: {owners:?}");
    assert_no_address_twice(&store);
    // each pod the cap touched is told: the one refused, the one that borrowed; no other pod
    let told: Vec<(String, String)> = store
        .events()
        .into_iter()
        .filter(|(_, reason, _)| reason == crate::slices::SLICE_CAP_REASON)
        .map(|(pod, _, note)| (pod, note))
        .collect();
    let pods: Vec<&str> = told.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(pods, [format!("ns/a{taken}"), format!("ns/a{taken}")], "{told:?}");
    assert!(told[0].1.contains("holds 1 slices (max_slices_per_node)"), "{told:?}");
    assert!(told[1].1.contains("borrowed from another node's slice, though slices are free"), "{told:?}");
}

/// `enable_l3` (the maintained fork's): a /31's both addresses and a /32's one are handed out, the network address
/// first; the range then says it is full; DEL finds and releases them.
#[tokio::test]
async fn with_enable_l3_a_31_and_a_32_hand_out_every_address() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let p2p = serde_json::json!({"range": "198.18.64.0/31", "enable_l3": true});
    let got: Vec<_> = futures::future::join_all((0..2).map(|i| {
        let (host, p2p) = (&host, p2p.clone());
        async move { add(host, &config(p2p, &format!("p{i}")), &request(&format!("c{i}"), "n")).await.unwrap() }
    }))
    .await;
    let mut ips: Vec<std::net::IpAddr> = got.iter().map(|a| a[0].ip).collect();
    ips.sort();
    assert_eq!(ips, ["198.18.64.0".parse::<std::net::IpAddr>().unwrap(), "198.18.64.1".parse().unwrap()]);
    assert!(got.iter().all(|a| a[0].prefix_len == 31));
    let full = add(&host, &config(p2p.clone(), "p2"), &request("c2", "n")).await.unwrap_err();
    assert_eq!(full.code, Code::RangeExhausted);
    let released = del(&host, &ReleaseConfig::from(config(p2p.clone(), "p0")), &request("c0", "n")).await.unwrap();
    assert_eq!(released, 1);

    let host32 = serde_json::json!({"range": "198.18.64.9/32", "enable_l3": true});
    let one = add(&host, &config(host32.clone(), "h"), &request("ch", "n")).await.unwrap();
    assert_eq!((one[0].ip.to_string(), one[0].prefix_len), ("198.18.64.9".to_string(), 32));
    assert_eq!(del(&host, &ReleaseConfig::from(config(host32, "h")), &request("ch", "n")).await.unwrap(), 1);
    assert_no_address_twice(&store);
}

/// A config of network `net` with `allowPersistentIPs` at the top level (as KubeVirt reads it).
fn persistent_config(ipam: serde_json::Value, pod: &str) -> IpamConfig {
    let mut ipam = ipam;
    ipam["type"] = "hereabouts".into();
    ipam["kubernetes"] = serde_json::json!({"kubeconfig": "/k"});
    let stdin = serde_json::json!({
        "cniVersion": "1.0.0", "name": "net", "type": "macvlan", "allowPersistentIPs": true, "ipam": ipam
    })
    .to_string();
    let args = format!("K8S_POD_NAMESPACE=ns;K8S_POD_NAME={pod};K8S_POD_UID={pod}-uid");
    crate::config::load_with_paths(&crate::config::Input { stdin: stdin.as_bytes(), cni_args: &args }, &[]).unwrap()
}

/// KubeVirt's part: the VM's pod `pod` names the IPAMClaim `claim` for its interface `net1`.
fn launcher_pod(store: &MemoryStore, pod: &str, claim: &str) {
    let networks = serde_json::json!([{"name": "nad", "interface": "net1", "ipam-claim-reference": claim}]);
    let annotations = [(crate::claim::NETWORKS_ANNOTATION.to_string(), networks.to_string())].into();
    let meta = crate::store::ObjectMeta { annotations: Some(annotations), ..Default::default() };
    store.put_core(crate::store::CoreObject::Pod, "ns", pod, meta);
}

fn claim_ips(store: &MemoryStore, name: &str) -> Vec<String> {
    store.ipamclaim("ns", name).and_then(|c| c.status).map(|s| s.ips).unwrap_or_default()
}

/// A VM's address survives a live migration (the target pod's ADD while the source pod still runs gets the same
/// address), the source's DEL and the VM's stop: DEL never gives an IPAMClaim's address back, and the VM's next pod
/// gets it again. Pods without a claim never get it.
#[tokio::test]
async fn a_vms_address_follows_its_ipamclaim_across_a_migration_and_a_restart() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let ipam = serde_json::json!({"range": "198.18.70.0/28"});
    store.put_ipamclaim("ns", "vm1.net", "net", "net1");
    launcher_pod(&store, "launcher-a", "vm1.net");
    let first = add(&host, &persistent_config(ipam.clone(), "launcher-a"), &request("ca", "node-a")).await.unwrap();
    let ip = first[0].ip;
    assert_eq!(claim_ips(&store, "vm1.net"), [format!("{ip}/28")], "recorded on the claim");
    assert_eq!(store.ipamclaim("ns", "vm1.net").unwrap().status.unwrap().owner_pod.unwrap().name, "launcher-a");

    let other = add(&host, &persistent_config(ipam.clone(), "plain"), &request("cp", "node-a")).await.unwrap();
    assert_ne!(other[0].ip, ip, "a pod without a claim gets another address");

    // the migration's target pod, on another node, while the source still runs
    launcher_pod(&store, "launcher-b", "vm1.net");
    let target = add(&host, &persistent_config(ipam.clone(), "launcher-b"), &request("cb", "node-b")).await.unwrap();
    assert_eq!(target[0].ip, ip, "the target pod gets the VM's address");
    let pool = store.pools().into_iter().next().unwrap();
    let claimed: Vec<_> = pool.spec.allocations.values().filter(|a| a.ipamclaim.is_some()).collect();
    assert_eq!(claimed.len(), 1, "one entry for the claim: {claimed:?}");
    assert_eq!((claimed[0].podref.as_str(), claimed[0].id.as_str()), ("ns/launcher-b", "cb"));
    let reservation = store.reservations().into_iter().find(|r| r.spec.ipamclaim.is_some()).unwrap();
    assert_eq!(reservation.spec.podref, "ns/launcher-b", "the reservation taken over too");
    assert_eq!(store.ipamclaim("ns", "vm1.net").unwrap().status.unwrap().owner_pod.unwrap().name, "launcher-b");

    // the source pod goes, then the VM stops: nothing is given back
    let release = |pod: &str| ReleaseConfig::from(persistent_config(ipam.clone(), pod));
    assert_eq!(del(&host, &release("launcher-a"), &request("ca", "node-a")).await.unwrap(), 0, "source DEL");
    assert_eq!(del(&host, &release("launcher-b"), &request("cb", "node-b")).await.unwrap(), 0, "target DEL");
    assert!(held(&store).iter().any(|(_, held)| *held == ip), "the claim still holds {ip}");

    // the VM starts again: its new pod gets the address
    launcher_pod(&store, "launcher-c", "vm1.net");
    let restarted = add(&host, &persistent_config(ipam.clone(), "launcher-c"), &request("cc", "node-a")).await;
    assert_eq!(restarted.unwrap()[0].ip, ip);
    assert_no_address_twice(&store);
}

/// What a claim cannot give is refused with the right code, and nothing is written: a claim that does not exist
/// (yet), one of another network, one recording an address outside the ranges.
#[tokio::test]
async fn an_ipamclaim_that_cannot_give_the_address_fails_the_add_and_writes_nothing() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let ipam = serde_json::json!({"range": "198.18.71.0/28"});
    launcher_pod(&store, "launcher", "vm.net");
    let cfg = persistent_config(ipam.clone(), "launcher");
    let missing = add(&host, &cfg, &request("c1", "n")).await.unwrap_err();
    assert_eq!(missing.code, Code::TryAgainLater, "{}", missing.details);
    assert!(missing.details.contains("IPAMClaim ns/vm.net does not exist"), "{}", missing.details);

    store.put_ipamclaim("ns", "vm.net", "another-net", "net1");
    let other = add(&host, &cfg, &request("c1", "n")).await.unwrap_err();
    assert_eq!(other.code, Code::InvalidConfig, "{}", other.details);
    assert!(other.details.contains("\"another-net\""), "{}", other.details);

    store.put_ipamclaim("ns", "vm.net", "net", "net1");
    let mut claim = store.ipamclaim("ns", "vm.net").unwrap();
    claim.status = Some(crate::crd::IpamClaimStatus { ips: vec!["198.18.99.5/24".into()], owner_pod: None });
    crate::store::IpamClaimStore::set_ipamclaim_status(&store, &claim, claim.status.as_ref().unwrap()).await.unwrap();
    let moved = add(&host, &cfg, &request("c1", "n")).await.unwrap_err();
    assert_eq!(moved.code, Code::InvalidConfig, "{}", moved.details);
    assert!(moved.details.contains("198.18.99.5"), "{}", moved.details);
    assert!(store.pools().iter().all(|p| p.spec.allocations.is_empty()), "nothing allocated");
    assert!(store.reservations().is_empty(), "nothing reserved");
}

/// Under Whereabouts' schema the claim cannot be recorded in the entry, and DEL would give a VM's address back
/// with its pod: the ADD fails naming the field, and takes back what it wrote.
#[tokio::test]
async fn under_whereabouts_schema_an_ipamclaim_add_fails_naming_the_crd() {
    let store = MemoryStore::new(NS).with_whereabouts_schema();
    store.put_ipamclaim("ns", "vm.net", "net", "net1");
    launcher_pod(&store, "launcher", "vm.net");
    let cfg = persistent_config(serde_json::json!({"range": "198.18.72.0/28"}), "launcher");
    refused_for_a_pruned_field(&store, &cfg, "spec.allocations.*.ipamclaim").await;
}

/// The pods of one claim ADD at once (a migration's source retried while the target starts, both before the claim
/// records anything), among pods without a claim, every request losing answers, failing with 500s and conflicts at
/// random, the claim's status write too; failed ADDs are run again. The claim ends with one address, every pod of
/// it that succeeded last got that address, no address is held twice, and an entry of the claim at another address
/// is only one whose roll-back failed, which the reconciler's rule gives back ([`claim_wants`]).
#[tokio::test]
async fn pods_of_one_ipamclaim_racing_under_lost_answers_get_one_address() {
    use crate::reconcile::rules::claim_wants;
    use crate::store::memory::{Fault, FaultPlan};
    for seed in 0..16u64 {
        let store = MemoryStore::new(NS);
        store.put_ipamclaim("ns", "vm.net", "net", "net1");
        // random picks, so that pods of the claim that read before either wrote pick different addresses
        let strategy = if seed % 2 == 0 { "random" } else { "lowest" };
        let ipam = serde_json::json!({"range": "198.18.73.0/27", "allocation_strategy": strategy});
        let kinds = [Fault::LostResponse, Fault::ServerError, Fault::Conflict];
        let adds = (0..6u64).map(|i| {
            let pod = if i < 3 { format!("launcher-{i}") } else { format!("plain-{i}") };
            if i < 3 {
                launcher_pod(&store, &pod, "vm.net");
            }
            // requests take up to 5 ms, so that the pods' reads and writes interleave
            let mut plan = FaultPlan::random(seed * 100 + i, 0.2, &kinds);
            plan.max_latency_ms = 5;
            let host = TestHost(store.handle(&pod, plan));
            let ipam = ipam.clone();
            async move {
                for attempt in 0..12 {
                    let cfg = persistent_config(ipam.clone(), &pod);
                    if let Ok(got) = add(&host, &cfg, &request(&format!("c{i}-{attempt}"), "n")).await {
                        return Some((pod, got[0].ip));
                    }
                }
                None
            }
        });
        let got: Vec<_> = futures::future::join_all(adds).await.into_iter().flatten().collect();
        assert_no_address_twice(&store);
        let recorded = claim_ips(&store, "vm.net");
        assert_eq!(recorded.len(), 1, "seed {seed}: one address on the claim: {recorded:?}");
        let vm_ip: std::net::IpAddr = recorded[0].parse::<ipnet::IpNet>().unwrap().addr();
        for (pod, ip) in &got {
            let is_vm = pod.starts_with("launcher");
            assert_eq!(*ip == vm_ip, is_vm, "seed {seed}: {pod} got {ip}, the claim holds {vm_ip}");
        }
        let pool = store.pools().into_iter().next().unwrap();
        let range = crate::range::IpRange::parse("198.18.73.0/27", None, None, &[]).unwrap();
        for (offset, entry) in pool.spec.allocations.iter().filter(|(_, a)| a.ipamclaim.is_some()) {
            let ip = range.addr_at(offset.parse().unwrap());
            assert_eq!(claim_wants(Some(recorded.as_slice()), Some(ip)), ip == vm_ip, "seed {seed}: {entry:?}");
        }
    }
}

/// The pod `pod` annotated with the preferred address `ip` (the maintained fork's `preferred-ip`).
fn preferring_pod(store: &MemoryStore, pod: &str, ip: &str) {
    let annotations = [(crate::claim::PREFERRED_IP_ANNOTATION.to_string(), ip.to_string())].into();
    let meta = crate::store::ObjectMeta { annotations: Some(annotations), ..Default::default() };
    store.put_core(crate::store::CoreObject::Pod, "ns", pod, meta);
}

/// `preferred_ip_annotation`: a pod's preferred address is taken when free; held by another pod, outside every
/// range, or not an address, the usual choice is made and the ADD succeeds; a config without the key never reads
/// the pod (its annotation is ignored).
#[tokio::test]
async fn a_preferred_address_is_taken_when_free_and_otherwise_the_usual_choice_is_made() {
    use crate::store::memory::{FaultPlan, Op};
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let ipam = serde_json::json!({"range": "198.18.74.0/28", "preferred_ip_annotation": true});
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    for (pod, preferred, got, why) in [
        ("a", "198.18.74.9", "198.18.74.9", "free: taken"),
        ("b", "198.18.74.9", "198.18.74.1", "held by a: the lowest free instead"),
        ("c", "198.18.99.9", "198.18.74.2", "in no range: the usual choice"),
        ("d", "banana", "198.18.74.3", "not an address: ignored"),
    ] {
        preferring_pod(&store, pod, preferred);
        let added = add(&host, &config(ipam.clone(), pod), &request(&format!("c{pod}"), "n")).await.unwrap();
        assert_eq!(added[0].ip, ip(got), "{why}");
    }
    // a retried ADD keeps what it holds, whatever the annotation says now
    preferring_pod(&store, "a", "198.18.74.12");
    let again = add(&host, &config(ipam.clone(), "a"), &request("ca", "n")).await.unwrap();
    assert_eq!(again[0].ip, ip("198.18.74.9"));

    // without the key the pod is not read at all: one GET of it would show as a CoreMetadata fault
    preferring_pod(&store, "e", "198.18.74.14");
    let refused = FaultPlan::quiet(1).at(Op::CoreMetadata, 1, crate::store::memory::Fault::Refused);
    let refusing = TestHost(store.handle("e", refused));
    let plain = serde_json::json!({"range": "198.18.74.0/28"});
    let got = add(&refusing, &config(plain, "e"), &request("ce", "n")).await.unwrap();
    assert_eq!(got[0].ip, ip("198.18.74.4"), "the annotation is not read without the key");
    assert_no_address_twice(&store);
}

/// Found by the simulation's range-grown cases (100,000 cases, twice): a network's range grows, without
/// reservations, just as its first pool is made. The old config's first ADD lists the pools (none) and its create
/// reaches the server late; the new config's first ADD lists (none), makes the /28's pool and claims; then the
/// /29's pool lands. Each pool was made naming nothing, so their claims read neither the other's entries nor its
/// mark, and the first address of each went to two pods. Pools are born pending and settled by a second list: here
/// the /29's, made last, names the /28's, so the new config's ADDs are refused while the old config's may run, and
/// no address is handed out twice.
#[tokio::test(start_paused = true)]
async fn two_layouts_whose_first_pools_are_made_at_once_never_hand_out_one_address_twice() {
    use crate::store::memory::{Fault, FaultPlan, Op};
    let store = MemoryStore::new(NS);
    let old = serde_json::json!({"range": "198.18.87.0/29", "enable_overlapping_ranges": false});
    let grown = serde_json::json!({"range": "198.18.87.0/28", "enable_overlapping_ranges": false});
    let late = TestHost(store.handle("old", FaultPlan::quiet(1).at(Op::CreatePool, 1, Fault::LateRequest)));
    let host = TestHost(store.clone());
    let first_old = async { add(&late, &config(old.clone(), "old-0"), &request("co0", "n")).await };
    let first_new = async {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        add(&host, &config(grown.clone(), "new-0"), &request("cn0", "n")).await
    };
    let (a, b) = tokio::join!(first_old, first_new);
    // the race as found: the /29's pool landed after the /28's was settled and in use, so only its settle, after
    // its create, could see the /28's; it names it, and its first ADD took an address the /28's does not hold
    let pool_of = |range: &str| store.pools().into_iter().find(|p| p.spec.range == range).unwrap();
    let (narrow, wide) = (pool_of("198.18.87.0/29"), pool_of("198.18.87.0/28"));
    assert_eq!(crate::store::overlaps_of(&narrow), [wide.metadata.name.clone().unwrap()]);
    let holds = |pool: &IpPool, pod: &str| pool.spec.allocations.values().any(|e| e.podref == format!("ns/{pod}"));
    assert!(holds(&wide, "new-0") && holds(&narrow, "old-0"), "each config's first ADD in its own pool");
    assert_ne!(a.as_ref().unwrap()[0].ip, b.as_ref().unwrap()[0].ip);
    let mut added = usize::from(a.is_ok()) + usize::from(b.is_ok());
    for i in 1..8 {
        for (ipam, pod) in [(&old, format!("old-{i}")), (&grown, format!("new-{i}"))] {
            if add(&host, &config(ipam.clone(), &pod), &request(&format!("c{pod}"), "n")).await.is_ok() {
                added += 1;
            }
        }
    }
    assert!(added >= 6, "the one layout's ADDs went on: {added} added");
    assert_no_address_twice(&store);
    let pools = store.pools();
    assert!(pools.iter().all(|p| !crate::store::replaces_pending(p)), "no pool left pending");
}

/// A pod's DEL under the grown config reads the new pool (no copy yet), the old one (its entry), the new one again
/// (still no copy), and sends its removal, which arrives late: meanwhile the leader copies the entry into the new
/// pool and removes it from the old one. The DEL's removal finds it gone; without a last read of the new pool the
/// copy outlived the pod (seen as a rare failure of the churn test below).
#[tokio::test(start_paused = true)]
async fn a_del_whose_entry_the_leader_moves_under_it_releases_the_copy() {
    use crate::reconcile::relayout::move_replaced;
    use crate::store::PoolStore;
    use crate::store::memory::{Fault, FaultPlan, Op};
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let old = serde_json::json!({"range": "198.18.83.0/29"});
    let grown = serde_json::json!({"range": "198.18.83.0/28"});
    let ip = add(&host, &config(old.clone(), "old-0"), &request("co0", "n")).await.unwrap()[0].ip;
    add(&host, &config(grown.clone(), "new-0"), &request("cn0", "n")).await.unwrap();
    let mut pool = store.pools().into_iter().find(|p| p.spec.range == "198.18.83.0/28").unwrap();
    let now = crate::clock::now();
    pool.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        now - k8s_openapi::jiff::SignedDuration::from_mins(10),
    ));
    store.put_pool(pool);

    let late = TestHost(store.handle("del", FaultPlan::quiet(1).at(Op::RemoveAllocation, 1, Fault::LateRequest)));
    let cfg = ReleaseConfig::from(config(grown.clone(), "old-0"));
    let deleting = async { del(&late, &cfg, &request("co0", "n")).await };
    let moving = async {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let leader = store.handle("leader", FaultPlan::quiet(2));
        move_replaced(&leader, &leader.list_pools().await.unwrap(), now, crate::SETTLE_TIME).await
    };
    let (deleted, moved) = tokio::join!(deleting, moving);
    deleted.unwrap();
    assert_eq!(moved.moved, 1, "the leader moved {ip} while the DEL was under way: {moved:?}");
    let left: Vec<_> = held(&store).into_iter().filter(|(pod, _)| pod == "ns/old-0").collect();
    assert!(left.is_empty(), "the deleted pod holds nothing: {left:?}");
}

/// Online re-layout under churn: pods hold addresses of a /29 when the network grows to a /28; while the leader
/// moves their entries into the /28's pool, new pods are added, two old pods are deleted (DEL with the new config),
/// and every request of every process may lose its answer, fail with a 500 or a conflict. With reservations and
/// without, over 10 seeds: no address is ever held twice, each old pod that lives keeps its address (once, in the
/// new pool after a last pass), the deleted ones hold nothing (no copy outlives its pod), and the old pool empties.
#[tokio::test]
async fn a_grown_range_moves_its_live_entries_under_churn_and_lost_answers() {
    use crate::reconcile::relayout::move_replaced;
    use crate::store::PoolStore;
    use crate::store::memory::{Fault, FaultPlan};
    for reserve in [true, false] {
        for seed in 0..10u64 {
            let store = MemoryStore::new(NS);
            let host = TestHost(store.clone());
            let old = serde_json::json!({"range": "198.18.82.0/29", "enable_overlapping_ranges": reserve});
            let grown = serde_json::json!({"range": "198.18.82.0/28", "enable_overlapping_ranges": reserve});
            let mut first = Vec::new();
            for i in 0..5 {
                let cfg = config(old.clone(), &format!("old-{i}"));
                first.push(add(&host, &cfg, &request(&format!("co{i}"), "n")).await.unwrap()[0].ip);
            }
            add(&host, &config(grown.clone(), "new-0"), &request("cn0", "n")).await.unwrap();
            // the grown pool is older than any ADD under the old config can be
            let mut pool = store.pools().into_iter().find(|p| p.spec.range == "198.18.82.0/28").unwrap();
            assert!(!crate::store::overlaps_of(&pool).is_empty(), "the new pool names the one it replaces");
            let now = crate::clock::now();
            pool.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                now - k8s_openapi::jiff::SignedDuration::from_mins(10),
            ));
            store.put_pool(pool);

            let kinds = [Fault::LostResponse, Fault::ServerError, Fault::Conflict];
            let faulty = |name: &str, n: u64| {
                let mut plan = FaultPlan::random(seed * 100 + n, 0.15, &kinds);
                plan.max_latency_ms = 3;
                store.handle(name, plan)
            };
            let mover = faulty("leader", 0);
            let moving = async {
                for _ in 0..3 {
                    if let Ok(listed) = mover.list_pools().await {
                        move_replaced(&mover, &listed, now, crate::SETTLE_TIME).await;
                    }
                }
            };
            let adds = (1..6u64).map(|i| {
                let host = TestHost(faulty(&format!("new-{i}"), i));
                let grown = grown.clone();
                async move {
                    for attempt in 0..10 {
                        let cfg = config(grown.clone(), &format!("new-{i}"));
                        if add(&host, &cfg, &request(&format!("cn{i}-{attempt}"), "n")).await.is_ok() {
                            return;
                        }
                    }
                }
            });
            let dels = (0..2u64).map(|i| {
                let host = TestHost(faulty(&format!("del-{i}"), 10 + i));
                let grown = grown.clone();
                async move {
                    for _ in 0..10 {
                        let cfg = ReleaseConfig::from(config(grown.clone(), &format!("old-{i}")));
                        if del(&host, &cfg, &request(&format!("co{i}"), "n")).await.is_ok() {
                            return;
                        }
                    }
                    panic!("old-{i}'s DEL never succeeded");
                }
            });
            tokio::join!(moving, futures::future::join_all(adds), futures::future::join_all(dels));
            assert_no_address_twice(&store);
            // a last pass, as the next cron's
            move_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await;
            assert_no_address_twice(&store);
            let held = held(&store);
            let pools: Vec<_> = store
                .pools()
                .into_iter()
                .map(|p| {
                    (
                        p.metadata.name,
                        p.spec.allocations.into_iter().map(|(k, e)| (k, e.podref, e.id)).collect::<Vec<_>>(),
                        p.metadata.annotations,
                    )
                })
                .collect();
            let what = format!("reserve {reserve}, seed {seed}: {held:?} {pools:#?}");
            for (i, ip) in first.iter().enumerate() {
                let of_pod: Vec<_> = held.iter().filter(|(p, _)| *p == format!("ns/old-{i}")).collect();
                if i < 2 {
                    assert!(of_pod.is_empty(), "deleted old-{i} holds nothing: {what}");
                } else {
                    assert_eq!(of_pod.len(), 1, "old-{i} holds one entry: {what}");
                    assert_eq!(of_pod[0].1, *ip, "old-{i} keeps its address: {what}");
                }
            }
            let old_pool = store.pools().into_iter().find(|p| p.spec.range == "198.18.82.0/29").unwrap();
            assert!(old_pool.spec.allocations.is_empty(), "the old pool emptied: {what}");
        }
    }
}

/// A network without reservations moved from one pool to node slices while pods hold addresses of the pool: each
/// slice's new pool names the old pool, so its ADDs keep off what the old pool holds (before, the first slice's
/// ADD handed out the old pods' addresses again); the leader then moves the old entries into the slice pools that
/// hold their addresses, the old pool goes, and an old pod's DEL finds its entry in a slice pool.
#[tokio::test]
async fn a_pool_given_up_for_slices_never_hands_out_what_the_pool_still_holds() {
    use crate::reconcile::relayout::move_replaced;
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let one = serde_json::json!({"range": "198.18.83.0/28", "enable_overlapping_ranges": false});
    let sliced =
        serde_json::json!({"range": "198.18.83.0/28", "node_slice_size": "/29", "enable_overlapping_ranges": false});
    let mut old = Vec::new();
    for i in 0..3 {
        old.push(
            add(&host, &config(one.clone(), &format!("old-{i}")), &request(&format!("co{i}"), "n")).await.unwrap()[0]
                .ip,
        );
    }
    for (i, node) in [(0, "node-a"), (1, "node-a"), (2, "node-b")] {
        let ip = add(&host, &config(sliced.clone(), &format!("new-{i}")), &request(&format!("cn{i}"), node))
            .await
            .unwrap()[0]
            .ip;
        assert!(!old.contains(&ip), "{ip} is held in the old pool by a pod of {old:?}");
    }
    assert_no_address_twice(&store);

    // older than any ADD: the leader moves the old entries into the slice pool that holds each address
    let now = crate::clock::now() + k8s_openapi::jiff::SignedDuration::from_mins(10);
    let moved = move_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await;
    assert_eq!(moved.moved, 3, "{moved:?}");
    assert_no_address_twice(&store);
    crate::reconcile::retire::retire_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await.unwrap();
    assert!(store.pools().iter().all(|p| p.spec.range != "198.18.83.0/28"), "the old pool retired");
    for (i, ip) in old.iter().enumerate() {
        assert!(held(&store).contains(&(format!("ns/old-{i}"), *ip)), "old-{i} keeps {ip}: {:?}", held(&store));
    }
    let released = del(&host, &ReleaseConfig::from(config(sliced.clone(), "old-0")), &request("co0", "n")).await;
    assert_eq!(released.unwrap(), 1, "old-0's DEL finds its entry in a slice pool");
}

/// `large_offsets`: a range whose usable addresses lie 2^63 or more above its network address hands them out, the
/// pool recording offsets above what a signed 64-bit number holds (for fleets without Whereabouts v0.9 readers);
/// DEL finds them, and a retried ADD keeps its entry.
#[tokio::test]
async fn with_large_offsets_addresses_above_two_to_the_63_are_handed_out_and_released() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let ipam = serde_json::json!({"range": "2001:db8::8000:0:0:0-2001:db8::8000:0:0:3/64", "large_offsets": true});
    let a = add(&host, &config(ipam.clone(), "a"), &request("ca", "n")).await.unwrap()[0].ip;
    assert_eq!(a, "2001:db8::8000:0:0:0".parse::<std::net::IpAddr>().unwrap());
    let b = add(&host, &config(ipam.clone(), "b"), &request("cb", "n")).await.unwrap()[0].ip;
    assert_eq!(b, "2001:db8::8000:0:0:1".parse::<std::net::IpAddr>().unwrap());
    let pool = store.pools().into_iter().next().unwrap();
    let keys: Vec<&String> = pool.spec.allocations.keys().collect();
    assert_eq!(keys, ["9223372036854775808", "9223372036854775809"], "offsets above i64::MAX, in decimal");
    assert_eq!(add(&host, &config(ipam.clone(), "a"), &request("ca", "n")).await.unwrap()[0].ip, a, "kept");
    assert_eq!(del(&host, &ReleaseConfig::from(config(ipam.clone(), "a")), &request("ca", "n")).await.unwrap(), 1);
    assert_no_address_twice(&store);
}

/// A config that reads the pod for several things (its IPAMClaim, its preferred address, its sticky
/// StatefulSet) reads it once: a second GET of the pod, refused here, would fail the ADD.
#[tokio::test]
async fn an_add_reads_its_pod_once_whatever_reads_it() {
    use crate::store::memory::{Fault, FaultPlan, Op};
    let store = MemoryStore::new(NS);
    store.put_ipamclaim("ns", "vm.net", "net", "net1");
    let networks = serde_json::json!([{"name": "nad", "interface": "net1", "ipam-claim-reference": "vm.net"}]);
    let annotations = [
        (crate::claim::NETWORKS_ANNOTATION.to_string(), networks.to_string()),
        (crate::claim::PREFERRED_IP_ANNOTATION.to_string(), "198.18.75.9".to_string()),
    ]
    .into();
    let meta = crate::store::ObjectMeta { annotations: Some(annotations), ..Default::default() };
    store.put_core(crate::store::CoreObject::Pod, "ns", "launcher", meta);
    let ipam =
        serde_json::json!({"range": "198.18.75.0/28", "preferred_ip_annotation": true, "sticky_statefulset": true});
    let once = FaultPlan::quiet(1).at(Op::CoreMetadata, 2, Fault::Refused);
    let (host, cfg) = (TestHost(store.handle("adder", once)), persistent_config(ipam, "launcher"));
    let ip = add(&host, &cfg, &request("c1", "n")).await.unwrap()[0].ip;
    assert_eq!(ip, "198.18.75.9".parse::<std::net::IpAddr>().unwrap(), "the preferred address");
    assert_eq!(claim_ips(&store, "vm.net"), ["198.18.75.9/28"], "recorded on the claim");
}

/// A fleet come from Whereabouts grows a range (no reservations): the old range's pool, as Whereabouts wrote it (no
/// config recorded, entries without a network), is kept off — the grown range's pool never hands out what it
/// holds (it handed out 198.18.65.1 a second time before) — and a DEL under the grown config finds its pod's entry
/// there; the leader neither moves its entries nor retires it (another config of the network may still use it).
#[tokio::test]
async fn a_grown_range_keeps_off_what_a_whereabouts_pool_of_the_old_range_holds() {
    use crate::crd::{IpAllocation, IpPool, IpPoolSpec};
    use crate::reconcile::relayout::move_replaced;
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let entry = |id: &str, pod: &str| IpAllocation {
        id: id.into(),
        podref: format!("ns/{pod}"),
        ifname: "net1".into(),
        ..IpAllocation::default()
    };
    let allocations = [("1".to_string(), entry("cw0", "wb-0")), ("2".to_string(), entry("cw1", "wb-1"))].into();
    let spec = IpPoolSpec { range: "198.18.65.0/29".into(), allocations, ..Default::default() };
    store.put_pool(IpPool::new("198.18.65.0-29", spec));
    let grown = serde_json::json!({"range": "198.18.65.0/28", "enable_overlapping_ranges": false});
    for i in 0..3 {
        let ip =
            add(&host, &config(grown.clone(), &format!("new-{i}")), &request(&format!("cn{i}"), "n")).await.unwrap()[0]
                .ip;
        assert!(!["198.18.65.1", "198.18.65.2"].contains(&ip.to_string().as_str()), "{ip} is Whereabouts' pods'");
    }
    assert_no_address_twice(&store);
    let now = crate::clock::now() + k8s_openapi::jiff::SignedDuration::from_mins(10);
    assert_eq!(move_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await.moved, 0, "not moved");
    let released = del(&host, &ReleaseConfig::from(config(grown.clone(), "wb-0")), &request("cw0", "n")).await;
    assert_eq!(released.unwrap(), 1, "wb-0's DEL under the grown config finds its entry in Whereabouts' pool");
    let old = store.pools().into_iter().find(|p| p.spec.range == "198.18.65.0/29").expect("not retired");
    assert_eq!(old.spec.allocations.keys().collect::<Vec<_>>(), ["2"]);
}

/// The slices `node` is listed with in the only NodeSlicePool.
fn slices_of_node(store: &MemoryStore, node: &str) -> Vec<String> {
    let listed = store.node_slices()[0].status.clone().unwrap().allocations;
    listed.into_iter().filter(|s| s.node_name == node).map(|s| s.slice_range).collect()
}

#[tokio::test]
async fn slices_are_claimed_ahead_with_their_pools_while_half_the_range_is_free() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let cfg = config(serde_json::json!({"range": "198.18.0.0/24", "node_slice_size": "/26"}), "p");
    let a = hold_slices(&host, &cfg, "node-a").await.unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!(slices_of_node(&store, "node-a"), [a[0].to_string()]);
    let pool = crate::names::slice_pool_name(&cfg.network_name, "node-a", a[0]);
    let made = store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some(pool.as_str()));
    assert!(made.expect("the slice's pool").spec.allocations.is_empty(), "no entry is written ahead");
    assert!(store.reservations().is_empty(), "no reservation is written ahead");
    // held already: read, nothing written
    let writes = store.writes();
    assert_eq!(hold_slices(&host, &cfg, "node-a").await.unwrap(), a);
    assert_eq!(store.writes(), writes);
    // node-b and node-c claim while half the range is free; node-d finds a quarter free and waits for its first ADD
    assert_eq!(hold_slices(&host, &cfg, "node-b").await.unwrap().len(), 1);
    assert_eq!(hold_slices(&host, &cfg, "node-c").await.unwrap().len(), 1);
    assert!(hold_slices(&host, &cfg, "node-d").await.unwrap().is_empty());
    assert!(slices_of_node(&store, "node-d").is_empty());
    // the node's first ADD writes its entry (and reservation) into the slice held ahead, and claims nothing
    let writes = store.writes();
    let ip = add(
        &host,
        &config(serde_json::json!({"range": "198.18.0.0/24", "node_slice_size": "/26"}), "p1"),
        &request("c1", "node-a"),
    )
    .await
    .unwrap()[0]
        .ip;
    assert!(a[0].contains(&ip), "{ip} in node-a's slice {}", a[0]);
    assert_eq!(store.writes() - writes, 2, "one entry and one reservation");
    assert_eq!(slices_of_node(&store, "node-a").len(), 1);
    assert_no_address_twice(&store);
}

#[tokio::test]
async fn a_claim_ahead_whose_answer_is_lost_is_read_back_and_made_once() {
    use crate::store::memory::{Fault, FaultPlan, Op};
    let store = MemoryStore::new(NS);
    let lost = FaultPlan::quiet(1).at(Op::MoveSlice, 1, Fault::LostResponse).at(Op::CreatePool, 1, Fault::LostResponse);
    let host = TestHost(store.handle("agent", lost));
    let cfg = config(serde_json::json!({"range": "198.18.0.0/24", "node_slice_size": "/26"}), "p");
    let held = hold_slices(&host, &cfg, "node-a").await.unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(
        slices_of_node(&store, "node-a"),
        [held[0].to_string()],
        "one slice, though the claim's answer was lost"
    );
    assert_eq!(store.pools().len(), 1, "one pool, though its create's answer was lost");
    assert!(store.faults().values().sum::<u64>() >= 2, "both faults were met: {:?}", store.faults());
}

#[tokio::test]
async fn adaptive_slices_are_claimed_ahead_at_their_smallest() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let ipam = serde_json::json!({"range": "198.18.0.0/24", "node_slice_size": "/26", "min_node_slice_size": "/28"});
    let held = hold_slices(&host, &config(ipam, "p"), "node-a").await.unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].prefix_len(), 28);
}

#[tokio::test]
async fn other_modes_hold_nothing_ahead() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let cfg = config(serde_json::json!({"range": "198.18.0.0/24"}), "p");
    assert!(hold_slices(&host, &cfg, "node-a").await.unwrap().is_empty());
    assert_eq!(store.writes(), 0);
}

/// S2 of the fourth review: without reservations, an ADD begun under the old range (here, a /30) plans on the old
/// pool while the NAD grows the range (a /29): the new pool's ADD reads the old pool once, before its plan, and
/// takes .2; the old ADD's guarded add of .2 then landed in the old pool, and two pods held .2. The new pool's first
/// claim marks the old pool replaced before it reads it, and an entry lands in a pool only while its mark is as
/// the claim read it: the old ADD's add is refused, and its retry under the old config claims nothing new there.
#[tokio::test]
async fn an_add_begun_under_the_old_range_cannot_take_what_the_new_pool_hands_out() {
    use crate::store::{AsRead, MarkAsRead, Patched, PoolStore as _};
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let old = serde_json::json!({"range": "198.18.64.0/30", "enable_overlapping_ranges": false});
    let grown = serde_json::json!({"range": "198.18.64.0/29", "enable_overlapping_ranges": false});
    let first = add(&host, &config(old.clone(), "p1"), &request("c1", "n")).await.unwrap();
    assert_eq!(first[0].ip.to_string(), "198.18.64.1");
    // the old config's ADD of pod x has read the old pool and planned .2 (offset 2); its write is on its way
    let old_name = "198.18.64.0-30";
    let as_read = store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some(old_name)).unwrap();
    let x = IpAllocation {
        id: "cx".into(),
        podref: "ns/x".into(),
        ifname: "net1".into(),
        node: Some("n".into()),
        ..Default::default()
    };
    let x_read = AsRead { replaced: Some(MarkAsRead::of(&as_read)), ..Default::default() };
    // meanwhile the NAD grew, and the new config's ADD of pod y ran to its end
    let y = add(&host, &config(grown.clone(), "y"), &request("cy", "n")).await.unwrap();
    assert_eq!(y[0].ip.to_string(), "198.18.64.2", "the new pool's lowest free address");
    let marked = store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some(old_name)).unwrap();
    assert!(crate::store::replaced_at(&marked).is_some(), "the new pool's claim marked the old one");
    // the old ADD's write lands now
    let landed = store.add_allocation(old_name, 2, &x, &x_read).await.unwrap();
    assert!(matches!(landed, Patched::Refused(_)), "the old ADD's add of .2 was applied: {landed:?}");
    assert_no_address_twice(&store);
    // its retry, still under the old config, claims nothing new in the replaced pool
    let again = add(&host, &config(old.clone(), "x"), &request("cx", "n")).await.unwrap_err();
    assert_eq!(again.code, Code::TryAgainLater, "{again:?}");
    assert!(again.details.contains("was replaced at"), "{}", again.details);
    // under the new config it gets an address of its own
    let retried = add(&host, &config(grown, "x"), &request("cx", "n")).await.unwrap();
    assert_ne!(retried[0].ip, y[0].ip);
    assert_no_address_twice(&store);
    // an ADD of the old config that already holds its entry there keeps it: p1's retry
    assert_eq!(add(&host, &config(old, "p1"), &request("c1", "n")).await.unwrap()[0].ip, first[0].ip);
}

/// Found by the simulation once its refusals were answered as the shipped node policy answers them (403): an
/// entry write whose answer was lost (applied), retried and refused, was taken for never written; the ADD failed
/// and its roll-back gave the reservation back, leaving the entry without it. The refusal is read back now: the
/// earlier try's entry is the ADD's.
#[tokio::test]
async fn a_refused_retry_of_a_write_whose_answer_was_lost_keeps_the_entry_it_wrote() {
    use crate::store::memory::{Fault, FaultPlan, Op};
    let store = MemoryStore::new(NS);
    // the store's first guarded pool patch is the new pool's settle (crate::claim::replaces); the entry's add is the second
    let plan =
        FaultPlan::quiet(3).at(Op::AddAllocation, 2, Fault::LostResponse).at(Op::AddAllocation, 3, Fault::Refused);
    let host = TestHost(store.handle("refused-retry", plan));
    let ipam = serde_json::json!({"range": "198.18.65.0/29"});
    let got = add(&host, &config(ipam, "p"), &request("c1", "n")).await.expect("the earlier try's entry is the ADD's");
    assert_eq!(got[0].ip.to_string(), "198.18.65.1");
    let held = held(&store);
    assert_eq!(held.len(), 1, "{held:?}");
    let reservations: Vec<String> = store.reservations().iter().map(|r| r.spec.podref.clone()).collect();
    assert_eq!(reservations, ["ns/p"], "the entry keeps its reservation");
}

/// Found by the simulation's reboot cases: a failed ADD's entry (its roll-back out of time) stayed in node-a's pool
/// of a slice the NodeSlicePool then listed as node-b's; GC read only the pools of the slices as listed, so the
/// entry of the gone sandbox stayed while its pod lived. GC also looks through the node's own pools of the
/// network's other slices (one list of the pools).
#[tokio::test]
async fn gc_finds_the_nodes_entry_in_its_pool_of_a_slice_listed_as_another_nodes() {
    let store = MemoryStore::new(NS);
    let ipam = serde_json::json!({"range": "198.18.0.0/28", "node_slice_size": "/30"});
    let cfg = config(ipam, "p");
    let ip = add(&TestHost(store.clone()), &cfg, &request("c-gone", "node-a")).await.unwrap()[0].ip;
    // written long ago; then the slice listed as node-b's (node-a's pool keeps the entry)
    let mut pool = store.pools().into_iter().next().unwrap();
    for entry in pool.spec.allocations.values_mut() {
        entry.allocated = Some("2026-01-01T00:00:00Z".into());
    }
    store.put_pool(pool);
    let mut listing = store.node_slices().pop().unwrap();
    let status = listing.status.as_mut().unwrap();
    let slice = status.allocations.iter_mut().find(|s| s.node_name == "node-a").unwrap();
    assert!(slice.slice_range.parse::<ipnet::IpNet>().unwrap().contains(&ip));
    slice.node_name = "node-b".into();
    store.put_node_slices(listing);
    let released = gc(&TestHost(store.clone()), &ReleaseConfig::from(cfg), &request("", "node-a"), &[]).await.unwrap();
    assert_eq!(released, 1, "node-a's gone sandbox's entry: {:?}", held(&store));
    assert!(held(&store).is_empty());
}

/// Found by `make fuzz`'s parse fuzzer (seed 7522544532343385973): a range whose one usable address lies in one of
/// 128 /32 slices (`range_start` = `range_end`). The ADD claimed free slices at random, found each without a usable
/// address full and claimed the next, until its budget ran out (code 11), holding the slices it had claimed. A free
/// slice without a usable address is never claimed now: the ADD claims the one slice that has one.
#[tokio::test(start_paused = true)]
async fn a_free_slice_without_a_usable_address_is_never_claimed() {
    let store = MemoryStore::new(NS);
    let host = TestHost(store.clone());
    let ipam = serde_json::json!({"ipRanges": [{"range": "198.18.54.29-198.18.54.29/25"}], "node_slice_size": "/32"});
    for (i, node) in ["node-1", "node-2"].into_iter().enumerate() {
        let got = add(&host, &config(ipam.clone(), &format!("p{i}")), &request(&format!("c{i}"), node)).await;
        if i == 0 {
            assert_eq!(got.unwrap()[0].ip.to_string(), "198.18.54.29");
        } else {
            assert_eq!(got.unwrap_err().code, Code::RangeExhausted, "the one address is node-1's");
        }
    }
    let listing = store.node_slices().pop().unwrap().status.unwrap().allocations;
    let held: Vec<_> = listing.iter().filter(|s| !s.node_name.is_empty()).map(|s| s.slice_range.clone()).collect();
    assert_eq!(held, ["198.18.54.29/32"], "one slice claimed, the one with the usable address");
}
