//go:build tools

// Package build pins the main packages that scripts/cluster/build.sh compiles, so that
// `go mod tidy` keeps every module they need in go.mod and go.sum.
package build

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
