//! Whether the CRDs installed keep what hereabouts writes. The API server prunes every field its schema does not
//! declare, silently: under Whereabouts' (or its fork's) CRDs a reuse cooldown's release records, a sticky entry's
//! StatefulSet, the provider's sub-interface records and the fields that tell a recreated pod's entry from its
//! predecessor's are dropped on write. A status subresource (the fork's) drops the NodeSlicePool's slices written
//! with the object. [`drift`] compares an installed CRD with hereabouts' own ([`super::definitions`]).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};

/// How an installed CRD differs from hereabouts' in ways that lose what hereabouts writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drift {
    /// The CRD's name, e.g. `ippools.whereabouts.cni.cncf.io`.
    pub crd: String,
    /// Fields hereabouts writes that the installed schema prunes, as paths (`spec.released`,
    /// `spec.allocations.*.statefulset`); a whole version missing is `<version>`.
    pub pruned: Vec<String>,
    /// The installed CRD has a status subresource where hereabouts writes status with the object.
    pub status_subresource: bool,
}

impl Drift {
    /// Whether nothing is lost.
    pub fn is_clean(&self) -> bool {
        self.pruned.is_empty() && !self.status_subresource
    }

    /// What the fields are needed for, for messages.
    pub fn consequences(&self) -> Vec<String> {
        let mut said = Vec::new();
        let mut say = |s: &str| {
            if !said.iter().any(|x| x == s) {
                said.push(s.to_string());
            }
        };
        for path in &self.pruned {
            match path.as_str() {
                "spec.released" => say("reuse_cooldown_seconds cannot keep its release records"),
                p if p.ends_with(".statefulset") => say("sticky_statefulset cannot record an entry's StatefulSet"),
                p if p.ends_with(".ipamclaim") => say("allowPersistentIPs cannot record an address's IPAMClaim"),
                p if p.starts_with("spec.subInterfaces") => say("iaas_provider cannot record sub-interfaces"),
                p if p.ends_with(".poduid") || p.ends_with(".recordedFor") || p.ends_with(".node") => {
                    say("a recreated pod's entry cannot be told from its predecessor's")
                }
                _ => say("fields hereabouts writes are dropped"),
            }
        }
        if self.status_subresource {
            say("a status subresource drops the slices written with the object (the Whereabouts fork's schema)");
        }
        said
    }
}

/// The IPPool CRD's name.
pub const IPPOOLS_CRD: &str = "ippools.whereabouts.cni.cncf.io";

/// The name of the field `spec.released` in [`Drift::pruned`]: the reuse cooldown's release records.
pub const RELEASED: &str = "spec.released";
/// A sticky entry's StatefulSet.
pub const STATEFULSET: &str = "spec.allocations.*.statefulset";
/// A persistent entry's IPAMClaim.
pub const IPAMCLAIM: &str = "spec.allocations.*.ipamclaim";

/// How `installed` differs from `ours` (the same CRD): every field of `ours`, in each version `ours` serves, that
/// `installed` would prune.
pub fn drift(ours: &CustomResourceDefinition, installed: &CustomResourceDefinition) -> Drift {
    let mut found = Drift { crd: ours.metadata.name.clone().unwrap_or_default(), ..Drift::default() };
    for version in &ours.spec.versions {
        let Some(theirs) = installed.spec.versions.iter().find(|v| v.name == version.name) else {
            found.pruned.push(version.name.clone());
            continue;
        };
        found.status_subresource |=
            theirs.subresources.as_ref().is_some_and(|s| s.status.is_some()) && version.subresources.is_none();
        let schema = |v: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion| {
            v.schema.as_ref().and_then(|s| s.open_api_v3_schema.clone())
        };
        if let Some(ours) = schema(version) {
            walk("", &ours, schema(theirs).as_ref(), &mut found.pruned);
        }
    }
    found.pruned.sort();
    found.pruned.dedup();
    found
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn walk(path: &str, ours: &JSONSchemaProps, theirs: Option<&JSONSchemaProps>, pruned: &mut Vec<String>) {
    let Some(theirs) = theirs else {
        pruned.push(path.to_string());
        return;
    };
    if theirs.x_kubernetes_preserve_unknown_fields == Some(true) {
        return;
    }
    for (key, sub) in ours.properties.iter().flatten() {
        // metadata is the API server's, not the schema's
        if path.is_empty() && (key == "metadata" || key == "apiVersion" || key == "kind") {
            continue;
        }
        walk(&join(path, key), sub, theirs.properties.as_ref().and_then(|p| p.get(key)), pruned);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(sub)) = &ours.additional_properties {
        let their_sub = match &theirs.additional_properties {
            Some(JSONSchemaPropsOrBool::Schema(t)) => Some(t.as_ref()),
            _ => None,
        };
        walk(&join(path, "*"), sub, their_sub, pruned);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(sub)) = &ours.items {
        let their_sub = match &theirs.items {
            Some(JSONSchemaPropsOrArray::Schema(t)) => Some(t.as_ref()),
            _ => None,
        };
        walk(&join(path, "[]"), sub, their_sub, pruned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(name: &str) -> CustomResourceDefinition {
        super::super::definitions()
            .into_iter()
            .map(|(_, c)| c)
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .unwrap()
    }

    #[test]
    fn our_own_crds_lose_nothing() {
        for (_, crd) in super::super::definitions() {
            assert!(drift(&crd, &crd).is_clean(), "{:?}", drift(&crd, &crd));
        }
    }

    #[test]
    fn a_schema_without_our_fields_prunes_them_and_says_what_for() {
        let ours = ours("ippools.whereabouts.cni.cncf.io");
        let mut theirs = ours.clone();
        let schema = theirs.spec.versions[0].schema.as_mut().unwrap().open_api_v3_schema.as_mut().unwrap();
        let spec = schema.properties.as_mut().unwrap().get_mut("spec").unwrap();
        spec.properties.as_mut().unwrap().remove("released");
        let drift = drift(&ours, &theirs);
        assert_eq!(drift.pruned, [RELEASED]);
        assert_eq!(drift.consequences(), ["reuse_cooldown_seconds cannot keep its release records"]);
        let mut open = theirs.clone();
        let schema = open.spec.versions[0].schema.as_mut().unwrap().open_api_v3_schema.as_mut().unwrap();
        schema.properties.as_mut().unwrap().get_mut("spec").unwrap().x_kubernetes_preserve_unknown_fields = Some(true);
        assert!(super::drift(&ours, &open).is_clean(), "preserve-unknown-fields keeps everything below it");
    }

    #[test]
    fn whereabouts_v0_9_2_crds_are_read_for_what_they_drop() {
        // Whereabouts' own CRD files, as its repository ships them (testenv keeps a copy); parsed here from the
        // text kept in the test
        let whereabouts: CustomResourceDefinition = serde_yaml_ng::from_str(WHEREABOUTS_IPPOOL).unwrap();
        let drift = drift(&ours("ippools.whereabouts.cni.cncf.io"), &whereabouts);
        for field in [RELEASED, STATEFULSET, "spec.allocations.*.poduid", "spec.allocations.*.recordedFor"] {
            assert!(drift.pruned.iter().any(|p| p == field), "{field} in {:?}", drift.pruned);
        }
        let mut forked = whereabouts.clone();
        forked.spec.versions[0].subresources = Some(Default::default());
        forked.spec.versions[0].subresources.as_mut().unwrap().status = Some(Default::default());
        assert!(super::drift(&ours("ippools.whereabouts.cni.cncf.io"), &forked).status_subresource);
    }

    /// Whereabouts v0.9.2's `doc/crds/whereabouts.cni.cncf.io_ippools.yaml`, its schema only.
    const WHEREABOUTS_IPPOOL: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: ippools.whereabouts.cni.cncf.io
spec:
  group: whereabouts.cni.cncf.io
  names: {kind: IPPool, listKind: IPPoolList, plural: ippools, singular: ippool}
  scope: Namespaced
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          spec:
            type: object
            required: [allocations, range]
            properties:
              allocations:
                type: object
                additionalProperties:
                  type: object
                  required: [id, podref]
                  properties:
                    id: {type: string}
                    ifname: {type: string}
                    podref: {type: string}
              range: {type: string}
"#;
}
