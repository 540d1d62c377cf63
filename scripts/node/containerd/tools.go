//go:build tools

// Package build pins the main packages that scripts/node/build.sh compiles (containerd and its
// runc shim), so that `go mod tidy` keeps every module they need in go.mod and go.sum.
package build

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
