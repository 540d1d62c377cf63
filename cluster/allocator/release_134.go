//go:build k8s134

package main

// Kubernetes 1.34 with its default feature gates: admin access and prioritized lists (beta, on);
// consumable capacity, binding conditions, device taints and partitionable devices alpha, off.
// ResourceClaimDeviceStatus is beta (on) but binding conditions are off. The 1.34 allocator
// still takes single devices from a pool that is being updated.

import (
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

const release = "1.34"

const skipsIncompletePools = false

func features() structured.Features {
	return structured.Features{
		AdminAccess:     true,
		PrioritizedList: true,
		DeviceStatus:    true,
	}
}

func celFeatures() cel.Features {
	return cel.Features{}
}

// nodeFailure: the 1.34 allocator answers "not on this node" with no result and no error.
func nodeFailure(error) bool {
	return false
}

// Shared counters, as the 1.34 allocator charges them (allocator_experimental.go,
// checkAvailableCounters): only dedicated allocations consume counters, and a further share of
// a device never skips the counter check.
func chargesCounters(id structured.DeviceID, state *structured.AllocatedState) bool {
	return state.AllocatedDevices.Has(id)
}

func shareSkipsCounters(structured.DeviceID, *structured.AllocatedState) bool {
	return false
}
