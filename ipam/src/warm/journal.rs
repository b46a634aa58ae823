//! The node's journal of warm takes: one JSON line per record, each synced to disk before the agent acts on it.
//!
//! A take is written before its ADD answers; its hand-over's end (`done`), or its return to the reserve by a DEL
//! that came before any write (`back`), after. So after a crash the takes without an end are exactly the slots
//! that pods may hold while the API server still says they are the node's: they are handed over again, never
//! handed out again. Opening the journal keeps only those (compaction through a synced rename).
//!
//! A line cut short by a crash was never synced whole, so no ADD answered with it: it is dropped. Any other line
//! that cannot be read makes [`NodeJournal::open`] fail: a take it may have held could be handed out twice.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead as _, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Take;

/// The journal's file name in its directory.
pub const FILE: &str = "takes.jsonl";

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Record {
    /// A slot taken by an ADD, before it answered.
    Take(Box<Take>),
    /// The take's slot is the pod's in the API server (or can no longer be: reported).
    Done {
        /// [`Take::id`].
        id: String,
    },
    /// A DEL came before any hand-over write was sent: the slot is the node's again, untouched.
    Back {
        /// [`Take::id`].
        id: String,
    },
}

/// Why the journal cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Reading, writing or syncing the file failed.
    #[error("warm journal {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// A line other than the last does not parse.
    #[error("warm journal {path}: line {line} cannot be read ({message}); move the file aside to start afresh")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Its number, from 1.
        line: usize,
        /// What the parser said.
        message: String,
    },
}

/// The journal of one node agent, open for appending.
#[derive(Debug)]
pub struct NodeJournal {
    path: PathBuf,
    file: File,
    pending: BTreeMap<String, Take>,
}

impl NodeJournal {
    /// Opens (or makes) the journal in `dir`, keeping only the takes still pending.
    pub fn open(dir: &Path) -> Result<Self, JournalError> {
        let path = dir.join(FILE);
        let io = |source| JournalError::Io { path: path.clone(), source };
        std::fs::create_dir_all(dir).map_err(io)?;
        let pending = match File::open(&path) {
            Ok(file) => read(&path, file)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(io(e)),
        };
        // compaction: the pending takes alone, through a synced rename, so a crash leaves the old or the new file
        let fresh = dir.join(format!("{FILE}.new"));
        {
            let mut out = File::create(&fresh).map_err(io)?;
            for take in pending.values() {
                out.write_all(&line(&Record::Take(Box::new(take.clone())))).map_err(io)?;
            }
            out.sync_all().map_err(io)?;
        }
        std::fs::rename(&fresh, &path).map_err(io)?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        let file = OpenOptions::new().append(true).open(&path).map_err(io)?;
        Ok(Self { path, file, pending })
    }

    /// The takes whose hand-over has not ended.
    pub fn pending(&self) -> impl Iterator<Item = &Take> {
        self.pending.values()
    }

    /// The pending take of `id` ([`Take::id`]).
    pub fn get(&self, id: &str) -> Option<&Take> {
        self.pending.get(id)
    }

    /// Records `take` on disk; only then may its ADD answer.
    pub fn take(&mut self, take: Take) -> Result<(), JournalError> {
        self.append(&Record::Take(Box::new(take.clone())))?;
        self.pending.insert(take.id(), take);
        Ok(())
    }

    /// Records the end of take `id`'s hand-over.
    pub fn done(&mut self, id: &str) -> Result<Option<Take>, JournalError> {
        self.append(&Record::Done { id: id.into() })?;
        Ok(self.pending.remove(id))
    }

    /// Records that take `id`'s slot is the node's again; only then may it be handed out again.
    pub fn back(&mut self, id: &str) -> Result<Option<Take>, JournalError> {
        self.append(&Record::Back { id: id.into() })?;
        Ok(self.pending.remove(id))
    }

    fn append(&mut self, record: &Record) -> Result<(), JournalError> {
        let io = |source| JournalError::Io { path: self.path.clone(), source };
        self.file.write_all(&line(record)).map_err(io)?;
        self.file.sync_data().map_err(io)
    }
}

/// The pending takes of the journal in `dir`, read without writing: the binary's view while the agent owns the
/// file (a line it is writing right now is cut short, and left out as a crash's would be).
pub fn read_pending(dir: &Path) -> Result<BTreeMap<String, Take>, JournalError> {
    let path = dir.join(FILE);
    match File::open(&path) {
        Ok(file) => read(&path, file),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(source) => Err(JournalError::Io { path, source }),
    }
}

fn line(record: &Record) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(record).expect("a record serialises");
    bytes.push(b'\n');
    bytes
}

fn read(path: &Path, file: File) -> Result<BTreeMap<String, Take>, JournalError> {
    let lines: Vec<String> = io::BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|source| JournalError::Io { path: path.to_path_buf(), source })?;
    let mut pending = BTreeMap::new();
    for (i, text) in lines.iter().enumerate() {
        if text.trim().is_empty() {
            continue;
        }
        let record: Record = match serde_json::from_str(text) {
            Ok(r) => r,
            // the last line, cut short by a crash before it was synced: no ADD answered with it
            Err(_) if i + 1 == lines.len() => break,
            Err(e) => {
                return Err(JournalError::Corrupt { path: path.to_path_buf(), line: i + 1, message: e.to_string() });
            }
        };
        match record {
            Record::Take(take) => {
                pending.insert(take.id(), *take);
            }
            Record::Done { id } | Record::Back { id } => {
                pending.remove(&id);
            }
        }
    }
    Ok(pending)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::warm::{Held, Slot};

    fn take(container: &str) -> Take {
        Take {
            reserve: "r".into(),
            network: "net".into(),
            kubeconfig: "/etc/kubeconfig".into(),
            node: "node-a".into(),
            slot: Slot {
                container: format!("warm-{container}"),
                held: vec![Held {
                    pool: "node-a-198.18.0.0-28".into(),
                    offset: 3,
                    ip: "198.18.0.3".parse().unwrap(),
                    prefix_len: 24,
                    gateway: None,
                    reservation: Some("198.18.0.3".into()),
                }],
            },
            podref: "ns/p".into(),
            poduid: Some("uid".into()),
            container: container.into(),
            ifname: "net1".into(),
            at: "2026-12-05T00:00:00Z".into(),
        }
    }

    #[test]
    fn a_reopened_journal_holds_the_takes_without_an_end_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = NodeJournal::open(dir.path()).unwrap();
        for c in ["c1", "c2", "c3"] {
            journal.take(take(c)).unwrap();
        }
        journal.done(&take("c1").id()).unwrap();
        journal.back(&take("c3").id()).unwrap();
        drop(journal);
        let reopened = NodeJournal::open(dir.path()).unwrap();
        let pending: Vec<_> = reopened.pending().map(|t| t.container.clone()).collect();
        assert_eq!(pending, ["c2"]);
        assert_eq!(reopened.get(&take("c2").id()), Some(&take("c2")));
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert_eq!(text.lines().count(), 1, "compacted to the pending take: {text}");
    }

    #[test]
    fn a_line_cut_short_at_the_end_is_dropped_and_one_in_the_middle_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = NodeJournal::open(dir.path()).unwrap();
        journal.take(take("c1")).unwrap();
        drop(journal);
        let path = dir.path().join(FILE);
        let whole = std::fs::read_to_string(&path).unwrap();
        let torn = format!("{whole}{}", &whole[..whole.len() / 2]);
        std::fs::write(&path, &torn).unwrap();
        let reopened = NodeJournal::open(dir.path()).unwrap();
        assert_eq!(reopened.pending().count(), 1, "the whole take stays, the torn one is gone");
        drop(reopened);

        std::fs::write(&path, format!("{}\n{whole}", &whole[..whole.len() / 2])).unwrap();
        let err = NodeJournal::open(dir.path()).unwrap_err();
        assert!(matches!(err, JournalError::Corrupt { line: 1, .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2, "a refused journal is left as it was");
    }

    /// A journal that cannot be opened for a reason other than its absence (here a symbolic link to itself) is an
    /// error, not an empty journal to write over: its pending takes would be lost.
    #[test]
    fn a_journal_that_cannot_be_opened_is_refused_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        std::os::unix::fs::symlink(&path, &path).unwrap();
        let err = NodeJournal::open(dir.path()).unwrap_err();
        assert!(matches!(err, JournalError::Io { .. }), "{err}");
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink(), "left as it was");
        // the binary's read: an error to log, where a missing journal (no agent yet) is only empty
        assert!(matches!(read_pending(dir.path()), Err(JournalError::Io { .. })));
        assert!(read_pending(tempfile::tempdir().unwrap().path()).unwrap().is_empty());
    }
}
