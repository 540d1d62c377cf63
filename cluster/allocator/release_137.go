//go:build k8s137 || !(k8s134 || k8s135 || k8s136)

package main

// Kubernetes 1.37 with its default feature gates (pkg/features/kube_features.go at v1.37):
// DRAFractionalCapacityRange defaults on only with a compatibility version of 1.37, which a
// 1.37 control plane does not have by default (it keeps 1.36 compatibility), so it is off here.

import (
	"errors"

	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

const release = "1.37"

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

// Shared counters, as the 1.37 allocator charges them (allocator_incubating.go): every
// allocated device consumes its counters, shares included (structured.IsDeviceAllocated, the
// function checkAvailableCounters calls); a further share of a multi-allocatable device skips
// the check when the claims hold a share or capacity of it (deviceCapacityInUse): its counters
// are charged once.
func chargesCounters(id structured.DeviceID, state *structured.AllocatedState) bool {
	return structured.IsDeviceAllocated(id, state)
}

func shareSkipsCounters(id structured.DeviceID, state *structured.AllocatedState) bool {
	if _, held := state.AggregatedCapacity[id]; held {
		return true
	}
	for share := range state.AllocatedSharedDeviceIDs {
		if share.GetDeviceID() == id {
			return true
		}
	}
	return false
}
