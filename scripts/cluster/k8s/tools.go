//go:build tools

// Package build pins the main packages that scripts/cluster/build.sh (the control plane) and
// scripts/node/build.sh (the kubelet; the DRA driver in dradriver/ imports its own) compile, so that
// `go mod tidy` keeps every module they need in go.mod and go.sum.
package build

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
