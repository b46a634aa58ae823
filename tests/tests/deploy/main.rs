//! The deployment: the manifest and the Helm chart, the CRDs, the image, the static binaries, `install-cni` and
//! the two identities' rights, against the real API server.
//!
//! | module | what | needs |
//! | --- | --- | --- |
//! | `deploy` | `deploy/daemonset.yaml`: a server-side dry run, its shape, each CNI verb needed | control plane |
//! | `helm` | the chart: lint, its default render is the manifest, values, install and uninstall | helm; a control plane of its own for the install |
//! | `crds` | `crds/*.yaml` are the types' render; `kubectl get` columns | control plane |
//! | `image` | the daemon-less OCI image: layout, digests, containerd imports and runs it | root, containerd and runc for one test |
//! | `static_binary` | the binaries need no loader; the plugin resolves names without the host's libraries | root, util-linux |
//! | `install_cni` | `install-cni`: the CNI token, the files it writes, refreshes, CA and server changes | control plane |
//! | `identities` | each reconciler verb needed, what each identity may not do, the Lease, the endpoints | a control plane of its own; port 9300 free |
//!
//! `cargo test -p hereabouts-tests --test deploy`; one module: `... --test deploy -- install_cni::`.
//! `tests/README.md` lists every test binary.

mod crds;
mod deploy;
mod helm;
mod identities;
mod image;
mod install_cni;
mod static_binary;
