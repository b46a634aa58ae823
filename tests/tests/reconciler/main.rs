//! The reconciler binary (`hereabouts-reconciler run`) and the operator's `kubectl-hereabouts`, as processes
//! against the test control plane, with the restricted identity bound by the manifest's rights.
//!
//! - `reconciler`: releases for deleted and finished pods, the cron, the Lease, the pool gauges.
//! - `reconciler_repair`: issue 9's repairs: static pods, retried releases, orphans, restored reservations,
//!   conflicts.
//! - `ctl`: `kubectl-hereabouts` `ipam show`, `ipam release`, `ipam check --repair` and `lint`.
//!
//! All need the control plane only. `cargo test -p hereabouts-tests --test reconciler`; one module:
//! `... --test reconciler -- ctl::`. `tests/README.md` lists every test binary.

mod ctl;
mod reconciler;
mod reconciler_repair;
