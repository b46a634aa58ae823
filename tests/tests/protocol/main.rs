//! The allocation protocol on the real API server, and under faults: what it relies on, the fault proxy itself,
//! the plugin through lost answers, resets, refusals and killed processes, and restarts of the API server.
//!
//! - `protocol`: guarded patches, conflicts, AlreadyExists, RBAC refusals (docs/design.md, "The store protocol"). Needs the control plane.
//! - `faultproxy`: the fault-injecting proxy relays faithfully and each action does what it says. Needs the
//!   control plane.
//! - `faults`: issue 9's defects, each reproduced through the proxy. Needs the control plane.
//! - `apiserver_restart`: killing and restarting kube-apiserver on its port with its data. A control plane of its
//!   own.
//! - `fault_campaign`: 320 pods under API server restarts and killed plugins, then the reconcilers. A control
//!   plane of its own.
//!
//! `cargo test -p hereabouts-tests --test protocol`; one module: `... --test protocol -- faults::`.
//! `tests/README.md` lists every test binary.

mod apiserver_restart;
mod fault_campaign;
mod faultproxy;
mod faults;
mod protocol;
