//! The name of the node this invocation runs on, as the API server knows it (`spec.nodeName`): what a node's
//! slices, locks and reservations are keyed by. The host name is only the kubelet's default, wrong under
//! `--hostname-override` or a cloud provider's naming, so it comes last.

use std::path::Path;

use hereabouts_ipam::config::NODE_NAME_FILE;

/// `NODENAME` from the runtime's environment; else the `nodename` file in the flat file's directory; else the host
/// name.
pub fn node_name(from_env: Option<&str>, flat_file: Option<&Path>) -> String {
    if let Some(name) = from_env.map(str::trim).filter(|n| !n.is_empty()) {
        return name.to_string();
    }
    let beside = flat_file.and_then(Path::parent).map(|dir| dir.join(NODE_NAME_FILE));
    if let Some(name) = beside.and_then(|path| std::fs::read_to_string(path).ok()) {
        let name = name.trim();
        if !name.is_empty() {
            return name.to_string();
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_lowercase()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_then_the_file_then_the_host_name() {
        let dir = tempfile::tempdir().unwrap();
        let flat = dir.path().join("hereabouts.conf");
        let host = node_name(None, None);
        assert!(!host.is_empty(), "the host name is read");
        assert_eq!(node_name(None, Some(&flat)), host, "no file: the host name");
        std::fs::write(dir.path().join(NODE_NAME_FILE), "worker-7.example\n").unwrap();
        assert_eq!(node_name(None, Some(&flat)), "worker-7.example");
        assert_eq!(node_name(Some(" "), Some(&flat)), "worker-7.example", "a blank NODENAME is not a name");
        assert_eq!(node_name(Some("from-env"), Some(&flat)), "from-env");
        std::fs::write(dir.path().join(NODE_NAME_FILE), "\n").unwrap();
        assert_eq!(node_name(None, Some(&flat)), host, "an empty file: the host name");
    }
}
