//! `hereabouts-reconciler` as a library: the DaemonSet binary's loops (the node's pods, the leader's schedule,
//! slices and gauges, the provider's releases) and install-cni. The release rules they apply are
//! `hereabouts_ipam::reconcile`'s.

/// The commit this binary was built from (`HEREABOUTS_REVISION` at build time, else git's; `unknown` without
/// either): `hereabouts_build_info` and the first log line.
pub const REVISION: &str = env!("HEREABOUTS_REVISION");

pub mod agent;
mod ahead;
mod copies;
pub mod gauges;
pub mod http;
pub mod install_cni;
pub mod leader;
pub mod metrics;
pub mod node_slices;
pub mod pods;
pub mod route_checker;
pub mod run;
pub mod schedule;
pub mod schema;
pub mod sub_interfaces;
pub mod sweep;
pub mod warm;

/// An error and its sources, on one line: for logs that are written once per distinct failure.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        line.push_str(": ");
        line.push_str(&e.to_string());
        source = e.source();
    }
    line
}
