//! What the numbers were measured on: the machine, the versions, the time.

use std::path::Path;

use hereabouts_tests::testenv;
use kube::Client;

fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .current_dir(testenv::repo_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

pub fn utc_stamp() -> String {
    command_line("date", &["-u", "+%Y%m%dT%H%M%SZ"])
}

pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "?".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    format!("nproc {cpus}, {model}, {:.1} GiB RAM, {}", mem_kb / 1024.0 / 1024.0, command_line("uname", &["-sr"]))
}

pub async fn versions(admin: &Client, hereabouts: &Path) -> String {
    let rev = command_line("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = if command_line("git", &["status", "--porcelain"]).is_empty() { "" } else { "+dirty" };
    let gomod =
        std::fs::read_to_string(testenv::repo_root().join("hack/testenv/whereabouts/go.mod")).unwrap_or_default();
    let wb = gomod
        .lines()
        .find_map(|l| l.trim().strip_prefix("github.com/k8snetworkplumbingwg/whereabouts "))
        .map(|v| v.split_whitespace().next().unwrap_or("?").to_string())
        .unwrap_or_else(|| "?".into());
    let apiserver = admin.apiserver_version().await.map(|v| v.git_version).unwrap_or_else(|_| "?".into());
    format!(
        "hereabouts {} ({rev}{dirty}, {}), Whereabouts {wb}, kube-apiserver {apiserver}, {}",
        env!("CARGO_PKG_VERSION"),
        // the binary as the repository names it: results are read on other machines
        hereabouts.strip_prefix(testenv::repo_root()).unwrap_or(hereabouts).display(),
        command_line("rustc", &["--version"])
    )
}
