//! The CNI plugin binary (`hereabouts`), run as a runtime runs it, against the test control plane.
//!
//! - `agent`: the node agent serves invocations, and the binary does them itself when it does not answer.
//!   Needs the control plane.
//! - `cni`: ADD, DEL, CHECK, GC, VERSION; concurrency, overlapping ranges, exhaustion, malformed input, the
//!   lenient DEL. Needs the control plane.
//! - `cni_cost`: the API requests one ADD and one DEL cost. A control plane of its own (it counts every request).
//! - `cooldown`: the reuse cooldown, also under lost answers. Needs the control plane.
//! - `ipamclaims`: persistent addresses for VMs (IPAMClaim): a live migration, a restart, the claim's deletion, with
//!   the reconciler and lost answers; the plugin's rights for it. Needs the control plane.
//! - `pod_ranges`: ranges chosen per pod, namespace and node. Needs the control plane.
//! - `proxy`: the binary, the agent and `kubectl hereabouts` through a `CONNECT` proxy (`HTTPS_PROXY`), past it
//!   (`NO_PROXY`), and an unusable setting reported as such. Needs the control plane; root for `NO_PROXY`'s test
//!   (a mount namespace whose /etc/hosts names the server).
//! - `relayout`: a range grown while pods hold addresses of the old one. Needs the control plane.
//! - `sticky`: sticky StatefulSet addresses, with the reconciler. Needs the control plane.
//! - `warm`: the warm reserve through the agent, with the API server stopped (a control plane of its own), and its
//!   refusal where Whereabouts' reconciler runs.
//!
//! `cargo test -p hereabouts-tests --test cni`; one module: `... --test cni -- cooldown::`. `tests/README.md`
//! lists every test binary.

mod agent;
mod cni;
mod cni_cost;
mod cooldown;
mod ipamclaims;
mod pod_ranges;
mod proxy;
mod relayout;
mod sticky;
mod warm;
