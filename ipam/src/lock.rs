//! The host lock (Calico's host IPAM lock, host-local's file lock): invocations on one node that write the same
//! pool take turns. The API server re-applies a patch at every internal conflict, so one writer of an object in
//! series is many times faster than many writers at once; across objects, writers stay concurrent.
//!
//! Best effort: the protocol is safe without it (guarded patches, reservations), so a lock that cannot be made or
//! is held past its wait only costs speed, never an invocation.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the lock files live: a tmpfs on every node, gone at reboot with the processes that held them.
pub const DEFAULT_DIR: &str = "/run/hereabouts/locks";

/// How long to poll for a held lock between tries: short against an ADD's ~10 ms of API work per request.
const POLL: Duration = Duration::from_millis(2);

/// File names are at most 255 bytes; longer keys are shortened to a prefix and a hash of the whole.
const MAX_NAME: usize = 200;

/// Held locks, released when dropped (closing the file releases its `flock`, also when the process dies).
#[derive(Debug)]
pub struct HostLock {
    files: Vec<File>,
}

impl HostLock {
    /// How many lock files are held.
    pub fn held(&self) -> usize {
        self.files.len()
    }
}

/// One lock file per key, under `dir`: `<namespace>_<object>@<node>`. The node is in the name so that test beds
/// that run several node names on one host still get one lock per node, as a real cluster has.
pub fn key_path(dir: &Path, namespace: &str, object: &str, node: &str) -> PathBuf {
    let name = format!("{namespace}_{object}@{node}");
    let name: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@') { c } else { '_' })
        .collect();
    let name = if name.len() > MAX_NAME {
        format!("{}~{:016x}", &name[..MAX_NAME - 17], fnv1a(name.as_bytes()))
    } else {
        name
    };
    dir.join(name)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Takes the locks at `paths` (sorted and deduplicated first, so two invocations never wait on each other in a
/// cycle), waiting at most `wait` in all. Returns `None`, after a log line, when any cannot be had: the caller
/// goes on without.
pub async fn acquire(mut paths: Vec<PathBuf>, wait: Duration) -> Option<HostLock> {
    paths.sort();
    paths.dedup();
    let until = Instant::now() + wait;
    let mut files = Vec::with_capacity(paths.len());
    for path in &paths {
        match lock_one(path, until).await {
            Ok(file) => files.push(file),
            Err(why) => {
                tracing::warn!(lock = %path.display(), %why, "host lock not taken; going on without it");
                return None;
            }
        }
    }
    Some(HostLock { files })
}

async fn lock_one(path: &Path, until: Instant) -> Result<File, String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    }
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open: {e}"))?;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) if Instant::now() < until => tokio::time::sleep(POLL).await,
            Err(TryLockError::WouldBlock) => return Err("still held by another invocation".into()),
            Err(TryLockError::Error(e)) => return Err(format!("cannot lock: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_lock_is_waited_for_and_then_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = key_path(dir.path(), "ns", "10.0.0.0-24", "node-1");
        let first = acquire(vec![path.clone()], Duration::from_secs(1)).await.expect("a free lock is taken");
        assert_eq!(first.held(), 1);
        // held: a second invocation gives up after its wait, and goes on without
        assert!(acquire(vec![path.clone()], Duration::from_millis(30)).await.is_none());
        let waiter = tokio::spawn(acquire(vec![path.clone()], Duration::from_secs(5)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the lock is still held");
        drop(first);
        assert!(waiter.await.unwrap().is_some(), "released, so the waiter takes it");
    }

    #[tokio::test]
    async fn other_nodes_and_other_pools_do_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let a = acquire(vec![key_path(dir.path(), "ns", "p", "node-1")], Duration::ZERO).await;
        let b = acquire(vec![key_path(dir.path(), "ns", "p", "node-2")], Duration::ZERO).await;
        let c = acquire(vec![key_path(dir.path(), "ns", "q", "node-1")], Duration::ZERO).await;
        let d = acquire(vec![key_path(dir.path(), "other", "p", "node-1")], Duration::ZERO).await;
        assert!(a.is_some() && b.is_some() && c.is_some() && d.is_some());
    }

    #[tokio::test]
    async fn a_directory_that_cannot_be_made_means_no_lock_and_no_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        assert!(acquire(vec![key_path(&file, "ns", "p", "n")], Duration::from_millis(10)).await.is_none());
    }

    #[test]
    fn long_keys_are_shortened_and_stay_distinct() {
        let dir = Path::new("/x");
        let node = "n".repeat(253);
        let a = key_path(dir, "ns", "pool-a", &node);
        let b = key_path(dir, "ns", "pool-b", &node);
        assert_ne!(a, b);
        assert!(a.file_name().unwrap().len() <= MAX_NAME);
        assert_eq!(key_path(dir, "ns", "a/b", "n"), Path::new("/x/ns_a_b@n"));
    }
}
