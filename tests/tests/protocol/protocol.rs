//! What the allocation protocol (docs/design.md, "The store protocol") relies on, shown on the real API server: guarded JSON patches of one
//! key, conflicts on stale writes, AlreadyExists on a second create, and RBAC refusals.

use std::collections::BTreeMap;

use futures::future::join_all;
use hereabouts_ipam::crd::{IpPool, OverlappingRangeIpReservation};
use hereabouts_tests::objects::{mk_entry, mk_pool, mk_reservation};
use hereabouts_tests::{Identity, TestCluster};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Error};
use serde_json::json;

const POOL: &str = "198.18.0.0-24";

async fn create_pool(client: Client, ns: &str) -> Api<IpPool> {
    let pools = Api::<IpPool>::namespaced(client, ns);
    let pool = mk_pool(POOL, "198.18.0.0/24").build();
    pools.create(&PostParams::default(), &pool).await.expect("create pool");
    pools
}

/// The guarded add of the protocol: the key must be absent (`test` against null succeeds only on a missing path),
/// then it is added.
fn guarded_add(key: &str, id: &str) -> Patch<()> {
    let path = format!("/spec/allocations/{key}");
    Patch::Json(
        serde_json::from_value(json!([
            {"op": "test", "path": path, "value": null},
            {"op": "add", "path": path, "value": {"id": id, "podref": format!("ns/{id}"), "ifname": "net1"}},
        ]))
        .unwrap(),
    )
}

fn api_code(err: &Error) -> u16 {
    match err {
        Error::Api(status) => status.code,
        other => panic!("expected an API error status, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_patches_of_different_keys_all_apply() {
    let cluster = TestCluster::get();
    let ns = cluster.namespace("proto-distinct").await;
    let pools = create_pool(cluster.admin().await, &ns).await;

    let writers = (1..=32).map(|i| {
        let pools = pools.clone();
        async move { pools.patch(POOL, &PatchParams::default(), &guarded_add(&i.to_string(), &format!("c{i}"))).await }
    });
    let results = join_all(writers).await;
    for (i, r) in results.iter().enumerate() {
        assert!(r.is_ok(), "patch of key {} failed: {:?}", i + 1, r.as_ref().err());
    }

    let pool = pools.get(POOL).await.unwrap();
    let want: BTreeMap<String, String> = (1..=32).map(|i| (i.to_string(), format!("c{i}"))).collect();
    let have: BTreeMap<String, String> = pool.spec.allocations.iter().map(|(k, a)| (k.clone(), a.id.clone())).collect();
    assert_eq!(have, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_patches_of_one_key_admit_exactly_one() {
    let cluster = TestCluster::get();
    let ns = cluster.namespace("proto-same").await;
    let pools = create_pool(cluster.admin().await, &ns).await;

    let writers = (0..16).map(|i| {
        let pools = pools.clone();
        async move { pools.patch(POOL, &PatchParams::default(), &guarded_add("7", &format!("c{i}"))).await }
    });
    let results = join_all(writers).await;
    let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one guarded add of one key may succeed: {results:?}");
    for err in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(api_code(err), 422, "a failed test op is 422 Unprocessable Entity: {err}");
    }

    // The losers changed nothing: the object is the winner's write, not a later one.
    let winner = winners[0];
    let pool = pools.get(POOL).await.unwrap();
    assert_eq!(pool.metadata.resource_version, winner.metadata.resource_version);
    assert_eq!(pool.spec.allocations.len(), 1);
    assert_eq!(pool.spec.allocations["7"].id, winner.spec.allocations["7"].id);
}

#[tokio::test]
async fn stale_replace_conflicts_and_second_create_already_exists() {
    let cluster = TestCluster::get();
    let ns = cluster.namespace("proto-conflict").await;
    let pools = create_pool(cluster.admin().await, &ns).await;

    let stale = pools.get(POOL).await.unwrap();
    pools.patch(POOL, &PatchParams::default(), &guarded_add("1", "first")).await.unwrap();

    let mut replaced = stale.clone();
    replaced.spec.allocations.insert("2".into(), mk_entry("late", "ns/late").build());
    let err = pools.replace(POOL, &PostParams::default(), &replaced).await.unwrap_err();
    let Error::Api(status) = &err else { panic!("expected an API error, got {err}") };
    assert!(status.is_conflict() && !status.is_already_exists(), "stale replace: {status:?}");
    assert_eq!(status.code, 409);

    let again = mk_pool(POOL, "198.18.0.0/24").namespace(&ns).build();
    let err = pools.create(&PostParams::default(), &again).await.unwrap_err();
    let Error::Api(status) = &err else { panic!("expected an API error, got {err}") };
    assert!(status.is_already_exists() && !status.is_conflict(), "second create: {status:?}");
    assert_eq!(status.code, 409);

    // Neither failed write touched the object.
    let pool = pools.get(POOL).await.unwrap();
    assert_eq!(pool.spec.allocations.keys().collect::<Vec<_>>(), ["1"]);
}

/// Grants the restricted identity get/list/create on IPPools (not reservations) in `ns`.
async fn grant_pools_only(admin: Client, ns: &str) {
    let role = Role {
        metadata: ObjectMeta { name: Some("pools".into()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![hereabouts_ipam::crd::GROUP.into()]),
            resources: Some(vec!["ippools".into()]),
            verbs: vec!["get".into(), "list".into(), "create".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), ns).create(&PostParams::default(), &role).await.unwrap();
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some("pools".into()), ..Default::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "pools".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: Identity::Restricted.user().into(),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, ns).create(&PostParams::default(), &binding).await.unwrap();
}

fn reservation(name: &str) -> OverlappingRangeIpReservation {
    mk_reservation(name, "ns/p").build()
}

#[tokio::test]
async fn rbac_refuses_what_is_not_granted() {
    let cluster = TestCluster::get();
    let ns = cluster.namespace("proto-rbac").await;
    grant_pools_only(cluster.admin().await, &ns).await;

    // The grant takes effect at once (the RBAC authorizer reads from an informer; allow it a moment).
    let restricted = cluster.client(Identity::Restricted).await;
    let pools = Api::<IpPool>::namespaced(restricted.clone(), &ns);
    hereabouts_tests::wait::until(std::time::Duration::from_secs(10), "the role binding to apply", || async {
        pools.list(&ListParams::default()).await.ok()
    })
    .await
    .unwrap();
    create_pool(restricted.clone(), &ns).await;
    pools.get(POOL).await.expect("get is granted");

    let forbidden = |r: Result<(), Error>, what: &str| {
        let err = r.expect_err(what);
        assert_eq!(api_code(&err), 403, "{what}: {err}");
    };
    forbidden(
        pools.patch(POOL, &PatchParams::default(), &guarded_add("1", "c")).await.map(drop),
        "restricted: patch is not granted",
    );
    forbidden(pools.delete(POOL, &Default::default()).await.map(drop), "restricted: delete is not granted");
    let reservations = Api::<OverlappingRangeIpReservation>::namespaced(restricted.clone(), &ns);
    forbidden(
        reservations.create(&PostParams::default(), &reservation("198.18.0.1")).await.map(drop),
        "restricted: reservations are not granted",
    );
    let other = cluster.namespace("proto-rbac-other").await;
    forbidden(
        Api::<IpPool>::namespaced(restricted, &other).list(&ListParams::default()).await.map(drop),
        "restricted: another namespace is not granted",
    );

    let nobody = cluster.client(Identity::Nobody).await;
    let pools = Api::<IpPool>::namespaced(nobody.clone(), &ns);
    forbidden(pools.get(POOL).await.map(drop), "nobody: get");
    forbidden(pools.list(&ListParams::default()).await.map(drop), "nobody: list");
    forbidden(pools.patch(POOL, &PatchParams::default(), &guarded_add("2", "c")).await.map(drop), "nobody: patch");
    forbidden(
        Api::<OverlappingRangeIpReservation>::namespaced(nobody.clone(), &ns)
            .create(&PostParams::default(), &reservation("198.18.0.2"))
            .await
            .map(drop),
        "nobody: create reservation",
    );
    forbidden(
        Api::<k8s_openapi::api::core::v1::Pod>::all(nobody).list(&ListParams::default()).await.map(drop),
        "nobody: list pods",
    );

    // Nothing the refused writes asked for exists.
    let admin_pool = Api::<IpPool>::namespaced(cluster.admin().await, &ns).get(POOL).await.unwrap();
    assert!(admin_pool.spec.allocations.is_empty());
}
