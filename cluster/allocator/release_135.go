//go:build k8s135

package main

// Kubernetes 1.35 with its default feature gates: admin access and prioritized lists (beta, on);
// consumable capacity, binding conditions, device taints and partitionable devices alpha, off.
// From 1.35 the allocator takes no device from a pool that is being updated.

import (
	"errors"

	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

const release = "1.35"

const skipsIncompletePools = true

func features() structured.Features {
	return structured.Features{
		AdminAccess:     true,
		PrioritizedList: true,
	}
}

func celFeatures() cel.Features {
	return cel.Features{}
}

// nodeFailure: the allocator's "not on this node" error, which lets the scheduler go on with
// other nodes (any other error stops scheduling the pod).
func nodeFailure(err error) bool {
	return errors.Is(err, structured.ErrFailedAllocationOnNode)
}

// Shared counters, as the 1.35 allocator charges them (allocator_experimental.go): only
// dedicated allocations consume counters (checkAvailableCounters); a further share of a
// multi-allocatable device skips the check when the claims hold capacity of it
// (deviceCapacityInUse).
func chargesCounters(id structured.DeviceID, state *structured.AllocatedState) bool {
	return state.AllocatedDevices.Has(id)
}

func shareSkipsCounters(id structured.DeviceID, state *structured.AllocatedState) bool {
	_, held := state.AggregatedCapacity[id]
	return held
}
