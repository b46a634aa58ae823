//! IaaS provider mode: the provider client against the reference provider over real HTTPS, and the CNI binary
//! and the reconciler with a provider behind their pools.
//!
//! - `provider`: the client: budget header, refusals, timeouts, TLS trust, status codes, idempotent release. Needs
//!   the reference provider only.
//! - `provider_candidates`: several candidate ranges: node-warm pools, candidate classes, idle sub-interfaces taken
//!   away. Needs the control plane.
//! - `provider_ipam`: global pools end to end: ADD and DEL through the provider, killed ADDs, gone Nodes. Needs the
//!   control plane.
//! - `provider_restart`: 40 pods ADDed across an API server restart. A control plane of its own.
//!
//! `cargo test -p hereabouts-tests --test provider`; one module: `... --test provider -- provider_ipam::`.
//! `tests/README.md` lists every test binary.

mod provider;
mod provider_candidates;
mod provider_ipam;
mod provider_restart;
