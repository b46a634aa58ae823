//! Attachment marks: an empty file per attachment — network, pod, interface — on the node, made before the
//! attachment's first ADD here writes anything. An ADD that makes the mark, and finds none from the node's earlier
//! boots, is the first of that pod's interface on this node, so no earlier sandbox or try of it can have written
//! anything: it need not look for such an entry across the cluster (in slice mode, a LIST of the pools for an entry
//! outside the node's listed slices), in the node agent it may plan on the agent's copies, and with a warm reserve it
//! may take from it. An ADD that finds a mark, or cannot tell, looks and reads. A mark removed by hand could let an
//! ADD miss its own entry and take a second address (a leak the reconciler cannot see while the pod lives); never
//! an address twice: every write stays guarded.
//!
//! Keyed by the pod, not the sandbox: entries are matched to an attachment by pod and interface, so a new sandbox
//! of the pod (or a new pod of the same name, after one that vanished without DEL) must find what the earlier one
//! holds. Not removed by DEL: a DEL of an earlier sandbox can come after the next sandbox's ADD, whose retry must
//! still look.
//!
//! On the host's disk, one directory per boot (`/proc/sys/kernel/random/boot_id`): a pod outlives a reboot, and its
//! sandbox is made again on the same node without a DEL of the old one, so the marks of the boots before count too
//! (an entry it borrowed in another node's slice, or left in its own pool of a slice a rebuilt NodeSlicePool lists
//! free, is found only by the search a first ADD skips). Every pod that lives across a reboot has its sandbox made
//! again, and so its mark, in the boot after; the directories of the [`KEPT_BOOTS`] latest boots are kept, older ones
//! removed by the first ADD of a boot. The files are empty, one per pod name and interface the node ran in those
//! boots. They are not synced: a power loss may lose the latest, and a pod whose mark was lost so takes a second
//! address after the reboot (a leak while it lives, as above).

use std::path::{Path, PathBuf};

/// Where the attachment marks live on a node.
pub const DEFAULT_DIR: &str = "/var/lib/hereabouts/attachments";

/// How many boots' marks are kept, this one included: a pod whose sandbox could not be made again for a whole boot
/// is still found after the next.
pub const KEPT_BOOTS: usize = 4;

/// This boot's id, if the kernel tells it.
pub fn boot_id() -> Option<String> {
    parse_boot_id(&std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?)
}

/// The boot id in `text` (the kernel's file), if it is one: it names a directory, so nothing but hex digits and
/// dashes (no `/`, no `..`).
fn parse_boot_id(text: &str) -> Option<String> {
    let id = text.trim();
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then(|| id.to_string())
}

/// The mark's path for the attachment `pod`/`ifname` (`pod` as `namespace/name`) of network `network`, in the
/// directory of one boot.
pub fn path(boot_dir: &Path, network: &str, pod: &str, ifname: &str) -> PathBuf {
    crate::lock::key_path(boot_dir, network, pod, ifname)
}

/// Makes the mark in boot `boot`'s directory under `dir`; `true` only when this call made it and no earlier boot
/// kept in `dir` has it (the attachment's first ADD on this node). Any failure other than "it exists" counts as
/// "cannot tell": `false`.
pub fn first_add(dir: &Path, boot: &str, network: &str, pod: &str, ifname: &str) -> bool {
    let this_boot = dir.join(boot);
    match std::fs::create_dir(&this_boot) {
        // the boot's first ADD here: the boots past those kept go
        Ok(()) => prune(dir, boot),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::create_dir_all(&this_boot).is_err() {
                return false;
            }
        }
        Err(_) => return false,
    }
    let made =
        std::fs::OpenOptions::new().write(true).create_new(true).open(path(&this_boot, network, pod, ifname)).is_ok();
    made && earlier_boots(dir, boot).is_some_and(|boots| {
        !boots.iter().any(|earlier| {
            // cannot tell: as if the mark were there
            !matches!(std::fs::symlink_metadata(path(earlier, network, pod, ifname)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound)
        })
    })
}

/// The directories of the boots other than `boot` under `dir`; `None` when they cannot be listed.
fn earlier_boots(dir: &Path, boot: &str) -> Option<Vec<PathBuf>> {
    let mut boots = Vec::new();
    for entry in std::fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        if entry.file_name() != boot {
            boots.push(entry.path());
        }
    }
    Some(boots)
}

/// Removes the boot directories under `dir` past the [`KEPT_BOOTS`] latest (by when each was last written), never
/// `boot`'s. Best effort: one left stays until a later boot's first ADD.
fn prune(dir: &Path, boot: &str) {
    let Some(boots) = earlier_boots(dir, boot) else { return };
    let mut dated: Vec<(std::time::SystemTime, PathBuf)> =
        boots.into_iter().filter_map(|b| Some((std::fs::metadata(&b).and_then(|m| m.modified()).ok()?, b))).collect();
    dated.sort_by_key(|b| std::cmp::Reverse(b.0));
    for (_, old) in dated.into_iter().skip(KEPT_BOOTS - 1) {
        if let Err(e) = std::fs::remove_dir_all(&old) {
            tracing::debug!(dir = %old.display(), error = %e, "an old boot's attachment marks not removed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_add_makes_the_mark_and_every_later_add_of_the_pods_interface_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let marks = dir.path().join("attachments");
        assert!(first_add(&marks, "b1", "net", "ns/web-0", "net1"), "first");
        assert!(!first_add(&marks, "b1", "net", "ns/web-0", "net1"), "a retry, or a new sandbox of the pod");
        assert!(first_add(&marks, "b1", "net", "ns/web-0", "net2"), "another interface is another attachment");
        assert!(first_add(&marks, "b1", "other", "ns/web-0", "net1"), "another network too");
        assert!(first_add(&marks, "b1", "net", "ns/web-1", "net1"), "another pod too");
    }

    /// A pod that ran in an earlier boot is not a first ADD after the reboot (its sandbox made again), and makes its
    /// mark in the new boot, so that it is still found after the next; the oldest boots' marks go.
    #[test]
    fn a_mark_of_an_earlier_boot_counts_and_only_the_latest_boots_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let marks = dir.path().join("attachments");
        assert!(first_add(&marks, "b1", "net", "ns/web-0", "net1"));
        assert!(!first_add(&marks, "b2", "net", "ns/web-0", "net1"), "it ran before the reboot");
        assert!(first_add(&marks, "b2", "net", "ns/web-1", "net1"), "a pod new in this boot");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let boots = ["b3", "b4", "b5", "b6"];
        for (i, boot) in boots.iter().enumerate() {
            assert!(first_add(&marks, boot, "net", &format!("ns/new-{i}"), "net1"));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut left: Vec<String> =
            std::fs::read_dir(&marks).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, boots, "the {KEPT_BOOTS} latest boots");
        assert!(first_add(&marks, "b7", "net", "ns/web-0", "net1"), "a pod gone for four boots is new again");
    }

    #[test]
    fn a_directory_that_cannot_be_made_means_cannot_tell() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        assert!(!first_add(&file.join("attachments"), "b1", "net", "c1", "net1"));
        assert!(!first_add(&file, "b1", "net", "c1", "net1"));
    }

    #[test]
    fn a_boot_id_names_a_directory_and_nothing_else() {
        assert_eq!(parse_boot_id("0b1f-9c2e\n").as_deref(), Some("0b1f-9c2e"));
        for bad in ["", "\n", "../etc", "ab/cd", "b00t id"] {
            assert_eq!(parse_boot_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn this_machine_tells_its_boot() {
        let id = boot_id().expect("/proc/sys/kernel/random/boot_id on Linux");
        assert_eq!(id.len(), 36, "{id}");
    }
}
