//! RBAC grants for the restricted identity.

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::Identity;

/// The rights the CNI plugin needs in the namespace that holds its pools and reservations.
pub fn cni_rules() -> Vec<PolicyRule> {
    let rule = |resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![hereabouts_ipam::crd::GROUP.into()]),
        resources: Some(vec![resource.into()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    };
    vec![
        rule("ippools", &["get", "list", "create", "patch"]),
        rule("overlappingrangeipreservations", &["get", "create", "patch", "delete"]),
    ]
}

/// Binds `rules` to the restricted identity in `namespace` as Role and RoleBinding `name`.
pub async fn grant(admin: Client, namespace: &str, name: &str, rules: Vec<PolicyRule>) {
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
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: Identity::Restricted.user().into(),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create role binding");
}
