# The two commands a newcomer needs: `make test` (every test, building what is missing first) and `make demo`
# (as root: the local demo on a real node).
SHELL := /bin/bash
export GOTOOLCHAIN := local

.PHONY: test testenv build crds manifest lint deny bench demo fuzz mutants image

## every test: builds the Go tools (once per version) and the binaries, then runs the whole workspace's tests
test: testenv build
	cargo test --workspace --no-fail-fast

## kube-apiserver, etcd, CNI plugins and cnitool from the pinned Go modules, into .testenv/
testenv:
	hack/testenv.sh

## the binaries the integration tests run as processes
build:
	cargo build --workspace --bins

## the local demo (root): a control plane and a real kubelet + containerd node, the chart installed by helm, pods
## through Multus, the reconciler giving addresses back (3 simulated nodes where containerd/runc cannot run);
## `make demo DEMO_ARGS=--multus-thick` runs Multus' thick plugin instead of its thin one
demo: testenv build
	cargo run -q -p hereabouts-tests --bin demo -- $(DEMO_ARGS)

## the image as an OCI layout tar from the static release binaries, with no container daemon (`ctr images import`
## loads it; the Dockerfile is the Docker/BuildKit recipe for the same file system)
image:
	cargo build --release -p hereabouts-cni -p hereabouts-reconciler -p hereabouts-xtask --bin hereabouts --bin hereabouts-reconciler --bin xtask
	cargo run -q --release -p hereabouts-xtask -- image target/hereabouts-image.tar hereabouts:0.1.0

## regenerate deploy/daemonset.yaml: the chart in deploy/chart rendered with its default values
manifest: testenv
	$${HEREABOUTS_TESTENV:-.testenv}/bin/helm template hereabouts deploy/chart > deploy/daemonset.yaml

## regenerate crds/*.yaml from the Rust types
crds:
	cargo run -q -p hereabouts-xtask -- crds

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

deny:
	hack/deny.sh

## hereabouts vs upstream Whereabouts, side by side on the test control plane (release binaries); tables and JSON
## in hack/bench/results/. BENCH_ARGS="--quick" for a short smoke run, "--rounds N" for more rounds.
bench: testenv
	cargo build --release -p hereabouts-cni -p hereabouts-reconciler
	cargo run --release -p hereabouts-bench -- $(BENCH_ARGS)

## far more generated cases than CI runs (release build): the whole protocol under injected faults on the in-memory
## store, and generated configs, CNI_ARGS and environments through the CNI parse path. SIM_CASES / FUZZ_CASES.
fuzz:
	HEREABOUTS_SIM_CASES=$${SIM_CASES:-100000} cargo test --release -p hereabouts-ipam --test simulation -- --nocapture
	HEREABOUTS_FUZZ_CASES=$${FUZZ_CASES:-1000000} cargo test --release -p hereabouts-cni --test parse_fuzz -- --nocapture

## mutation testing of the safety core (cargo-mutants, once per version into .testenv/): every file, or
## MUTANTS_FILES="ipam/src/store/guard.rs"; hours on 2 cores, so not in CI (docs/development.md)
mutants:
	hack/mutants.sh $(MUTANTS_FILES)
