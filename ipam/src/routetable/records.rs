//! The node-local records of host routes: one file per address, `<state_dir>/<network>/<address>`, saying which
//! attachment holds it and which route stands for it, as host-local keeps its leases.
//!
//! A record is made before its route and removed after it, so a route of ours never lacks its record (a killed
//! ADD leaves at worst a record without a route, which GC removes). Made by a hard link of a complete temporary
//! file, a record appears whole or not at all, and only once: two ADDs on one node that pick the same address
//! cannot both make it.

use std::collections::HashSet;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::HostRoute;

/// Who holds an address, and by which route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `namespace/name`: who is told of a conflict, and whose absence lets the reconciler tidy up.
    pub pod: String,
    /// `K8S_POD_UID`, when the runtime gave it: a pod of the same name made since is another pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The route installed for the address.
    pub route: HostRoute,
}

/// A record as listed, with when it was made.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The address the file is named after.
    pub ip: IpAddr,
    /// Its contents; `None` when they cannot be read (a file that is not ours).
    pub record: Option<Record>,
    /// When the file was made.
    pub made: SystemTime,
}

/// Why a record could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct RecordError {
    op: &'static str,
    path: PathBuf,
    source: std::io::Error,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RecordError + 'a {
    move |source| RecordError { op, path: path.to_path_buf(), source }
}

/// The records of one network on this node.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    /// The records of `network` under `state_dir`, the directory made if missing.
    pub fn open(state_dir: &Path, network: &str) -> Result<Self, RecordError> {
        // a netconf name is [a-zA-Z0-9_.-]; anything else must not climb out of the state directory
        let safe: String =
            network.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
        let dir = state_dir.join(if safe.is_empty() || safe.starts_with('.') { format!("_{safe}") } else { safe });
        std::fs::create_dir_all(&dir).map_err(io("make", &dir))?;
        Ok(Self { dir })
    }

    /// The networks with records under `state_dir`; none when it does not exist.
    pub fn networks(state_dir: &Path) -> Result<Vec<String>, RecordError> {
        let entries = match std::fs::read_dir(state_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("list", state_dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io("list", state_dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    fn path(&self, ip: IpAddr) -> PathBuf {
        self.dir.join(ip.to_string())
    }

    /// Makes the record of `ip`; `false` when there is one already.
    pub fn create(&self, ip: IpAddr, record: &Record) -> Result<bool, RecordError> {
        let tmp = self.dir.join(format!(".{ip}.{}.tmp", std::process::id()));
        let body = serde_json::to_vec(record).expect("a record serialises");
        let mut f = std::fs::File::create(&tmp).map_err(io("write", &tmp))?;
        f.write_all(&body).and_then(|()| f.sync_all()).map_err(io("write", &tmp))?;
        let linked = std::fs::hard_link(&tmp, self.path(ip));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io("link", &self.path(ip))(e)),
        }
    }

    /// Removes the record of `ip`; one that is not there is no error.
    pub fn remove(&self, ip: IpAddr) -> Result<(), RecordError> {
        let path = self.path(ip);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", &path)(e)),
            _ => Ok(()),
        }
    }

    /// Every record of the network on this node.
    pub fn list(&self) -> Result<Vec<Listed>, RecordError> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io("list", &self.dir))? {
            let entry = entry.map_err(io("list", &self.dir))?;
            let Some(ip) = entry.file_name().to_str().and_then(|n| n.parse::<IpAddr>().ok()) else { continue };
            let path = entry.path();
            let made = entry.metadata().and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
            let record = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok());
            out.push(Listed { ip, record, made });
        }
        out.sort_by_key(|l| l.ip);
        Ok(out)
    }

    /// The addresses with a record.
    pub fn addresses(&self) -> Result<HashSet<IpAddr>, RecordError> {
        Ok(self.list()?.into_iter().map(|l| l.ip).collect())
    }

    /// The records of one attachment.
    pub fn of(&self, container_id: &str, ifname: &str) -> Result<Vec<(IpAddr, Record)>, RecordError> {
        Ok(self
            .list()?
            .into_iter()
            .filter_map(|l| Some((l.ip, l.record?)))
            .filter(|(_, r)| r.container_id == container_id && r.ifname == ifname)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(c: &str) -> Record {
        Record {
            container_id: c.into(),
            ifname: "net1".into(),
            pod: "ns/p".into(),
            pod_uid: None,
            route: HostRoute { dst: "198.18.0.9".parse().unwrap(), table: 254, protocol: 192, metric: 8 },
        }
    }

    #[test]
    fn a_record_is_made_once_and_found_by_its_attachment() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path(), "../net").unwrap();
        assert!(records.dir.starts_with(dir.path()), "the network name stays inside the state directory");
        let ip: IpAddr = "198.18.0.9".parse().unwrap();
        assert!(records.create(ip, &record("a")).unwrap());
        assert!(!records.create(ip, &record("b")).unwrap(), "the second claim on one node loses");
        assert_eq!(records.of("a", "net1").unwrap(), vec![(ip, record("a"))]);
        assert!(records.of("b", "net1").unwrap().is_empty());
        assert_eq!(records.addresses().unwrap(), HashSet::from([ip]));
        records.remove(ip).unwrap();
        records.remove(ip).unwrap();
        assert!(records.list().unwrap().is_empty(), "no temporary file is left either");
    }
}
