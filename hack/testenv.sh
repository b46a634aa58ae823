#!/usr/bin/env bash
# Builds the Go tools the tests run -- kube-apiserver, the kubelet, kube-scheduler, kube-controller-manager, etcd,
# the CNI reference plugins, cnitool, Whereabouts, Multus (thin and thick) and helm -- and copies the NAD and
# IPAMClaim CRDs from the pinned modules under hack/testenv/, each once per version, into $HEREABOUTS_TESTENV
# (default <repo>/.testenv, which git ignores). A warm machine rebuilds nothing. Prints the versions it provides.
#
# --check-sources: only the copies, into a scratch output and an empty module cache (CI runs it on every run): a
# module that nothing downloads works on a warm machine and fails every newcomer.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${HEREABOUTS_TESTENV:-$root/.testenv}
mods=$root/hack/testenv

# never fetch another Go; the modules pin what they need and build static without a C toolchain
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly

check_sources=0
case ${1:-} in
  '') ;;
  --check-sources) check_sources=1 ;;
  *) echo "usage: $0 [--check-sources]" >&2; exit 2 ;;
esac

command -v go >/dev/null || { echo "testenv: go is not on PATH; install Go >= $(awk '/^go /{print $2}' "$mods/k8s/go.mod")" >&2; exit 1; }

# Debian's packages: containerd and runc (the image test imports the image into a containerd of its own and runs
# it), bird2 (the routing-table datastore's tests run BIRD in every simulated node), iproute2 (every end-to-end test
# makes network namespaces and veth pairs with `ip`), util-linux, bsdutils and procps (unshare and mount for the
# tests' private /etc/hosts, script for a terminal, pkill for a node's leftovers), and the C library's static
# archive (the binaries are linked static: .cargo/config.toml)
need_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  command -v bird >/dev/null || missing+=(bird2)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v unshare >/dev/null || missing+=(util-linux)
  command -v script >/dev/null || missing+=(bsdutils)
  command -v pkill >/dev/null || missing+=(procps)
  [[ $(cc -print-file-name=libc.a 2>/dev/null) == /* ]] || missing+=(libc6-dev)
  ((${#missing[@]} == 0)) && return 0
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "testenv: installing ${missing[*]} (Debian packages) ..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  else
    echo "testenv: ${missing[*]} missing; the tests need them (as root: apt-get install ${missing[*]})" >&2
    exit 1
  fi
}

if ((check_sources)); then
  # the same copies as below, from nothing: a scratch module cache and output, removed on the way out (the module
  # cache's files are read-only, so go removes it)
  scratch=$(mktemp -d)
  trap 'GOMODCACHE=$scratch/mod go clean -modcache; rm -rf "$scratch"' EXIT
  export GOMODCACHE=$scratch/mod
  out=$scratch/out
else
  need_packages
fi

modver() { (cd "$mods/$1" && go list -m -f '{{.Version}}' "$2"); }

# moddir MODULEDIR MODULE: the module's directory, downloaded first. `go list -m -f {{.Dir}}` alone prints an empty
# path for a module that is not in the module cache, and a build downloads only the modules it compiles.
moddir() { (cd "$mods/$1" && go mod download "$2" && go list -m -f '{{.Dir}}' "$2"); }

# copy MODULEDIR MODULE DEST PATTERN...: the module's files that match the patterns into $out/DEST, once
copied=0
copy() {
  local mod=$1 module=$2 dest=$out/$3; shift 3
  if [[ -d $dest ]]; then return 0; fi
  local src
  src=$(moddir "$mod" "$module")
  if [[ -z $src || ! -d $src ]]; then
    echo "testenv: $module (hack/testenv/$mod) is not in the module cache $(go env GOMODCACHE)" >&2
    exit 1
  fi
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  local pattern files
  for pattern in "$@"; do
    files=()
    for f in "$src"/$pattern; do [[ -f $f ]] && files+=("$f"); done
    if ((${#files[@]} == 0)); then
      echo "testenv: no file $pattern in $module ($src)" >&2
      exit 1
    fi
    cp "${files[@]}" "$dest.tmp/"
    copied=$((copied + ${#files[@]}))
  done
  chmod -R u+w "$dest.tmp"
  mv "$dest.tmp" "$dest"
}

# build NAME VERSIONDIR MODULEDIR PACKAGE [LDFLAGS]: go build into $out/VERSIONDIR/NAME unless it is there
build() {
  local name=$1 dir=$out/$2 mod=$3 pkg=$4 ldflags=${5:--s -w}
  if [[ -x $dir/$name ]]; then return 0; fi
  mkdir -p "$dir"
  local t0=$SECONDS
  echo "testenv: building $name ($2) ..." >&2
  (cd "$mods/$mod" && go build -trimpath -ldflags "$ldflags" -o "$dir/.$name.tmp" "$pkg")
  mv "$dir/.$name.tmp" "$dir/$name"
  echo "testenv: built $name in $((SECONDS - t0)) s" >&2
}

link() { mkdir -p "$out/bin"; ln -sfn "../$2/$1" "$out/bin/$1"; }

k8s=$(modver k8s k8s.io/kubernetes)
etcd=$(modver k8s go.etcd.io/etcd/server/v3)
plugins=$(modver cni github.com/containernetworking/plugins)
cni=$(modver cni github.com/containernetworking/cni)
wb=$(modver whereabouts github.com/k8snetworkplumbingwg/whereabouts)
multus=$(modver multus gopkg.in/k8snetworkplumbingwg/multus-cni.v4)
helm=$(modver helm helm.sh/helm/v4)
nad=$(modver multus github.com/k8snetworkplumbingwg/network-attachment-definition-client)
ipamclaims=$(modver ipamclaims github.com/k8snetworkplumbingwg/ipamclaims)

# the files the tests install from the modules, first: a missing one fails in seconds, not after the builds
# upstream Whereabouts' CRDs, for the compatibility tests and the benchmark
copy whereabouts github.com/k8snetworkplumbingwg/whereabouts "whereabouts-$wb/crds" 'doc/crds/whereabouts.cni.cncf.io_*.yaml'
# the NetworkAttachmentDefinition CRD, from the NAD client module Multus depends on
copy multus github.com/k8snetworkplumbingwg/network-attachment-definition-client "nad-client-$nad/crd" \
  artifacts/networks-crd.yaml
# the IPAMClaim CRD (KubeVirt installs it in a cluster), from the module that defines it; nothing is built from it
copy ipamclaims github.com/k8snetworkplumbingwg/ipamclaims "ipamclaims-$ipamclaims/crd" \
  artifacts/k8s.cni.cncf.io_ipamclaims.yaml

if ((check_sources)); then
  echo "testenv: $copied files copied from an empty module cache: $(cd "$out" && find . -type f | sort | tr '\n' ' ')"
  exit 0
fi

minor=${k8s#v1.}; minor=${minor%%.*}
# version stamping: without it /version reports v0.0.0-master and the compatibility version falls back
kldf="-s -w -X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1 \
-X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$k8s"

# the slow builds first: the apiserver is most of the cold build time
build kube-apiserver "kubernetes-$k8s" k8s k8s.io/kubernetes/cmd/kube-apiserver "$kldf"
# the real node's parts, from the same module: the kubelet, and the scheduler and controller-manager a DaemonSet needs
for c in kubelet kube-scheduler kube-controller-manager; do
  build "$c" "kubernetes-$k8s" k8s "k8s.io/kubernetes/cmd/$c" "$kldf"
done
# -o names the binary: go would call it "server" after the path element before /v3
build etcd "etcd-$etcd" k8s go.etcd.io/etcd/server/v3
for p in main/bridge main/macvlan main/ipvlan main/dummy main/loopback ipam/host-local; do
  build "${p#*/}" "cni-plugins-$plugins" cni "github.com/containernetworking/plugins/plugins/$p"
done
build cnitool "cni-$cni" cni github.com/containernetworking/cni/cnitool
# upstream Whereabouts, for the compatibility tests and the side-by-side benchmark; its CRDs ship in its module
build whereabouts "whereabouts-$wb" whereabouts github.com/k8snetworkplumbingwg/whereabouts/cmd
# its node-slice controller, which assigns fast-IPAM slices to Nodes (the benchmark's Whereabouts node-slice mode)
build whereabouts-nodeslicecontroller "whereabouts-$wb" whereabouts \
  github.com/k8snetworkplumbingwg/whereabouts/cmd/nodeslicecontroller
# the Multus thin plugin, and the NetworkAttachmentDefinition CRD from the NAD client module it depends on
build multus "multus-$multus" multus gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus
# and its thick plugin: the daemon that does the work, and the shim CNI plugin that hands it requests over a socket
for c in multus-daemon multus-shim; do
  build "$c" "multus-$multus" multus "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/$c"
done
# helm, to lint, render and install the chart in deploy/chart
build helm "helm-$helm" helm helm.sh/helm/v4/cmd/helm

for c in kube-apiserver kubelet kube-scheduler kube-controller-manager; do link "$c" "kubernetes-$k8s"; done
link etcd "etcd-$etcd"
for p in bridge macvlan ipvlan dummy loopback host-local; do link "$p" "cni-plugins-$plugins"; done
link cnitool "cni-$cni"
link whereabouts "whereabouts-$wb"
link whereabouts-nodeslicecontroller "whereabouts-$wb"
ln -sfn "../whereabouts-$wb/crds" "$out/bin/whereabouts-crds"
for c in multus multus-daemon multus-shim; do link "$c" "multus-$multus"; done
ln -sfn "../nad-client-$nad/crd/networks-crd.yaml" "$out/bin/networks-crd.yaml"
ln -sfn "../ipamclaims-$ipamclaims/crd/k8s.cni.cncf.io_ipamclaims.yaml" "$out/bin/ipamclaims-crd.yaml"
link helm "helm-$helm"

echo "testenv: $out/bin: kube-apiserver, kubelet, kube-scheduler, kube-controller-manager $k8s, etcd $etcd, CNI plugins $plugins, cnitool (cni) $cni, whereabouts $wb (and its node-slice controller), multus $multus (thin, and thick: multus-daemon, multus-shim), NAD CRD $nad, IPAMClaim CRD $ipamclaims, helm $helm"
