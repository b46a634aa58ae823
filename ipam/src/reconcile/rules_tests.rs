use super::*;
use crate::crd::IpPoolSpec;
use k8s_openapi::jiff::SignedDuration;
use proptest::prelude::*;
use std::net::IpAddr;

const GRACE: Duration = Duration::from_secs(60);
const ORPHAN_AGE: Duration = Duration::from_secs(300);

fn ago(now: Timestamp, secs: i64) -> Timestamp {
    now - SignedDuration::from_secs(secs)
}

fn mk_alloc(uid: Option<&str>, age_secs: Option<i64>, now: Timestamp) -> IpAllocation {
    IpAllocation {
        id: "c1".into(),
        podref: "ns/p".into(),
        ifname: "net1".into(),
        poduid: uid.map(str::to_string),
        allocated: age_secs.map(|a| ago(now, a).to_string()),
        recorded_for: Some("c1".into()),
        ..Default::default()
    }
}

fn mk_entry(podref: &str, reserved: bool) -> IpAllocation {
    IpAllocation { id: "c".into(), podref: podref.into(), ifname: "net1".into(), reserved, ..Default::default() }
}

fn mk_pool(name: &str, range: &str, entries: &[(u128, &str)]) -> IpPool {
    let allocations = entries.iter().map(|(o, p)| (o.to_string(), mk_entry(p, true))).collect();
    IpPool::new(name, IpPoolSpec { range: range.into(), allocations, ..Default::default() })
}

fn mk_spec(podref: &str) -> OverlappingRangeIpReservationSpec {
    OverlappingRangeIpReservationSpec {
        containerid: "c".into(),
        ifname: "net1".into(),
        podref: podref.into(),
        ipamclaim: None,
    }
}

fn mk_holder(podref: &str) -> Holder {
    Holder { pool: "p".into(), offset: 1, entry: mk_entry(podref, true) }
}

fn facts<'a>(pod: &'a PodView, gone_uid: Option<&'a str>, now: Timestamp) -> Facts<'a> {
    Facts { pod, gone_uid, now, grace: GRACE, sticky: false, claimed: false }
}

fn live(uid: &str) -> PodView {
    PodView::Present { uid: uid.into(), finished: false, mirror: false }
}

fn mirror(uid: &str) -> PodView {
    PodView::Present { uid: uid.into(), finished: false, mirror: true }
}

#[test]
fn a_live_pod_keeps_its_address_fresh_or_old() {
    let now = Timestamp::now();
    for age in [None, Some(1), Some(3600)] {
        for uid in [None, Some("u1")] {
            let v = judge(&mk_alloc(uid, age, now), &facts(&live("u1"), None, now));
            assert_eq!(v, Verdict::Keep(Keep::Live), "uid {uid:?} age {age:?}");
        }
    }
}

#[test]
fn a_static_pod_is_matched_by_name_not_by_the_mirror_pods_uid() {
    let now = Timestamp::now();
    // the CNI recorded the kubelet's UID; the API server shows the mirror pod's
    let entry = mk_alloc(Some("kubelet-uid"), Some(3600), now);
    assert_eq!(judge(&entry, &facts(&mirror("mirror-uid"), None, now)), Verdict::Keep(Keep::Live));
    // an ordinary pod of that name with another UID is a replacement
    assert_eq!(judge(&entry, &facts(&live("other"), None, now)), Verdict::Release(Reason::Replaced));
    // a finished static pod gives it back
    let done = PodView::Present { uid: "mirror-uid".into(), finished: true, mirror: true };
    assert_eq!(judge(&entry, &facts(&done, None, now)), Verdict::Release(Reason::Finished));
}

#[test]
fn a_pending_pod_with_a_fresh_allocation_is_kept_even_after_a_delete_event_of_its_predecessor() {
    let now = Timestamp::now();
    let v = judge(&mk_alloc(Some("u1"), Some(1), now), &facts(&live("u1"), Some("u0"), now));
    assert_eq!(v, Verdict::Keep(Keep::Live));
}

#[test]
fn a_deleted_pods_entry_goes_at_once_when_its_uid_was_seen_gone() {
    let now = Timestamp::now();
    let v = judge(&mk_alloc(Some("u1"), Some(1), now), &facts(&PodView::Missing, Some("u1"), now));
    assert_eq!(v, Verdict::Release(Reason::Deleted));
}

#[test]
fn a_missing_pods_fresh_entry_waits_for_the_grace_period() {
    let now = Timestamp::now();
    let v = judge(&mk_alloc(None, Some(5), now), &facts(&PodView::Missing, None, now));
    assert_eq!(v, Verdict::Keep(Keep::Fresh));
    let v = judge(&mk_alloc(None, Some(120), now), &facts(&PodView::Missing, None, now));
    assert_eq!(v, Verdict::Release(Reason::Deleted));
    // the grace period is what it waits, not a moment more
    let v = judge(&mk_alloc(None, Some(GRACE.as_secs() as i64), now), &facts(&PodView::Missing, None, now));
    assert_eq!(v, Verdict::Release(Reason::Deleted));
    // no timestamp (Whereabouts): judged by the pod alone
    let v = judge(&mk_alloc(None, None, now), &facts(&PodView::Missing, None, now));
    assert_eq!(v, Verdict::Release(Reason::Deleted));
}

#[test]
fn finished_and_replaced_pods_give_back() {
    let now = Timestamp::now();
    let done = PodView::Present { uid: "u1".into(), finished: true, mirror: false };
    assert_eq!(
        judge(&mk_alloc(Some("u1"), Some(1), now), &facts(&done, None, now)),
        Verdict::Release(Reason::Finished)
    );
    assert_eq!(judge(&mk_alloc(None, None, now), &facts(&done, None, now)), Verdict::Release(Reason::Finished));
    let v = judge(&mk_alloc(Some("u0"), Some(3600), now), &facts(&live("u1"), None, now));
    assert_eq!(v, Verdict::Release(Reason::Replaced));
}

/// A pod recreated under its name: the earlier pod's entry, younger than the grace period, waits (its sandbox may
/// still be torn down), unless that pod's UID was seen gone; another UID's event says nothing of it.
#[test]
fn a_replaced_pods_fresh_entry_waits_unless_its_uid_was_seen_gone() {
    let now = Timestamp::now();
    let fresh = mk_alloc(Some("u0"), Some(5), now);
    assert_eq!(judge(&fresh, &facts(&live("u1"), None, now)), Verdict::Keep(Keep::Fresh));
    assert_eq!(judge(&fresh, &facts(&live("u1"), Some("u0"), now)), Verdict::Release(Reason::Replaced));
    assert_eq!(judge(&fresh, &facts(&live("u1"), Some("u9"), now)), Verdict::Keep(Keep::Fresh));
}

#[test]
fn an_unparsable_podref_is_never_judged() {
    let now = Timestamp::now();
    for podref in ["", "nopod", "/p", "ns/", "a/b/c"] {
        let entry = IpAllocation { podref: podref.into(), ..mk_alloc(None, None, now) };
        assert_eq!(judge(&entry, &facts(&PodView::Missing, None, now)), Verdict::Keep(Keep::Unjudgeable), "{podref:?}");
    }
}

#[test]
fn resync_suspects_entries_of_this_node_whose_pod_is_not_a_live_one_here() {
    let pods: HashMap<String, KnownPod> = [
        ("ns/live".to_string(), KnownPod { uid: "u1".into(), finished: false }),
        ("ns/done".to_string(), KnownPod { uid: "u2".into(), finished: true }),
    ]
    .into();
    let on = |podref: &str, uid: Option<&str>, node: &str| IpAllocation {
        id: "c1".into(),
        podref: podref.into(),
        poduid: uid.map(str::to_string),
        node: Some(node.into()),
        recorded_for: Some("c1".into()),
        ..Default::default()
    };
    assert!(!suspicious(&on("ns/live", Some("u1"), "n1"), "n1", &pods));
    assert!(!suspicious(&on("ns/live", None, "n1"), "n1", &pods));
    assert!(suspicious(&on("ns/live", Some("u0"), "n1"), "n1", &pods));
    assert!(suspicious(&on("ns/done", Some("u2"), "n1"), "n1", &pods));
    assert!(suspicious(&on("ns/gone", None, "n1"), "n1", &pods));
    assert!(!suspicious(&on("ns/gone", None, "n2"), "n1", &pods), "another node's entry");
    let taken_over = IpAllocation { id: "c2".into(), ..on("ns/live", Some("u0"), "n1") };
    assert!(!suspicious(&taken_over, "n1", &pods), "another tool's sandbox now: node and UID are an earlier one's");
}

/// Whereabouts (and its fork) give a recreated pod's ADD the entry its predecessor of the same name left, by
/// rewriting only `id`: the UID and time hereabouts wrote are then the old pod's, and judging by them would take
/// the live pod's address away as "replaced".
#[test]
fn an_entry_another_tool_took_over_is_judged_by_its_pod_name() {
    let now = Timestamp::now();
    let old_pod = mk_alloc(Some("uid-old"), Some(9999), now);
    let new_pod = PodView::Present { uid: "uid-new".into(), finished: false, mirror: false };
    let facts = Facts { pod: &new_pod, gone_uid: None, now, grace: GRACE, sticky: false, claimed: false };
    assert_eq!(judge(&old_pod, &facts), Verdict::Release(Reason::Replaced), "hereabouts' own entry of the old pod");
    let taken_over = IpAllocation { id: "whereabouts-sandbox".into(), ..old_pod.clone() };
    assert_eq!(judge(&taken_over, &facts), Verdict::Keep(Keep::Live));
    let gone = Facts { pod: &PodView::Missing, gone_uid: Some("uid-old"), ..facts };
    assert_eq!(judge(&taken_over, &gone), Verdict::Release(Reason::Deleted), "its pod gone, it goes");
    let before_the_field = IpAllocation { recorded_for: None, ..old_pod };
    assert_eq!(judge(&before_the_field, &facts), Verdict::Keep(Keep::Live), "no record of whose: by name");
}

#[test]
fn reservations_no_entry_accounts_for_are_released_once_old() {
    let now = Timestamp::now();
    let spec = mk_spec("ns/a");
    let judge_at = |age: Option<i64>, holders: &[Holder], known: bool| {
        judge_reservation(&spec, age.map(|a| ago(now, a)), holders, known, now, ORPHAN_AGE)
    };
    assert_eq!(judge_at(Some(10), &[mk_holder("ns/a")], true), ReservationVerdict::Keep(KeepReservation::Accounted));
    assert_eq!(judge_at(Some(9999), &[mk_holder("ns/a")], true), ReservationVerdict::Keep(KeepReservation::Accounted));
    assert_eq!(judge_at(Some(10), &[], true), ReservationVerdict::Keep(KeepReservation::Fresh));
    assert_eq!(judge_at(Some(301), &[], true), ReservationVerdict::Release);
    assert_eq!(judge_at(None, &[], true), ReservationVerdict::Release);
    assert_eq!(judge_at(Some(9999), &[], false), ReservationVerdict::Keep(KeepReservation::Unknown));
    assert_eq!(judge_at(Some(9999), &[mk_holder("ns/b")], true), ReservationVerdict::Conflict("ns/b".into()));
}

#[test]
fn a_live_entry_without_its_reservation_gets_it_back() {
    let spec = mk_spec("ns/a");
    assert_eq!(entry_claim(&mk_entry("ns/a", true), None), EntryClaim::Missing);
    assert_eq!(entry_claim(&mk_entry("ns/a", false), None), EntryClaim::Fine, "a network that reserves nothing");
    assert_eq!(entry_claim(&mk_entry("ns/a", true), Some(&spec)), EntryClaim::Fine);
    assert_eq!(entry_claim(&mk_entry("ns/b", true), Some(&spec)), EntryClaim::Conflict("ns/a".into()));
}

#[test]
fn the_index_maps_reservations_to_entries_and_pools() {
    let pools = [
        mk_pool("10.0.0.0-24", "10.0.0.0/24", &[(5, "ns/a")]),
        mk_pool("10.0.0.0-28", "10.0.0.0/28", &[(5, "ns/b")]),
        mk_pool("net-x-10.0.0.0-24", "10.0.0.0/24", &[(7, "ns/c")]),
        mk_pool("fd00---64", "fd00::/64", &[(1, "ns/d")]),
    ];
    let index = Index::new(&pools);
    let pods = |name: &str| index.holders(name).iter().map(|h| h.entry.podref.clone()).collect::<Vec<_>>();
    assert_eq!(pods("10.0.0.5"), ["ns/a", "ns/b"]);
    assert_eq!(pods("net-x-10.0.0.7"), ["ns/c"]);
    assert_eq!(pods("fd00--1"), ["ns/d"]);
    assert!(pods("10.0.0.6").is_empty());
    assert_eq!(index.pools_for("10.0.0.9"), ["10.0.0.0-24", "10.0.0.0-28"]);
    assert_eq!(index.pools_for("10.0.0.200"), ["10.0.0.0-24"]);
    assert_eq!(index.pools_for("net-x-10.0.0.9"), ["net-x-10.0.0.0-24"]);
    assert_eq!(index.pools_for("fd00--abcd"), ["fd00---64"]);
    assert!(index.pools_for("10.1.0.1").is_empty());
    assert!(index.pools_for("net-y-10.0.0.9").is_empty());
    assert_eq!(index.doubly_held(), [("10.0.0.5", BTreeSet::from(["ns/a", "ns/b"]))]);
}

proptest! {
    /// Whatever the entry records, its age, and whatever event was seen: an entry is never released while the
    /// API server shows its own pod (same UID, no UID recorded, or a mirror pod of that name) alive.
    #[test]
    fn never_releases_a_live_pods_address(
        recorded in proptest::option::of("u[0-3]"),
        live_uid in "u[0-3]",
        is_mirror: bool,
        gone in proptest::option::of("u[0-3]"),
        age in proptest::option::of(-100i64..100_000),
    ) {
        let now = Timestamp::now();
        let alloc = mk_alloc(recorded.as_deref(), age, now);
        let pod = PodView::Present { uid: live_uid.clone(), finished: false, mirror: is_mirror };
        let verdict = judge(&alloc, &facts(&pod, gone.as_deref(), now));
        let owned_by_live = is_mirror || recorded.as_deref().is_none_or(|r| r == live_uid);
        if owned_by_live {
            prop_assert_eq!(verdict, Verdict::Keep(Keep::Live));
        }
    }

    /// A fresh entry is only released when tied to a pod known to be gone (its UID seen deleted).
    #[test]
    fn fresh_entries_survive_unless_their_pod_was_seen_gone(
        recorded in proptest::option::of("u[0-3]"),
        gone in proptest::option::of("u[0-3]"),
        age in 0i64..59,
    ) {
        let now = Timestamp::now();
        let alloc = mk_alloc(recorded.as_deref(), Some(age), now);
        let verdict = judge(&alloc, &facts(&PodView::Missing, gone.as_deref(), now));
        let seen_gone = recorded.is_some() && recorded == gone;
        prop_assert_eq!(matches!(verdict, Verdict::Release(_)), seen_gone);
    }

    /// A reservation is released only when no entry accounts for it, its network and range are known, and its
    /// last claim is at least the orphan age old; an accounted one never is.
    #[test]
    fn reservations_are_released_only_as_old_unaccounted_orphans(
        holder in proptest::option::of("ns/[a-c]"),
        claimed in proptest::option::of(-100i64..1000),
        known: bool,
    ) {
        let now = Timestamp::now();
        let holders: Vec<Holder> = holder.iter().map(|p| mk_holder(p)).collect();
        let verdict =
            judge_reservation(&mk_spec("ns/a"), claimed.map(|a| ago(now, a)), &holders, known, now, ORPHAN_AGE);
        let old = claimed.is_none_or(|a| a >= 300);
        prop_assert_eq!(verdict == ReservationVerdict::Release, holders.is_empty() && known && old);
    }

    /// Reservation names turn back into the addresses they were made from, in any network and family.
    #[test]
    fn reservation_names_invert(v4: u32, v6: u128, network in "(|net|net-a|a-1)") {
        let cases = [
            ("0.0.0.0/0", IpAddr::V4(v4.into())),
            ("::/0", IpAddr::V6(v6.into())),
        ];
        for (cidr, ip) in cases {
            let range = IpRange::parse(cidr, None, None, &[]).unwrap();
            if ip.is_ipv6() && ip.to_canonical().is_ipv4() {
                continue; // Go prints IPv4-mapped IPv6 as IPv4: such names are IPv4 ones
            }
            let name = names::reservation_name(&network, ip);
            prop_assert_eq!(reservation_address(&name, &network, &range), Some(ip));
        }
    }
}

fn set(replicas: i32, start: i32, deleting: bool) -> StatefulSetView {
    StatefulSetView { replicas, start, deleting }
}

#[test]
fn a_statefulset_wants_the_ordinals_below_its_replicas_from_its_start() {
    let entry = |podref: &str| IpAllocation {
        podref: podref.into(),
        statefulset: Some("web".into()),
        ..mk_alloc(Some("u1"), Some(3600), Timestamp::now())
    };
    assert!(sticky_wanted(&entry("ns/web-0"), Some(&set(2, 0, false))));
    assert!(sticky_wanted(&entry("ns/web-1"), Some(&set(2, 0, false))));
    assert!(!sticky_wanted(&entry("ns/web-2"), Some(&set(2, 0, false))), "scaled down");
    assert!(!sticky_wanted(&entry("ns/web-0"), None), "gone");
    assert!(!sticky_wanted(&entry("ns/web-0"), Some(&set(2, 0, true))), "being deleted");
    assert!(!sticky_wanted(&entry("ns/web-0"), Some(&set(0, 0, false))), "scaled to zero");
    assert!(sticky_wanted(&entry("ns/web-5"), Some(&set(2, 5, false))), "spec.ordinals.start");
    assert!(!sticky_wanted(&entry("ns/web-4"), Some(&set(2, 5, false))));
    for other in ["ns/web-01", "ns/web-", "ns/webx-0", "ns/web-0a", "ns/other-0", "web-0"] {
        assert!(!sticky_wanted(&entry(other), Some(&set(9, 0, false))), "{other}");
    }
    let plain = mk_alloc(Some("u1"), Some(3600), Timestamp::now());
    assert!(!sticky_wanted(&plain, Some(&set(2, 0, false))), "not a sticky entry");
}

#[test]
fn an_ipamclaims_entry_outlives_its_pods_until_the_claim_is_gone() {
    let now = Timestamp::now();
    let entry = IpAllocation {
        podref: "ns/virt-launcher-vm1-abcde".into(),
        ipamclaim: Some("vm1.net".into()),
        ..mk_alloc(Some("u1"), Some(3600), now)
    };
    let judged = |pod: &PodView, claimed: bool| {
        judge(&entry, &Facts { pod, gone_uid: Some("u1"), now, grace: GRACE, sticky: false, claimed })
    };
    assert_eq!(judged(&PodView::Missing, true), Verdict::Keep(Keep::Claimed), "the VM stopped; its claim stays");
    assert_eq!(judged(&live("u1"), false), Verdict::Keep(Keep::Live), "a live pod keeps it, claim or not");
    assert_eq!(judged(&PodView::Missing, false), Verdict::Release(Reason::Deleted), "the claim is gone");
    let plain = mk_alloc(Some("u1"), Some(3600), now);
    let facts = Facts { pod: &PodView::Missing, gone_uid: None, now, grace: GRACE, sticky: false, claimed: true };
    assert_eq!(judge(&plain, &facts), Verdict::Release(Reason::Deleted), "`claimed` says nothing of other entries");

    let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
    let recorded = ["198.18.0.5/24".to_string(), "2001:db8::5".to_string()];
    assert!(claim_wants(Some(&recorded), ip("198.18.0.5")));
    assert!(claim_wants(Some(&recorded), ip("2001:db8::5")), "a bare address too");
    assert!(!claim_wants(Some(&recorded), ip("198.18.0.6")), "an address the claim does not record");
    assert!(claim_wants(Some(&[]), ip("198.18.0.6")), "nothing recorded yet: its ADD is under way");
    assert!(!claim_wants(None, ip("198.18.0.5")), "the claim is gone");
}

#[test]
fn a_wanted_sticky_entry_outlives_its_pod_and_nothing_else_changes() {
    let now = Timestamp::now();
    let sticky = IpAllocation {
        podref: "ns/web-0".into(),
        statefulset: Some("web".into()),
        ..mk_alloc(Some("u1"), Some(3600), now)
    };
    let wanted = |pod: &PodView, gone: Option<&str>| {
        judge(&sticky, &Facts { pod, gone_uid: gone, now, grace: GRACE, sticky: true, claimed: false })
    };
    assert_eq!(wanted(&PodView::Missing, Some("u1")), Verdict::Keep(Keep::Sticky), "deleted, seen gone");
    assert_eq!(wanted(&live("u2"), None), Verdict::Keep(Keep::Sticky), "recreated under the same name");
    let finished = PodView::Present { uid: "u1".into(), finished: true, mirror: false };
    assert_eq!(wanted(&finished, None), Verdict::Keep(Keep::Sticky));
    assert_eq!(wanted(&live("u1"), None), Verdict::Keep(Keep::Live), "a live pod is simply live");
    let fresh = IpAllocation { allocated: Some(now.to_string()), ..sticky.clone() };
    let facts = Facts { pod: &PodView::Missing, gone_uid: None, now, grace: GRACE, sticky: true, claimed: false };
    assert_eq!(judge(&fresh, &facts), Verdict::Keep(Keep::Sticky), "fresh too: the reason that lasts");
    // not wanted: the ordinary rules
    let unwanted =
        Facts { pod: &PodView::Missing, gone_uid: Some("u1"), now, grace: GRACE, sticky: false, claimed: false };
    assert_eq!(judge(&sticky, &unwanted), Verdict::Release(Reason::Deleted));
    // `sticky` says nothing of an entry that records no StatefulSet
    let plain = mk_alloc(Some("u1"), Some(3600), now);
    let facts = Facts { pod: &PodView::Missing, gone_uid: None, now, grace: GRACE, sticky: true, claimed: false };
    assert_eq!(judge(&plain, &facts), Verdict::Release(Reason::Deleted));
}

fn mk_warm(node: &str) -> IpAllocation {
    IpAllocation {
        id: "warm-1".into(),
        podref: crate::warm::podref(node),
        ifname: "warm-1".into(),
        node: Some(node.into()),
        reserved: true,
        allocated: Some(ago(Timestamp::now(), 3600).to_string()),
        recorded_for: Some("warm-1".into()),
        ..Default::default()
    }
}

#[test]
fn a_warm_entry_is_kept_while_its_node_exists_and_released_once_it_is_gone() {
    let warm = mk_warm("n1");
    assert_eq!(warm_node(&warm), Some("n1"));
    let grace = Duration::from_secs(60);
    for (node, missing_for, verdict) in [
        (NodeView::Present, 0, Verdict::Keep(Keep::Warm)),
        (NodeView::Present, 3600, Verdict::Keep(Keep::Warm)),
        (NodeView::Missing, 0, Verdict::Keep(Keep::Warm)),
        (NodeView::Missing, 59, Verdict::Keep(Keep::Warm)),
        (NodeView::Missing, 60, Verdict::Release(Reason::NodeGone)),
    ] {
        assert_eq!(judge_warm(node, Duration::from_secs(missing_for), grace), verdict, "{node:?} {missing_for}");
    }
    // S5 of the fourth review: a grace the operator lowered for pods (its minimum is 0) freed a missing Node's
    // warm entries, pending takes of live pods among them, before its agent (reading the Node every 10 s) had
    // stopped taking; the floor holds whatever the grace
    for grace in [0, 5, 30] {
        let grace = Duration::from_secs(grace);
        for missing_for in [0, 10, 59] {
            let verdict = judge_warm(NodeView::Missing, Duration::from_secs(missing_for), grace);
            assert_eq!(verdict, Verdict::Keep(Keep::Warm), "grace {grace:?}, missing {missing_for} s");
        }
        let verdict = judge_warm(NodeView::Missing, WARM_GRACE_FLOOR, grace);
        assert_eq!(verdict, Verdict::Release(Reason::NodeGone), "grace {grace:?}");
    }
    assert_eq!(
        judge_warm(NodeView::Missing, Duration::from_secs(119), Duration::from_secs(120)),
        Verdict::Keep(Keep::Warm),
        "a longer grace is kept"
    );
    assert_eq!(Reason::NodeGone.as_str(), "node_gone");
    for podref in ["ns/p", "hereabouts-warm:", "nopod", "", "ns/hereabouts-warm:n1"] {
        let entry = IpAllocation { podref: podref.into(), ..warm.clone() };
        assert_eq!(warm_node(&entry), None, "{podref:?} is no node's reserve");
    }
}

#[test]
fn the_node_loop_never_suspects_a_warm_entry_of_its_node() {
    let live: HashMap<String, KnownPod> =
        [("ns/live".to_string(), KnownPod { uid: "u1".into(), finished: false })].into();
    for on_node in [HashMap::new(), live] {
        assert!(!suspicious(&mk_warm("n1"), "n1", &on_node), "its own warm entry");
        assert!(!suspicious(&mk_warm("n2"), "n1", &on_node), "another node's");
        // the same entry with a pod's podref is suspected: only the warm token exempts it
        let pods = IpAllocation { podref: "ns/gone".into(), ..mk_warm("n1") };
        assert!(suspicious(&pods, "n1", &on_node));
    }
}

#[test]
fn a_warm_reservation_is_accounted_while_its_warm_entry_exists() {
    let now = Timestamp::now();
    let token = crate::warm::podref("n1");
    let warm = Holder { pool: "p".into(), offset: 1, entry: mk_warm("n1") };
    let judge_at = |spec: &OverlappingRangeIpReservationSpec, holders: &[Holder]| {
        judge_reservation(spec, Some(ago(now, 9999)), holders, true, now, ORPHAN_AGE)
    };
    let spec = OverlappingRangeIpReservationSpec { containerid: "warm-1".into(), ..mk_spec(&token) };
    assert_eq!(judge_at(&spec, std::slice::from_ref(&warm)), ReservationVerdict::Keep(KeepReservation::Accounted));
    assert_eq!(judge_at(&spec, &[]), ReservationVerdict::Release, "its entry released: an orphan");
    // mid hand-over the pod holds the reservation before the entry is rewritten: reported from the entry's side,
    // never released
    assert_eq!(judge_at(&mk_spec("ns/a"), &[warm]), ReservationVerdict::Conflict(token));
}

proptest! {
    /// Whatever the pod facts say of a warm entry's podref (which names no pod), no pod rule gives a node's
    /// reserve back: only its Node's end does (`judge_warm`).
    #[test]
    fn no_pod_rule_releases_a_warm_entry(
        node in "[a-z0-9][a-z0-9.-]{0,20}",
        uid in proptest::option::of("u[0-3]"),
        gone in proptest::option::of("u[0-3]"),
        finished: bool,
        sticky: bool,
        missing: bool,
    ) {
        let now = Timestamp::now();
        let warm = IpAllocation { poduid: uid.clone(), statefulset: sticky.then(|| "web".into()), ..mk_warm(&node) };
        prop_assert_eq!(warm_node(&warm), Some(node.as_str()));
        let pod = if missing {
            PodView::Missing
        } else {
            PodView::Present { uid: uid.unwrap_or_default(), finished, mirror: false }
        };
        let facts = Facts { pod: &pod, gone_uid: gone.as_deref(), now, grace: GRACE, sticky, claimed: false };
        prop_assert!(matches!(judge(&warm, &facts), Verdict::Keep(_)));
    }
}

/// A reservation whose entry went (released, or rolled back) while its own delete failed, in a slice later freed
/// with its empty pool deleted: no pool's range holds it any more, but its NodeSlicePool's does, so it is known,
/// and released as an orphan once old. Before, it was "unknown" and kept for good (the simulation found two such
/// leaks, with the leader's node-slice controller freeing slices on its grace as time passes).
#[test]
fn a_reservation_in_a_freed_slice_without_a_pool_is_known_by_its_node_slice_pool() {
    let spec = crate::crd::NodeSlicePoolSpec { range: "198.18.0.0/28".into(), slice_size: "/30".into() };
    let free = crate::crd::NodeSliceAllocation { node_name: String::new(), slice_range: "198.18.0.12/30".into() };
    let named = crate::store::node_slices_object("net-d", &spec, std::slice::from_ref(&free));
    let other = mk_pool("node-0-198.18.0.0-30", "198.18.0.0/30", &[]);
    let without = Index::new([&other]);
    assert!(!without.knows("198.18.0.13"), "no pool's range holds it");
    let index = Index::new([&other]).with_node_slices(std::slice::from_ref(&named));
    for name in ["198.18.0.13", "net-d-198.18.0.13"] {
        assert!(index.knows(name), "{name}: a NodeSlicePool's range holds it (its network unnamed, or named)");
        assert!(index.pools_for(name).is_empty(), "{name}: no pool to read");
    }
    assert!(!index.knows("198.18.1.1"), "outside every range");
    assert!(!index.knows("other-198.18.0.13"), "another network's");
    let now = Timestamp::now();
    let verdict =
        judge_reservation(&mk_spec("ns/a"), Some(ago(now, 600)), &[], index.knows("198.18.0.13"), now, ORPHAN_AGE);
    assert_eq!(verdict, ReservationVerdict::Release);
}
