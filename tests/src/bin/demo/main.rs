//! `make demo`: hereabouts on a local control plane. Where a real node can run (root, containerd and runc), on a
//! real kubelet + containerd node with Multus, the chart installed by helm ([`real_node`]); elsewhere, or with
//! `--simulated`, on three simulated nodes ([`simulated`]). Either way it sets up everything it needs and removes it
//! at the end.

mod real_node;
mod simulated;

use std::time::Instant;

use hereabouts_ipam::crd::IpPool;
use hereabouts_tests::node;

/// Numbered, timed steps on stdout.
struct Step {
    n: usize,
    t0: Instant,
}

impl Step {
    fn say(&mut self, what: &str) {
        self.n += 1;
        println!("[{:>5.1}s] {:>2}. {what}", self.t0.elapsed().as_secs_f64(), self.n);
    }
}

fn detail(what: &str) {
    println!("              {what}");
}

/// The pool's allocations, lowest address first.
fn print_pool(pool: &IpPool) {
    let range: ipnet::Ipv4Net = pool.spec.range.parse().expect("an IPv4 range");
    let mut rows: Vec<(u32, &hereabouts_ipam::crd::IpAllocation)> =
        pool.spec.allocations.iter().filter_map(|(k, a)| Some((k.parse().ok()?, a))).collect();
    rows.sort_by_key(|(k, _)| *k);
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    detail(&format!("IPPool {name}: {} of {} addresses allocated", rows.len(), range.hosts().count()));
    detail(&format!("{:<15} {:<24} {:<9} {}", "ADDRESS", "POD", "NODE", "CONTAINER"));
    for (offset, a) in rows {
        let addr = std::net::Ipv4Addr::from(u32::from(range.network()) + offset);
        let id: String = a.id.chars().take(18).collect();
        detail(&format!("{:<15} {:<24} {:<9} {id}", addr, a.podref, a.node.as_deref().unwrap_or("-")));
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut step = Step { n: 0, t0: Instant::now() };
    if !std::env::args().any(|a| a == "--simulated") {
        match node::cannot_run() {
            None => return real_node::main(&mut step).await,
            Some(why) => println!("a real node cannot run here ({why}): the demo runs on simulated nodes\n"),
        }
    }
    simulated::main(&mut step).await
}
