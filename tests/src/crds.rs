//! The CRD manifests under `crds/`, rendered from the Rust types in `hereabouts_ipam::crd`.

use std::path::PathBuf;

use crate::testenv::repo_root;

/// The directory the manifests are committed in.
pub fn dir() -> PathBuf {
    repo_root().join("crds")
}

/// Every manifest as `(file name, YAML text)`.
pub fn render() -> Vec<(&'static str, String)> {
    hereabouts_ipam::crd::definitions()
        .into_iter()
        .map(|(file, crd)| {
            let yaml = serde_yaml_ng::to_string(&crd).expect("a CRD serialises to YAML");
            (file, format!("# Generated from hereabouts_ipam::crd by `make crds`; do not edit.\n---\n{yaml}"))
        })
        .collect()
}
