//! Starts the test control plane and reports on it: `controlplane [IDLE_SECONDS]` prints the API server's URL,
//! an admin kubeconfig, the time to `/readyz`, then, after IDLE_SECONDS (default 20) of idling, the resident
//! memory of kube-apiserver and etcd; then it stops everything.

use std::time::Duration;

use hereabouts_tests::{Identity, TestCluster};

fn rss_kib(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> anyhow::Result<()> {
    let idle: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(20);
    let cluster = TestCluster::get();
    println!("server:     {}", cluster.server());
    println!("kubeconfig: {}", cluster.kubeconfig(Identity::Admin, "default").display());
    println!("ready in:   {:.2} s", cluster.ready_after.as_secs_f64());
    std::thread::sleep(Duration::from_secs(idle));
    let mut total = 0;
    for name in ["kube-apiserver", "etcd"] {
        let pid = std::fs::read_to_string(cluster.dir().join(format!("{name}.pid")))?;
        let kib = rss_kib(pid.trim()).unwrap_or(0);
        total += kib;
        println!("rss {name}: {:.0} MiB", kib as f64 / 1024.0);
    }
    println!("rss total after {idle} s idle: {:.0} MiB", total as f64 / 1024.0);
    Ok(())
}
