//! `hereabouts-reconciler` as a library: the DaemonSet binary's loops, and the release rules and actions they
//! share, which the protocol's property tests drive over an in-memory store.

pub mod cluster;
pub mod decide;
pub mod http;
pub mod install_cni;
pub mod leader;
pub mod metrics;
pub mod pods;
pub mod release;
pub mod run;
pub mod schedule;
pub mod sweep;
