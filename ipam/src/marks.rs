//! Attachment marks: an empty file per attachment — network, pod, interface — on the node, made before the
//! attachment's first ADD here writes anything, and kept until the node reboots. An ADD that makes the mark is the
//! first of that pod's interface on this node since boot, so no earlier sandbox or try of it can have written
//! anything: it need not look for such an entry across the cluster (in slice mode, a LIST of the pools for an entry
//! outside the node's listed slices), and in the node agent it may plan on the agent's copies. An ADD that finds
//! the mark, or cannot tell, looks and reads. A mark removed by hand before a reboot could let an ADD miss its own
//! entry and take a second address (a leak the reconciler cannot see while the pod lives); never an address twice:
//! every write stays guarded.
//!
//! Keyed by the pod, not the sandbox: entries are matched to an attachment by pod and interface, so a new sandbox
//! of the pod (or a new pod of the same name, after one that vanished without DEL) must find what the earlier one
//! holds. Not removed by DEL: a DEL of an earlier sandbox can come after the next sandbox's ADD, whose retry must
//! still look. The files are empty, on a tmpfs (`/run`), one per pod name and interface the node ran since boot.

use std::path::{Path, PathBuf};

/// Where the marks live on a node.
pub const DEFAULT_DIR: &str = "/run/hereabouts/attachments";

/// The mark's path for the attachment `pod`/`ifname` (`pod` as `namespace/name`) of network `network`.
pub fn path(dir: &Path, network: &str, pod: &str, ifname: &str) -> PathBuf {
    crate::lock::key_path(dir, network, pod, ifname)
}

/// Makes the mark; `true` only when this call made it (the attachment's first ADD on this node since boot). Any
/// failure other than "it exists" counts as "cannot tell": `false`.
pub fn first_add(dir: &Path, network: &str, pod: &str, ifname: &str) -> bool {
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    std::fs::OpenOptions::new().write(true).create_new(true).open(path(dir, network, pod, ifname)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_add_makes_the_mark_and_every_later_add_of_the_pods_interface_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let marks = dir.path().join("attachments");
        assert!(first_add(&marks, "net", "ns/web-0", "net1"), "first");
        assert!(!first_add(&marks, "net", "ns/web-0", "net1"), "a retry, or a new sandbox of the pod");
        assert!(first_add(&marks, "net", "ns/web-0", "net2"), "another interface is another attachment");
        assert!(first_add(&marks, "other", "ns/web-0", "net1"), "another network too");
        assert!(first_add(&marks, "net", "ns/web-1", "net1"), "another pod too");
    }

    #[test]
    fn a_directory_that_cannot_be_made_means_cannot_tell() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        assert!(!first_add(&file.join("attachments"), "net", "c1", "net1"));
    }
}
