//! Reading back what the plugins stored, as admin: who holds what.

use std::collections::BTreeSet;

use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use kube::{Api, Client};

/// The podrefs holding an entry in pool `pool` of `ns`; panics when the pool cannot be read.
pub async fn pool_holders(admin: &Client, ns: &str, pool: &str) -> BTreeSet<String> {
    let pool: IpPool =
        Api::namespaced(admin.clone(), ns).get(pool).await.unwrap_or_else(|e| panic!("pool {pool} in {ns}: {e}"));
    pool.spec.allocations.values().map(|a| a.podref.clone()).collect()
}

/// The podrefs holding a reservation in `ns`.
pub async fn reservation_holders(admin: &Client, ns: &str) -> BTreeSet<String> {
    Api::<OverlappingRangeIpReservation>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("reservations in {ns}: {e}"))
        .items
        .into_iter()
        .map(|r| r.spec.podref)
        .collect()
}
