//go:build k8s136

package main

// Kubernetes 1.36 with its default feature gates (pkg/features/kube_features.go: consumable
// capacity, binding conditions, device taints and partitionable devices went beta, on).

import (
	"errors"

	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

const release = "1.36"

const skipsIncompletePools = true

func features() structured.Features {
	return structured.Features{
		AdminAccess:            true,
		ConsumableCapacity:     true,
		DeviceBindingAndStatus: true,
		DeviceTaints:           true,
		PartitionableDevices:   true,
		PrioritizedList:        true,
	}
}

func celFeatures() cel.Features {
	return cel.Features{EnableConsumableCapacity: true}
}

// nodeFailure: the allocator's "not on this node" error, which lets the scheduler go on with
// other nodes (any other error stops scheduling the pod).
func nodeFailure(err error) bool {
	return errors.Is(err, structured.ErrFailedAllocationOnNode)
}

// Shared counters, as the 1.36 allocator charges them (allocator_incubating.go): every
// allocated device consumes its counters, shares included (structured.IsDeviceAllocated, the
// function checkAvailableCounters calls); a further share of a multi-allocatable device skips
// the check only when the claims hold capacity of it (deviceCapacityInUse), so a device shared
// without consumed capacity is charged again and its next share fails on its own counters.
func chargesCounters(id structured.DeviceID, state *structured.AllocatedState) bool {
	return structured.IsDeviceAllocated(id, state)
}

func shareSkipsCounters(id structured.DeviceID, state *structured.AllocatedState) bool {
	_, held := state.AggregatedCapacity[id]
	return held
}
