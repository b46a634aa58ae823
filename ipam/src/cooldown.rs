//! Reuse cooldown: a released address is not handed out again until a pool's cooldown has passed (Whereabouts
//! #288; Calico's `IPCooldownSeconds`), so a peer still sending to the old pod does not reach a new one.
//!
//! The policy lives on the pool, in the annotation [`COOLDOWN_ANNOTATION`], set by the ADD of a config with
//! `reuse_cooldown_seconds`; so every releaser — the CNI's DEL and GC, the reconciler, `kubectl hereabouts ipam
//! release` — keeps the books without knowing any config. A release writes the time into `spec.released` in the
//! same guarded patch that removes the entry, and prunes the records that have expired. This module decides; the
//! store writes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::crd::IpPool;

/// The pool annotation that holds its reuse cooldown in whole seconds.
pub const COOLDOWN_ANNOTATION: &str = "hereabouts.cni.cncf.io/reuse-cooldown-seconds";

/// The longest cooldown a config may ask for: a day.
pub const MAX_COOLDOWN_SECONDS: u64 = 86_400;

/// The pool's cooldown, if it has one above zero.
pub fn of_pool(pool: &IpPool) -> Option<Duration> {
    let text = pool.metadata.annotations.as_ref()?.get(COOLDOWN_ANNOTATION)?;
    let seconds: u64 = text.trim().parse().ok()?;
    (seconds > 0).then(|| Duration::from_secs(seconds.min(MAX_COOLDOWN_SECONDS)))
}

/// Whether a record written at `text` is still cooling at `now` under `cooldown`. An unreadable time cools nothing
/// (and is pruned). A time later than `now` was written by a releaser whose clock is fast: it is read as `now`
/// (and an ADD that meets it rewrites it so: [`ahead`]), so the address cools for the cooldown, not for the
/// cooldown and the skew (hours, for a clock set wrong).
fn cools(text: &str, cooldown: Duration, now: Timestamp) -> Option<Timestamp> {
    let at: Timestamp = text.parse::<Timestamp>().ok()?.min(now);
    let until = at.checked_add(SignedDuration::try_from(cooldown).ok()?).ok()?;
    (until > now).then_some(until)
}

/// The offsets of `pool` that may not be handed out at `now`, with when each may again.
pub fn cooling(pool: &IpPool, now: Timestamp) -> BTreeMap<u128, Timestamp> {
    let (Some(cooldown), Some(released)) = (of_pool(pool), &pool.spec.released) else { return BTreeMap::new() };
    released.iter().filter_map(|(k, at)| Some((k.parse().ok()?, cools(at, cooldown, now)?))).collect()
}

/// How far ahead of the reader's clock a release time may be before it counts as written by a fast clock: the
/// clocks of two machines kept by NTP agree far better.
pub const CLOCK_TOLERANCE: SignedDuration = SignedDuration::from_secs(2);

/// The release records of `pool` whose time lies ahead of `now` by more than [`CLOCK_TOLERANCE`], offset and the
/// value read: a reader that takes them as `now` must also write them so, or they stay ahead (and cool) until the
/// real time passes them.
pub fn ahead(pool: &IpPool, now: Timestamp) -> Vec<(u128, String)> {
    let Some(released) = &pool.spec.released else { return Vec::new() };
    released
        .iter()
        .filter(|(_, at)| at.parse::<Timestamp>().is_ok_and(|t| t.duration_since(now) > CLOCK_TOLERANCE))
        .filter_map(|(k, at)| Some((k.parse().ok()?, at.clone())))
        .collect()
}

/// What a release of the address at one offset writes besides removing its entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRecord {
    /// The release time, RFC 3339, written at `spec.released["<offset>"]`.
    pub at: String,
    /// Expired records to remove, each with the value it must still have (a concurrent releaser may have
    /// renewed it).
    pub prune: Vec<(String, String)>,
    /// Whether the pool has `spec.released` at all (a JSON patch cannot add below a missing map).
    pub map_exists: bool,
}

/// What releasing `offset` of `pool` at `now` records, if the pool has a cooldown.
pub fn release_record(pool: &IpPool, offset: u128, now: Timestamp) -> Option<ReleaseRecord> {
    let cooldown = of_pool(pool)?;
    let key = offset.to_string();
    let released = pool.spec.released.as_ref();
    let prune = released
        .iter()
        .flat_map(|m| m.iter())
        .filter(|(k, at)| **k != key && cools(at, cooldown, now).is_none())
        .map(|(k, at)| (k.clone(), at.clone()))
        .collect();
    Some(ReleaseRecord { at: now.to_string(), prune, map_exists: released.is_some() })
}

/// `cooling` as a set, for the allocator.
pub fn cooling_offsets(pool: &IpPool, now: Timestamp) -> BTreeSet<u128> {
    cooling(pool, now).into_keys().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::IpPoolSpec;

    fn pool(cooldown: Option<&str>, released: Option<&[(&str, &str)]>) -> IpPool {
        let mut p = IpPool::new(
            "p",
            IpPoolSpec {
                range: "198.18.0.0/29".into(),
                released: released.map(|r| r.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
        );
        if let Some(c) = cooldown {
            p.metadata.annotations = Some([(COOLDOWN_ANNOTATION.to_string(), c.to_string())].into());
        }
        p
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn only_records_younger_than_the_cooldown_cool() {
        let now = at("2026-12-04T12:00:10Z");
        let released = [("1", "2026-12-04T12:00:00Z"), ("2", "2026-12-04T12:00:05Z"), ("3", "garbage")];
        let p = pool(Some("8"), Some(&released));
        assert_eq!(cooling(&p, now), BTreeMap::from([(2, at("2026-12-04T12:00:13Z"))]));
        assert!(cooling(&pool(None, Some(&released)), now).is_empty(), "no annotation: no cooldown");
        assert!(cooling(&pool(Some("0"), Some(&released)), now).is_empty(), "0: off");
        assert!(cooling(&pool(Some("x"), Some(&released)), now).is_empty(), "unreadable: off");
        assert_eq!(of_pool(&pool(Some("999999"), None)), Some(Duration::from_secs(MAX_COOLDOWN_SECONDS)));
    }

    #[test]
    fn a_release_time_in_the_future_cools_for_the_cooldown_only() {
        let now = at("2026-12-04T12:00:10Z");
        let p = pool(Some("8"), Some(&[("1", "2026-12-04T15:00:00Z")]));
        assert_eq!(cooling(&p, now), BTreeMap::from([(1, at("2026-12-04T12:00:18Z"))]), "a fast releaser's clock");
        assert_eq!(ahead(&p, now), [(1, "2026-12-04T15:00:00Z".to_string())], "to be rewritten as now");
        let near = pool(Some("8"), Some(&[("1", "2026-12-04T12:00:11Z")]));
        assert!(ahead(&near, now).is_empty(), "a second ahead is two clocks agreeing as well as they do");
    }

    #[test]
    fn a_release_records_its_time_and_prunes_what_expired() {
        let now = at("2026-12-04T12:00:10Z");
        let released = [("1", "2026-12-04T12:00:00Z"), ("2", "2026-12-04T12:00:05Z"), ("3", "garbage")];
        let p = pool(Some("8"), Some(&released));
        let r = release_record(&p, 4, now).unwrap();
        assert_eq!(r.at, "2026-12-04T12:00:10Z");
        assert_eq!(r.prune, [("1".into(), "2026-12-04T12:00:00Z".into()), ("3".into(), "garbage".into())]);
        assert!(r.map_exists);
        // the offset released again is rewritten, not pruned
        let again = release_record(&p, 1, now).unwrap();
        assert_eq!(again.prune, [("3".to_string(), "garbage".to_string())]);
        let fresh = release_record(&pool(Some("8"), None), 4, now).unwrap();
        assert!(!fresh.map_exists && fresh.prune.is_empty());
        assert_eq!(release_record(&pool(None, Some(&released)), 4, now), None, "no cooldown: nothing recorded");
    }
}
