# The hereabouts image: the CNI plugin `hereabouts` and the DaemonSet binary `hereabouts-reconciler`, both static.
#
#   docker build -t hereabouts:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/hereabouts:0.1.0 --push .
#
# `hereabouts-reconciler install-cni` copies /usr/local/bin/hereabouts to the host's CNI bin directory (see
# deploy/daemonset.yaml); the runtime executes it on the host, so it must not need the host's glibc. `make image`
# writes the same file system as an OCI layout tar without a Docker daemon (xtask/src/image.rs). Only
# linux/amd64 is built and checked by the project's CI; the arm64 stage is the same recipe for the other triple
# (buildx runs it natively or under QEMU) and has not been run.

FROM --platform=$TARGETPLATFORM rust:1-bookworm AS build
ARG TARGETARCH
# The commit, for hereabouts_build_info and the first log line (`--build-arg HEREABOUTS_REVISION=$(git rev-parse
# --short=12 HEAD)`); empty, `unknown` (.dockerignore leaves .git out of the context).
ARG HEREABOUTS_REVISION=""
ENV HEREABOUTS_REVISION=$HEREABOUTS_REVISION
WORKDIR /src
COPY . .
# BuildKit cache mounts keep the registry and the build between builds; the binaries are copied out of the cached
# target directory in the same step. crt-static links glibc in; .cargo/config.toml says so for x86_64, and the
# environment for aarch64.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    case "$TARGETARCH" in \
      amd64) triple=x86_64-unknown-linux-gnu ;; \
      arm64) triple=aarch64-unknown-linux-gnu ;; \
      *) echo "unsupported architecture $TARGETARCH" >&2; exit 1 ;; \
    esac \
    && CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
       cargo build --release --locked --target "$triple" -p hereabouts-cni -p hereabouts-reconciler \
    && install -D -m 0755 -t /out "target/$triple/release/hereabouts" "target/$triple/release/hereabouts-reconciler"

# Nothing but the binaries, CA certificates and a passwd naming nonroot: the binaries link glibc statically.
# Root by default: install-cni writes root-owned host directories; the DaemonSet runs the reconciler container as
# 65532 (nonroot).
FROM gcr.io/distroless/static-debian12
ARG HEREABOUTS_REVISION=""
LABEL org.opencontainers.image.title="hereabouts" \
      org.opencontainers.image.description="Cluster-wide IPAM CNI plugin for Kubernetes, Whereabouts-compatible" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.revision="$HEREABOUTS_REVISION"
COPY --from=build /out/hereabouts /out/hereabouts-reconciler /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/hereabouts-reconciler"]
CMD ["run"]
