//! The deployment: the manifest and the Helm chart, the CRDs, the image, the static binaries, `install-cni` and
//! the two identities' rights, against the real API server.
//!
//! - `deploy`: `deploy/daemonset.yaml`: a server-side dry run, its shape, each verb of the CNI's Role needed.
//!   Needs the control plane.
//! - `helm`: the chart lints, renders the manifest by default, places each value; install and uninstall. Needs
//!   helm, and a control plane of its own for the install.
//! - `crds`: `crds/*.yaml` are the types' render; `kubectl get` shows the columns. Needs the control plane.
//! - `image`: the daemon-less OCI image: layout, digests; containerd imports and runs it. Needs root, containerd
//!   and runc (one test).
//! - `static_binary`: the binaries need no loader; the plugin resolves names without the host's libraries. Needs
//!   root and util-linux.
//! - `install_cni`: `install-cni`: the CNI token, the files it writes, refreshes, CA and server changes. Needs the
//!   control plane.
//! - `identities`: each reconciler verb needed, what each identity may not do (the CNI's with every binding of the
//!   chart applied), the Lease, the endpoints. A control plane of its own; port 9300 free.
//! - `node_tokens`: each host's token confined to its node by the chart's policies, as install-cni mints it; the
//!   CNI's rights that only a value grants. A control plane of its own.
//! - `docs`: every relative link of the README, the CHANGELOG and `docs/` resolves. Needs nothing.
//!
//! `cargo test -p hereabouts-tests --test deploy`; one module: `... --test deploy -- install_cni::`.
//! `tests/README.md` lists every test binary.

mod crds;
mod deploy;
mod docs;
mod helm;
mod identities;
mod image;
mod install_cni;
mod node_tokens;
mod static_binary;
