//! Pools a changed range left behind ([`crate::store::OVERLAPS_ANNOTATION`]). Once the pool that replaced them is
//! older than any ADD runs (an ADD begun under the old config has ended), each that is empty goes, deleted only if
//! it is still as read, and the new pool stops naming what is gone, so that its ADDs stop reading it.

use std::time::Duration;

use crate::crd::IpPool;
use crate::store::{Deleted, Patched, PoolStore, StoreError, Version, guard, overlaps_of};

/// Whether `pool` was created more than `settle` (longer than any ADD runs) before `now`, so no ADD begun under the
/// config it replaced is left, and what it replaces is decided ([`crate::claim::replaces`]).
pub fn settled(pool: &IpPool, now: k8s_openapi::jiff::Timestamp, settle: Duration) -> bool {
    let created = pool.metadata.creation_timestamp.as_ref().map(|t| t.0);
    created.is_some_and(|c| now > c && now.duration_since(c).unsigned_abs() > settle)
        && !crate::store::replaces_pending(pool)
}

/// Retires, among `pools` (as listed), the empty pools that a pool created more than `settle` before `now`
/// replaced ([`settled`]). Returns how many it deleted.
pub async fn retire_replaced(
    store: &impl PoolStore,
    pools: &[IpPool],
    now: k8s_openapi::jiff::Timestamp,
    settle: Duration,
) -> Result<usize, StoreError> {
    let mut deleted = 0;
    for pool in pools {
        let named = overlaps_of(pool);
        if named.is_empty() || !settled(pool, now, settle) {
            continue;
        }
        let mut kept = Vec::new();
        for name in &named {
            let Some(old) = pools.iter().find(|p| p.metadata.name.as_deref() == Some(name.as_str())) else {
                continue;
            };
            // a release record still cooling keeps the pool (the new pool's ADDs keep off it); one whose cooldown
            // is over does not: no ADD of the old config prunes it any more
            let cooling = !crate::cooldown::cooling(old, now).is_empty();
            if !old.spec.allocations.is_empty() || cooling {
                kept.push(name.clone());
                continue;
            }
            match store.delete_pool(name, &Version::of_meta(&old.metadata)).await? {
                Deleted::Deleted => {
                    deleted += 1;
                    tracing::info!(pool = %name, replaced_by = ?pool.metadata.name, "replaced pool retired, empty");
                }
                Deleted::Missing => {}
                // an entry came since the list: an ADD begun under the old config, or its pods' own
                Deleted::Changed => kept.push(name.clone()),
            }
        }
        if kept.len() < named.len() {
            let name = pool.metadata.name.as_deref().unwrap_or_default();
            if let (Patched::Refused(_), _) = store
                .apply_pool_patch(name, "name the pools it replaces", &guard::narrow_overlaps(&named, &kept))
                .await?
            {
                tracing::debug!(pool = %name, "its replaced pools changed since the list: next pass");
            }
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    use super::*;
    use crate::crd::IpAllocation;
    use crate::store::{MemoryStore, NewPool, OVERLAPS_ANNOTATION};

    fn entry(podref: &str) -> IpAllocation {
        IpAllocation { id: format!("c-{podref}"), podref: podref.into(), ..IpAllocation::default() }
    }

    /// The grown range's pool `net-198.18.61.0-29`, made `age` ago, replacing three /30s: `a` empty, `b` with a
    /// pod's entry, `c` gone.
    fn fleet(age: SignedDuration) -> (MemoryStore, Timestamp) {
        let store = MemoryStore::new("ns");
        let names = ["198.18.61.0-30", "198.18.61.4-30", "198.18.61.8-30"].map(String::from);
        let mut grown = NewPool { overlaps: &names, ..NewPool::new("198.18.61.0-28", "198.18.61.0/28", 14) }.object();
        let now = Timestamp::now();
        grown.metadata.creation_timestamp = Some(Time(now - age));
        store.put_pool(grown);
        store.put_pool(NewPool::new(&names[0], "198.18.61.0/30", 2).object());
        let mut b = NewPool::new(&names[1], "198.18.61.4/30", 2).object();
        b.spec.allocations.insert("1".into(), entry("ns/old"));
        store.put_pool(b);
        (store, now)
    }

    fn named(store: &MemoryStore) -> Option<String> {
        let grown = store.pools().into_iter().find(|p| p.metadata.name.as_deref() == Some("198.18.61.0-28")).unwrap();
        grown.metadata.annotations.unwrap_or_default().get(OVERLAPS_ANNOTATION).cloned()
    }

    #[tokio::test]
    async fn an_empty_replaced_pool_goes_once_no_add_under_the_old_config_can_run() {
        let (store, now) = fleet(SignedDuration::from_mins(1));
        assert_eq!(
            retire_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await.unwrap(),
            0,
            "a minute old: ADDs may still run"
        );
        assert_eq!(store.pools().len(), 3);

        let (store, now) = fleet(SignedDuration::from_mins(10));
        assert_eq!(retire_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await.unwrap(), 1);
        let left: Vec<String> = store.pools().into_iter().filter_map(|p| p.metadata.name).collect();
        assert_eq!(left, ["198.18.61.0-28", "198.18.61.4-30"], "the empty one went, the held one stays");
        assert_eq!(named(&store).as_deref(), Some("198.18.61.4-30"), "it names only what is left");

        // its pod gone, the last one goes too, and the annotation with it
        let mut b = store.pools().into_iter().find(|p| p.spec.range == "198.18.61.4/30").unwrap();
        b.spec.allocations.clear();
        store.put_pool(b);
        assert_eq!(retire_replaced(&store, &store.pools(), now, crate::SETTLE_TIME).await.unwrap(), 1);
        assert_eq!(store.pools().len(), 1);
        assert_eq!(named(&store), None);
    }

    #[tokio::test]
    async fn a_replaced_pool_that_took_an_entry_since_the_list_stays() {
        let (store, now) = fleet(SignedDuration::from_mins(10));
        let listed = store.pools();
        // an ADD begun under the old config, or the guard is gone: the entry lands after the list
        let mut a = listed.iter().find(|p| p.spec.range == "198.18.61.0/30").unwrap().clone();
        a.spec.allocations.insert("1".into(), entry("ns/late"));
        store.put_pool(a);
        assert_eq!(retire_replaced(&store, &listed, now, crate::SETTLE_TIME).await.unwrap(), 0);
        assert!(store.pools().iter().any(|p| p.spec.range == "198.18.61.0/30"), "its entry kept it");
        assert_eq!(named(&store).as_deref(), Some("198.18.61.0-30,198.18.61.4-30"), "only the gone one forgotten");
    }

    #[tokio::test]
    async fn a_list_of_replaced_pools_changed_since_the_read_is_left_as_it_is() {
        let (store, now) = fleet(SignedDuration::from_mins(10));
        let listed = store.pools();
        let mut grown = listed.iter().find(|p| p.spec.range == "198.18.61.0/28").unwrap().clone();
        let annotations = grown.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(OVERLAPS_ANNOTATION.into(), "198.18.61.0-30".into());
        store.put_pool(grown);
        retire_replaced(&store, &listed, now, crate::SETTLE_TIME).await.unwrap();
        assert_eq!(named(&store).as_deref(), Some("198.18.61.0-30"), "another writer's change stands, not overwritten");
    }
}
