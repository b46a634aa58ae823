//! Test support for hereabouts: a real kube-apiserver and etcd ([`TestCluster`]), built by `hack/testenv.sh`,
//! and helpers shared by the integration tests under `tests/`.

pub mod agent;
pub mod bird;
pub mod cluster;
pub mod connect_proxy;
pub mod containerd;
pub mod ctl;
pub mod deploy;
pub mod elf;
pub mod faultproxy;
pub mod fixture;
pub mod host_token;
pub mod kubeconfig;
pub mod metrics;
pub mod netns;
pub mod node;
pub mod objects;
mod pki;
pub mod plugin;
mod process;
pub mod provider;
pub mod rbac;
pub mod reconciler;
pub mod runtime;
pub mod testenv;
pub mod wait;
pub mod whereabouts_controller;

pub use cluster::{Identity, TestCluster};
/// The CRD manifests rendered from the types and the daemon-less image writer, from the release tooling
/// (`xtask/`): one copy of each, which the tests check and use.
pub use hereabouts_xtask::{crds, image};
pub use pki::SERVER_NAME;
