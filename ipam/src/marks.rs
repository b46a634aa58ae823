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
//!
//! A reboot empties the tmpfs, but a pod outlives it: its sandbox is made again on the same node. What it held in
//! the node's own slices is read there anyway; an entry it borrowed in another node's slice is found only by a
//! search of every pool, which a first ADD skips. So an attachment about to borrow first leaves a borrow mark
//! ([`BorrowMark`]) on the host's disk, synced before the entry is written, and an ADD that finds one is never a
//! first ADD. Borrowing happens only when no slice is free, so these are few; they are kept, like the marks, since
//! a DEL of an earlier sandbox can come after a later one borrowed again.

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

/// Where the borrow marks live on a node: the host's disk, so that they outlive a reboot.
pub const BORROW_DIR: &str = "/var/lib/hereabouts/borrowed";

/// The borrow mark of one attachment: made before it writes an entry in another node's slice.
#[derive(Debug, Clone)]
pub struct BorrowMark {
    dir: PathBuf,
    path: PathBuf,
    attachment: String,
}

impl BorrowMark {
    /// The mark of the attachment `pod`/`ifname` (`pod` as `namespace/name`) of network `network`, in `dir`.
    pub fn new(dir: &Path, network: &str, pod: &str, ifname: &str) -> Self {
        BorrowMark {
            dir: dir.to_path_buf(),
            path: path(dir, network, pod, ifname),
            attachment: format!("network {network}, pod {pod}, interface {ifname}"),
        }
    }

    /// Whether the attachment may have borrowed on this node, in this boot or an earlier one: the mark is there,
    /// or it cannot be told that it is not.
    pub fn may_have_borrowed(&self) -> bool {
        !matches!(std::fs::symlink_metadata(&self.path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
    }

    /// Makes the mark and syncs it, with its directory, to disk.
    pub fn make(&self) -> Result<(), crate::error::IpamError> {
        let made = (|| {
            std::fs::create_dir_all(&self.dir)?;
            let file = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(&self.path)?;
            file.sync_all()?;
            std::fs::File::open(&self.dir)?.sync_all()
        })();
        made.map_err(|e| crate::error::IpamError::BorrowUnmarked {
            attachment: self.attachment.clone(),
            path: self.path.display().to_string(),
            reason: e.to_string(),
        })
    }
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
    fn a_borrow_mark_is_there_once_made_and_a_mark_that_cannot_be_read_counts_as_there() {
        let dir = tempfile::tempdir().unwrap();
        let mark = BorrowMark::new(&dir.path().join("borrowed"), "net", "ns/web-0", "net1");
        assert!(!mark.may_have_borrowed());
        mark.make().unwrap();
        mark.make().expect("made again, as a later sandbox borrows again");
        assert!(mark.may_have_borrowed());
        assert!(!BorrowMark::new(&dir.path().join("borrowed"), "net", "ns/web-1", "net1").may_have_borrowed());
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let under_a_file = BorrowMark::new(&file, "net", "ns/web-0", "net1");
        assert!(under_a_file.may_have_borrowed(), "cannot tell: counted as borrowed, so the ADD looks");
        let err = under_a_file.make().unwrap_err();
        assert_eq!(err.code(), crate::codes::Code::Io, "{err}");
        assert!(err.to_string().contains("pod ns/web-0"), "{err}");
    }

    #[test]
    fn a_directory_that_cannot_be_made_means_cannot_tell() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        assert!(!first_add(&file.join("attachments"), "net", "c1", "net1"));
    }
}
