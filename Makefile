# The two commands a newcomer needs: `make test` (every test, building what is missing first) and, once the
# end-to-end issue lands, `make demo`.
SHELL := /bin/bash
export GOTOOLCHAIN := local

.PHONY: test testenv build crds lint deny

## every test: builds the Go tools (once per version) and the binaries, then runs the whole workspace's tests
test: testenv build
	cargo test --workspace --no-fail-fast

## kube-apiserver, etcd, CNI plugins and cnitool from the pinned Go modules, into .testenv/
testenv:
	hack/testenv.sh

## the binaries the integration tests run as processes
build:
	cargo build --workspace --bins

## regenerate crds/*.yaml from the Rust types
crds:
	cargo run -q -p hereabouts-tests --bin crdgen

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

deny:
	hack/deny.sh
