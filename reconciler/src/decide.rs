//! Pure decisions: is an allocation still held by a live pod? Every release the reconciler makes goes through
//! [`judge`], so the rules that keep a live pod's address safe are all here, and property-tested.

use std::time::Duration;

use hereabouts_ipam::crd::IpAllocation;
use k8s_openapi::jiff::Timestamp;

/// What the API server says of the pod an allocation names, read right before deciding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodView {
    /// No pod of that namespace and name exists.
    Missing,
    /// A pod of that name exists.
    Present {
        /// Its UID.
        uid: String,
        /// Phase Succeeded or Failed: its sandbox is gone for good.
        finished: bool,
    },
}

/// Why an allocation is given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The pod was deleted.
    Deleted,
    /// The pod reached phase Succeeded or Failed.
    Finished,
    /// A pod of the same name exists, but it is a new one (another UID): the entry is the old pod's.
    Replaced,
}

impl Reason {
    /// The label value in metrics and the word in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Deleted => "pod_deleted",
            Reason::Finished => "pod_finished",
            Reason::Replaced => "pod_replaced",
        }
    }
}

/// Why an allocation is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Its pod is alive (Pending counts: the CNI allocates before the pod runs).
    Live,
    /// It is younger than the grace period and nothing ties it to a pod known to be gone: an ADD may be in flight.
    Fresh,
}

/// The verdict on one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Release(Reason),
    Keep(Keep),
}

/// What is known when judging one allocation.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The pod, as read from the API server.
    pub pod: &'a PodView,
    /// The UID of a pod the caller saw deleted or finish under this name, if any (a watch event).
    pub gone_uid: Option<&'a str>,
    /// Now.
    pub now: Timestamp,
    /// How long a fresh allocation is left alone.
    pub grace: Duration,
}

fn is_fresh(allocation: &IpAllocation, now: Timestamp, grace: Duration) -> bool {
    // An entry without a time (written by Whereabouts) has an unknown age: it is judged by its pod alone.
    let Some(allocated) = allocation.allocated.as_deref().and_then(|t| t.parse::<Timestamp>().ok()) else {
        return false;
    };
    let age = now.duration_since(allocated);
    age.is_negative() || age.unsigned_abs() < grace
}

/// Decides whether `allocation` may be given back.
///
/// The rules, in order:
/// 1. An entry that records the UID of a pod seen gone (`gone_uid`) is that pod's: released at once, whatever its
///    age, unless the API server shows that same pod alive again (a stale event).
/// 2. An entry recording another UID than the pod that exists now is an earlier pod's: released.
/// 3. A live pod keeps its entry (Pending included); a finished one gives it back.
/// 4. An entry whose pod is missing is released, unless it is younger than the grace period.
pub fn judge(allocation: &IpAllocation, facts: &Facts<'_>) -> Verdict {
    let recorded = allocation.poduid.as_deref();
    match facts.pod {
        PodView::Present { uid, finished } => {
            if recorded.is_some_and(|r| r != uid) {
                let seen_gone = recorded == facts.gone_uid;
                return if !seen_gone && is_fresh(allocation, facts.now, facts.grace) {
                    Verdict::Keep(Keep::Fresh)
                } else {
                    Verdict::Release(Reason::Replaced)
                };
            }
            if *finished { Verdict::Release(Reason::Finished) } else { Verdict::Keep(Keep::Live) }
        }
        PodView::Missing => {
            let seen_gone = recorded.is_some() && recorded == facts.gone_uid;
            if !seen_gone && is_fresh(allocation, facts.now, facts.grace) {
                Verdict::Keep(Keep::Fresh)
            } else {
                Verdict::Release(Reason::Deleted)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GRACE: Duration = Duration::from_secs(60);

    fn mk_alloc(uid: Option<&str>, age_secs: Option<i64>, now: Timestamp) -> IpAllocation {
        IpAllocation {
            id: "c1".into(),
            podref: "ns/p".into(),
            ifname: "net1".into(),
            poduid: uid.map(str::to_string),
            allocated: age_secs.map(|a| (now - k8s_openapi::jiff::SignedDuration::from_secs(a)).to_string()),
            ..Default::default()
        }
    }

    fn facts<'a>(pod: &'a PodView, gone_uid: Option<&'a str>, now: Timestamp) -> Facts<'a> {
        Facts { pod, gone_uid, now, grace: GRACE }
    }

    fn live(uid: &str) -> PodView {
        PodView::Present { uid: uid.into(), finished: false }
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
    fn a_pending_pod_with_a_fresh_allocation_is_kept_even_after_a_delete_event_of_its_predecessor() {
        let now = Timestamp::now();
        // StatefulSet: old pod u0 deleted, new pod u1 (same name) allocated a second ago
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
        // no timestamp (Whereabouts): judged by the pod alone
        let v = judge(&mk_alloc(None, None, now), &facts(&PodView::Missing, None, now));
        assert_eq!(v, Verdict::Release(Reason::Deleted));
    }

    #[test]
    fn finished_and_replaced_pods_give_back() {
        let now = Timestamp::now();
        let done = PodView::Present { uid: "u1".into(), finished: true };
        assert_eq!(
            judge(&mk_alloc(Some("u1"), Some(1), now), &facts(&done, None, now)),
            Verdict::Release(Reason::Finished)
        );
        assert_eq!(judge(&mk_alloc(None, None, now), &facts(&done, None, now)), Verdict::Release(Reason::Finished));
        let v = judge(&mk_alloc(Some("u0"), Some(3600), now), &facts(&live("u1"), None, now));
        assert_eq!(v, Verdict::Release(Reason::Replaced));
    }

    proptest! {
        /// Whatever the entry records, its age, and whatever event was seen: an entry is never released while the
        /// API server shows its own pod (same UID, or no UID recorded) alive.
        #[test]
        fn never_releases_a_live_pods_address(
            recorded in proptest::option::of("u[0-3]"),
            live_uid in "u[0-3]",
            gone in proptest::option::of("u[0-3]"),
            age in proptest::option::of(-100i64..100_000),
        ) {
            let now = Timestamp::now();
            let alloc = mk_alloc(recorded.as_deref(), age, now);
            let pod = live(&live_uid);
            let verdict = judge(&alloc, &facts(&pod, gone.as_deref(), now));
            let owned_by_live = recorded.as_deref().is_none_or(|r| r == live_uid);
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
    }
}
