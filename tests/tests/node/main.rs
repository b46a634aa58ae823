//! hereabouts where pods run: a real kubelet + containerd node with the chart installed by helm, simulated nodes
//! in network namespaces with the CNI reference plugins and Multus, and the routing-table datastore with BIRD.
//!
//! - `node`: the chart on a real node: pods ping and give their addresses back, a rolling update, the reconciler
//!   back after being down, the switch-over from Whereabouts. Needs root, containerd and runc, and the real-node
//!   control plane; one node at a time.
//! - `e2e`: simulated nodes on one L2 fabric: macvlan pods through cnitool and Multus, DEL, the reconciler. Needs
//!   root, iproute2 and the control plane.
//! - `routetable`: `"datastore": "routetable"` and `announce_routes`: BIRD on every node, forced collisions. Needs
//!   root, iproute2 and BIRD 2 (the control plane for one test).
//! - `warm`: the node agent's warm reserve on the real node: pods start from it, are handed over, and DEL leaves
//!   the reserve. Like `node`.
//!
//! `cargo test -p hereabouts-tests --test node`; one module: `... --test node -- routetable::`.
//! `tests/README.md` lists every test binary.

mod e2e;
mod node;
mod routetable;
mod warm;
