//! Namespaced grants for the test identities.

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::{Identity, deploy};

/// The rights the CNI plugin needs in the namespace that holds its pools and reservations: the rules of the
/// manifest's Role `hereabouts-cni`, exactly as written.
pub fn cni_rules() -> Vec<PolicyRule> {
    deploy::role(deploy::CNI_NAME).rules.unwrap_or_default()
}

/// The CNI plugin's cluster-wide right with the chart's `cni.providerEvents`, ClusterRole `hereabouts-cni-events`
/// as rendered: creating the Warning Events of IaaS provider mode on pods.
pub fn cni_event_rules() -> Vec<PolicyRule> {
    let render = deploy::render(&[deploy::CNI_EVENTS_VALUE]);
    deploy::typed_in::<k8s_openapi::api::rbac::v1::ClusterRole>(&render, deploy::CNI_EVENTS_NAME)
        .rules
        .unwrap_or_default()
}

/// The CNI plugin's read rights for ranges chosen per pod or node with the chart's `cni.rangeChoice`, ClusterRole
/// `hereabouts-cni-ranges` as rendered.
pub fn cni_ranges_rules() -> Vec<PolicyRule> {
    let render = deploy::render(&[deploy::CNI_RANGES_VALUE]);
    deploy::typed_in::<k8s_openapi::api::rbac::v1::ClusterRole>(&render, deploy::CNI_RANGES_NAME)
        .rules
        .unwrap_or_default()
}

/// Applies the chart's ClusterRole and ClusterRoleBinding `hereabouts-cni-ranges` as `cni.rangeChoice` renders them
/// (cluster-wide, to the CNI's ServiceAccount, which [`Identity::Cni`] authenticates as), and waits until the
/// authorizer grants them.
pub async fn grant_cni_ranges(admin: &Client) {
    grant_cni_cluster_role(admin, deploy::CNI_RANGES_VALUE, deploy::CNI_RANGES_NAME).await;
}

/// Applies the chart's ClusterRole and ClusterRoleBinding `hereabouts-cni-ipamclaims` as `cni.persistentIPs`
/// renders them, and waits until the authorizer grants them.
pub async fn grant_cni_claims(admin: &Client) {
    grant_cni_cluster_role(admin, deploy::CNI_CLAIMS_VALUE, deploy::CNI_CLAIMS_NAME).await;
}

/// Applies the ClusterRole and ClusterRoleBinding `name` the chart renders with `value`, and waits until the CNI's
/// identity may read a pod (both grant it).
async fn grant_cni_cluster_role(admin: &Client, value: &str, name: &str) {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let render = deploy::render(&[value]);
    let role = deploy::typed_in::<ClusterRole>(&render, name);
    let binding = deploy::typed_in::<ClusterRoleBinding>(&render, name);
    deploy::create_or_replace(&Api::<ClusterRole>::all(admin.clone()), role).await.expect("apply the ClusterRole");
    deploy::create_or_replace(&Api::<ClusterRoleBinding>::all(admin.clone()), binding)
        .await
        .expect("apply the ClusterRoleBinding");
    let pods = Api::<Pod>::namespaced(crate::TestCluster::get().client(Identity::Cni).await, "default");
    crate::wait::until(
        std::time::Duration::from_secs(10),
        &format!("the CNI's ClusterRole {name} to apply"),
        || async { pods.get_metadata_opt("no-such-pod").await.ok() },
    )
    .await
    .unwrap();
}

/// Binds `rules` to the restricted identity in `namespace` as Role and RoleBinding `name`.
pub async fn grant(admin: Client, namespace: &str, name: &str, rules: Vec<PolicyRule>) {
    grant_to(admin, namespace, name, Identity::Restricted, rules).await;
}

/// Binds `rules` to `id` in `namespace` as Role and RoleBinding `name`.
pub async fn grant_to(admin: Client, namespace: &str, name: &str, id: Identity, rules: Vec<PolicyRule>) {
    let meta = ObjectMeta { name: Some(name.into()), ..Default::default() };
    let role = Role { metadata: meta.clone(), rules: Some(rules) };
    Api::<Role>::namespaced(admin.clone(), namespace).create(&PostParams::default(), &role).await.expect("create role");
    let binding = RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject { kind: "User".into(), name: id.user().into(), ..Default::default() }]),
    };
    Api::<RoleBinding>::namespaced(admin, namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create role binding");
}
