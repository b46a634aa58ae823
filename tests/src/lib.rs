//! Test support for hereabouts: a real kube-apiserver and etcd ([`TestCluster`]), built by `hack/testenv.sh`,
//! and helpers shared by the integration tests under `tests/`.

pub mod cluster;
pub mod crds;
pub mod kubeconfig;
mod pki;
mod process;
pub mod testenv;
pub mod wait;

pub use cluster::{Identity, TestCluster};
