//! The CNI plugin binary (`hereabouts`), run as a runtime runs it, against the test control plane.
//!
//! | module | what | needs |
//! | --- | --- | --- |
//! | `cni` | ADD, DEL, CHECK, GC, VERSION; concurrency, overlap, exhaustion, malformed input, lenient DEL | control plane |
//! | `cni_cost` | the API requests one ADD and one DEL cost | a control plane of its own |
//! | `cooldown` | the reuse cooldown, also under lost answers | control plane |
//! | `pod_ranges` | ranges chosen per pod, namespace and node | control plane |
//! | `sticky` | sticky StatefulSet addresses, with the reconciler | control plane |
//!
//! `cargo test -p hereabouts-tests --test cni`; one module: `... --test cni -- cooldown::`. `tests/README.md`
//! lists every test binary.

mod cni;
mod cni_cost;
mod cooldown;
mod pod_ranges;
mod sticky;
