//! Where the Go tools built by `hack/testenv.sh` live.

use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests crate lives in the workspace").to_path_buf()
}

/// The directory `hack/testenv.sh` links the current tool versions into.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("HEREABOUTS_TESTENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".testenv"))
        .join("bin")
}

/// The path of a tool built by `hack/testenv.sh`; panics with the command that builds it when it is missing.
pub fn tool(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{name} is missing at {}: run `make testenv` (or `hack/testenv.sh`) from {} to build it",
        path.display(),
        repo_root().display()
    );
    path
}
