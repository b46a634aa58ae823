# The hereabouts image: the CNI plugin `hereabouts` and the DaemonSet binary `hereabouts-reconciler`.
#
#   docker build -t hereabouts:0.1.0 .
#
# `hereabouts-reconciler install-cni` copies /usr/local/bin/hereabouts to the host's CNI bin directory (see
# deploy/daemonset.yaml). Both binaries use rustls (no OpenSSL) and need only glibc and libgcc_s, which the
# distroless "cc" image has. There is no shell in the runtime image.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# BuildKit cache mounts keep the registry and the build between builds; the binaries are copied out of the cached
# target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p hereabouts-cni -p hereabouts-reconciler \
    && install -D -m 0755 -t /out target/release/hereabouts target/release/hereabouts-reconciler

# Debian 12, as the builder, so the glibc the binaries were linked against is there. Root by default: install-cni
# writes root-owned host directories; the DaemonSet runs the reconciler container as 65532 (distroless' nonroot).
FROM gcr.io/distroless/cc-debian12
LABEL org.opencontainers.image.title="hereabouts" \
      org.opencontainers.image.description="Cluster-wide IPAM CNI plugin for Kubernetes, Whereabouts-compatible" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/hereabouts /out/hereabouts-reconciler /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/hereabouts-reconciler"]
CMD ["run"]
