//! Slice mode (`node_slice_size`) and upstream Whereabouts beside hereabouts: the CNI binary claiming, using and
//! borrowing node slices, and both plugins on one range under Whereabouts' own CRD schema.
//!
//! - `adaptive`: adaptive slice sizes (`min_node_slice_size`): cuts, growth, a lost answer, a full range.
//! - `slices`: slice claims, bursts over many nodes, borrowing, lost answers, a killed claim, Whereabouts' fast
//!   IPAM on the same range. Needs the control plane.
//! - `whereabouts_compat`: hereabouts and Whereabouts read, extend and release each other's objects. A control
//!   plane of its own (its CRDs are replaced by Whereabouts'); the Whereabouts binary from testenv.
//!
//! `cargo test -p hereabouts-tests --test slices`; one module: `... --test slices -- whereabouts_compat::`.
//! `tests/README.md` lists every test binary.

mod adaptive;
mod ownership;
mod slices;
mod whereabouts_compat;
