#!/usr/bin/env bash
# Builds the Go tools the tests run -- kube-apiserver, the kubelet, kube-scheduler, kube-controller-manager, etcd,
# the CNI reference plugins, cnitool, Whereabouts, Multus (thin and thick) and helm -- and copies the NAD and
# IPAMClaim CRDs from the pinned modules under hack/testenv/, each once per version, into $HEREABOUTS_TESTENV
# (default <repo>/.testenv, which git ignores). A warm machine rebuilds nothing. Prints the versions it provides.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${HEREABOUTS_TESTENV:-$root/.testenv}
mods=$root/hack/testenv

# never fetch another Go; the modules pin what they need and build static without a C toolchain
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly

command -v go >/dev/null || { echo "testenv: go is not on PATH; install Go >= $(awk '/^go /{print $2}' "$mods/k8s/go.mod")" >&2; exit 1; }

# Debian's packages: containerd and runc (the image test imports the image into a containerd of its own and runs
# it), bird2 (the routing-table datastore's tests run BIRD in every simulated node)
if ! command -v containerd >/dev/null || ! command -v runc >/dev/null || ! command -v bird >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "testenv: installing containerd, runc and bird2 (Debian packages) ..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containerd runc bird2 >&2
  else
    echo "testenv: containerd, runc or bird is missing; as root: apt-get install containerd runc bird2" >&2
  fi
fi

modver() { (cd "$mods/$1" && go list -m -f '{{.Version}}' "$2"); }

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
if [[ ! -d $out/whereabouts-$wb/crds ]]; then
  src=$(cd "$mods/whereabouts" && go list -m -f '{{.Dir}}' github.com/k8snetworkplumbingwg/whereabouts)
  mkdir -p "$out/whereabouts-$wb/.crds.tmp"
  cp "$src"/doc/crds/whereabouts.cni.cncf.io_*.yaml "$out/whereabouts-$wb/.crds.tmp/"
  chmod u+w "$out/whereabouts-$wb/.crds.tmp/"*
  mv "$out/whereabouts-$wb/.crds.tmp" "$out/whereabouts-$wb/crds"
fi

# the Multus thin plugin, and the NetworkAttachmentDefinition CRD from the NAD client module it depends on
build multus "multus-$multus" multus gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus
# and its thick plugin: the daemon that does the work, and the shim CNI plugin that hands it requests over a socket
for c in multus-daemon multus-shim; do
  build "$c" "multus-$multus" multus "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/$c"
done
if [[ ! -f $out/nad-client-$nad/networks-crd.yaml ]]; then
  src=$(cd "$mods/multus" && go list -m -f '{{.Dir}}' github.com/k8snetworkplumbingwg/network-attachment-definition-client)
  mkdir -p "$out/nad-client-$nad"
  cp "$src/artifacts/networks-crd.yaml" "$out/nad-client-$nad/.networks-crd.yaml.tmp"
  chmod u+w "$out/nad-client-$nad/.networks-crd.yaml.tmp"
  mv "$out/nad-client-$nad/.networks-crd.yaml.tmp" "$out/nad-client-$nad/networks-crd.yaml"
fi

# the IPAMClaim CRD (KubeVirt installs it in a cluster), from the module that defines it
if [[ ! -f $out/ipamclaims-$ipamclaims/ipamclaims-crd.yaml ]]; then
  src=$(cd "$mods/ipamclaims" && go list -m -f '{{.Dir}}' github.com/k8snetworkplumbingwg/ipamclaims)
  mkdir -p "$out/ipamclaims-$ipamclaims"
  cp "$src/artifacts/k8s.cni.cncf.io_ipamclaims.yaml" "$out/ipamclaims-$ipamclaims/.ipamclaims-crd.yaml.tmp"
  chmod u+w "$out/ipamclaims-$ipamclaims/.ipamclaims-crd.yaml.tmp"
  mv "$out/ipamclaims-$ipamclaims/.ipamclaims-crd.yaml.tmp" "$out/ipamclaims-$ipamclaims/ipamclaims-crd.yaml"
fi

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
link networks-crd.yaml "nad-client-$nad"
link ipamclaims-crd.yaml "ipamclaims-$ipamclaims"
link helm "helm-$helm"

echo "testenv: $out/bin: kube-apiserver, kubelet, kube-scheduler, kube-controller-manager $k8s, etcd $etcd, CNI plugins $plugins, cnitool (cni) $cni, whereabouts $wb (and its node-slice controller), multus $multus (thin, and thick: multus-daemon, multus-shim), NAD CRD $nad, IPAMClaim CRD $ipamclaims, helm $helm"
