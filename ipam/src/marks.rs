//! Attachment marks: an empty file per attachment (network, container, interface) on the node, made before its
//! first ADD writes anything and removed by its DEL. An ADD that makes the mark is the attachment's first on this
//! node since boot, so nothing of an earlier try can exist and it need not look for one across the cluster (in
//! slice mode, a LIST of the node's reservations for a borrowed entry). An ADD that finds the mark, or cannot tell,
//! looks: the mark only ever saves work, never decides what is safe.
//!
//! The directory is on a tmpfs (`/run`): a reboot takes the marks with the sandboxes they were for.

use std::path::{Path, PathBuf};

/// Where the marks live on a node.
pub const DEFAULT_DIR: &str = "/run/hereabouts/attachments";

/// The mark's path for the attachment `container`/`ifname` of network `network`.
pub fn path(dir: &Path, network: &str, container: &str, ifname: &str) -> PathBuf {
    crate::lock::key_path(dir, network, container, ifname)
}

/// Makes the mark; `true` only when this call made it (the attachment's first ADD on this node). Any failure
/// other than "it exists" counts as "cannot tell": `false`.
pub fn first_add(dir: &Path, network: &str, container: &str, ifname: &str) -> bool {
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    std::fs::OpenOptions::new().write(true).create_new(true).open(path(dir, network, container, ifname)).is_ok()
}

/// Removes the mark (DEL), if there is one.
pub fn remove(dir: &Path, network: &str, container: &str, ifname: &str) {
    let _ = std::fs::remove_file(path(dir, network, container, ifname));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_add_makes_the_mark_a_retry_finds_it_a_del_takes_it() {
        let dir = tempfile::tempdir().unwrap();
        let marks = dir.path().join("attachments");
        assert!(first_add(&marks, "net", "c1", "net1"), "first");
        assert!(!first_add(&marks, "net", "c1", "net1"), "a retried ADD of the same attachment");
        assert!(first_add(&marks, "net", "c1", "net2"), "another interface is another attachment");
        assert!(first_add(&marks, "other", "c1", "net1"), "another network too");
        remove(&marks, "net", "c1", "net1");
        assert!(first_add(&marks, "net", "c1", "net1"), "after DEL, a new first ADD");
    }

    #[test]
    fn a_directory_that_cannot_be_made_means_cannot_tell() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        assert!(!first_add(&file.join("attachments"), "net", "c1", "net1"));
    }
}
