//! The CRD manifests under `crds/`, rendered from the Rust types in `hereabouts_ipam::crd`.

use std::path::{Path, PathBuf};

/// The directory the manifests are committed in.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").join("crds")
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
