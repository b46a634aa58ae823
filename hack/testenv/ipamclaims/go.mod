// The IPAMClaim CRD (ipamclaims.k8s.cni.cncf.io) from its upstream module, for the persistent-address tests: no
// binary is built from it, hack/testenv.sh copies the CRD the module ships.
module hereabouts.invalid/testenv/ipamclaims

go 1.26.8

require github.com/k8snetworkplumbingwg/ipamclaims v0.5.1-alpha // indirect
