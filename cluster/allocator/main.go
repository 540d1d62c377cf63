// Command allocator answers "can this ResourceClaim be allocated now, and where?" with the
// Kubernetes scheduler's own DRA allocator (k8s.io/dynamic-resource-allocation/structured) and
// CEL environment (k8s.io/dynamic-resource-allocation/cel), built for one Kubernetes minor
// release (build tags k8s134..k8s137, one go.<minor>.mod per release).
//
// It reads one JSON document on stdin (see request in types.go) and writes one JSON document
// on stdout (see response). It never decides anything itself: the decision is the allocator's,
// run as the scheduler's DynamicResources plugin runs it (allocated devices gathered from the
// claims, the release's default feature gates, one Allocate call per node). What it adds is the
// per-request report draslice prints: how many devices match a request and how many of those
// are free, which the allocator does not expose.
//
// Exit status: 0 with a response (which may hold errors), 2 when the input cannot be read at
// all (the response then holds only "error").
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"runtime/pprof"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "--version" || os.Args[1] == "version") {
		fmt.Printf("%s %s\n", release, moduleVersion())
		return
	}
	if path := os.Getenv("DRASLICE_ALLOCATOR_CPUPROFILE"); path != "" {
		// For benchmarks/preflight_scale.py investigations: `go tool pprof` reads it.
		f, err := os.Create(path)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	// One short-lived run over a snapshot held in memory: collecting garbage while it grows
	// costs a quarter of the run at 8,000 devices. Collect only past 2 GiB.
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(2 << 30)
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(fmt.Errorf("read stdin: %w", err))
	}
	var req request
	if err := json.Unmarshal(data, &req); err != nil {
		fail(fmt.Errorf("input is not the JSON draslice sends: %w", err))
	}
	resp := run(&req)
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(resp); err != nil {
		fail(err)
	}
}

func fail(err error) {
	_ = json.NewEncoder(os.Stdout).Encode(response{Release: release, Error: err.Error()})
	os.Exit(2)
}
