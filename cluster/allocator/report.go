package main

// The per-request report: which published devices a request's selectors (with its class's)
// match, evaluated by the upstream CEL environment, and which of those are free. The
// allocator decides; this only explains, so a user sees "3 match, 0 free: allocated to claim
// team/job" next to the allocator's verdict. The states follow what the allocator skips, under
// the same feature gates: devices held by dedicated allocations, untolerated NoSchedule or
// NoExecute taints (DRADeviceTaints), pools being updated (skipped since 1.35), and shared
// counters used up by allocated devices (DRAPartitionableDevices), shares of multi-allocatable
// devices included where the release charges them.

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

const maxErrors = 5

type poolKey struct{ driver, pool string }

type poolView struct {
	generation int64
	slices     int
	expected   int64
	counters   map[string]map[string]resource.Quantity
	used       map[string]map[string]resource.Quantity
}

type deviceView struct {
	id     structured.DeviceID
	pool   poolKey
	device *resourceapi.Device
}

type clusterView struct {
	in      *input
	pools   map[poolKey]*poolView
	devices []deviceView
}

func newClusterView(in *input) *clusterView {
	v := &clusterView{in: in, pools: map[poolKey]*poolView{}}
	for _, s := range in.slices {
		k := poolKey{s.Spec.Driver, s.Spec.Pool.Name}
		p := v.pools[k]
		if p == nil || s.Spec.Pool.Generation > p.generation {
			p = &poolView{generation: s.Spec.Pool.Generation,
				counters: map[string]map[string]resource.Quantity{},
				used:     map[string]map[string]resource.Quantity{}}
			v.pools[k] = p
		}
	}
	for _, s := range in.slices {
		k := poolKey{s.Spec.Driver, s.Spec.Pool.Name}
		p := v.pools[k]
		if s.Spec.Pool.Generation != p.generation {
			continue
		}
		p.slices++
		p.expected = max(p.expected, s.Spec.Pool.ResourceSliceCount)
		for _, cs := range s.Spec.SharedCounters {
			p.counters[cs.Name] = map[string]resource.Quantity{}
			for name, c := range cs.Counters {
				p.counters[cs.Name][name] = c.Value
			}
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			v.devices = append(v.devices, deviceView{
				id: structured.MakeDeviceID(k.driver, k.pool, d.Name), pool: k, device: d})
		}
	}
	// Counters already consumed: by the devices the release's allocator charges (chargesCounters,
	// in release_13x.go), which from 1.36 include devices held only by shares.
	for _, d := range v.devices {
		if !chargesCounters(d.id, &in.state) {
			continue
		}
		p := v.pools[d.pool]
		for _, use := range d.device.ConsumesCounters {
			if p.used[use.CounterSet] == nil {
				p.used[use.CounterSet] = map[string]resource.Quantity{}
			}
			for name, c := range use.Counters {
				q := p.used[use.CounterSet][name]
				q.Add(c.Value)
				p.used[use.CounterSet][name] = q
			}
		}
	}
	return v
}

// inventory: every published device's state for a plain request (no toleration, no admin
// access), for the inventory table.
func (v *clusterView) inventory() []deviceReport {
	out := make([]deviceReport, 0, len(v.devices))
	for _, d := range v.devices {
		state, why := v.state(requestSpec{}, d)
		out = append(out, deviceReport{Driver: d.id.Driver.String(), Pool: d.id.Pool.String(),
			Device: d.id.Device.String(), State: state, Why: why})
	}
	return out
}

type requestSpec struct {
	name, parent string
	class        string
	mode         resourceapi.DeviceAllocationMode
	count        int64
	selectors    []resourceapi.DeviceSelector
	tolerations  []resourceapi.DeviceToleration
	adminAccess  bool
}

func requestSpecs(claim *resourceapi.ResourceClaim) []requestSpec {
	var out []requestSpec
	for _, r := range claim.Spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			out = append(out, requestSpec{name: r.Name, class: e.DeviceClassName,
				mode: e.AllocationMode, count: e.Count, selectors: e.Selectors,
				tolerations: e.Tolerations, adminAccess: ptr.Deref(e.AdminAccess, false)})
		}
		for _, s := range r.FirstAvailable {
			out = append(out, requestSpec{name: r.Name + "/" + s.Name, parent: r.Name,
				class: s.DeviceClassName, mode: s.AllocationMode, count: s.Count,
				selectors: s.Selectors, tolerations: s.Tolerations})
		}
	}
	return out
}

func (v *clusterView) report(ctx context.Context, cache *cel.Cache,
	claim *resourceapi.ResourceClaim) []requestReport {
	var out []requestReport
	for _, spec := range requestSpecs(claim) {
		rep := requestReport{Name: spec.name, Parent: spec.parent, DeviceClass: spec.class,
			Mode: string(spec.mode), Count: spec.count, Errors: []string{},
			Devices: []deviceReport{}, Selectors: []string{}}
		if rep.Mode == "" {
			rep.Mode = string(resourceapi.DeviceAllocationModeExactCount)
		}
		for _, s := range spec.selectors {
			if s.CEL != nil {
				rep.Selectors = append(rep.Selectors, s.CEL.Expression)
			}
		}
		class, err := v.in.classes.Get(spec.class)
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
			out = append(out, rep)
			continue
		}
		for _, d := range v.devices {
			state, why := v.state(spec, d)
			ok, errText := v.matches(ctx, cache, class, spec, d)
			// The allocator checks "in use" before it evaluates selectors: an error on a
			// device it never evaluates is no error of this request.
			if errText != "" && state == "free" && len(rep.Errors) < maxErrors {
				rep.Errors = append(rep.Errors, errText)
			}
			if !ok {
				continue
			}
			rep.Matching++
			if state == "free" {
				rep.Free++
			}
			rep.Devices = append(rep.Devices, deviceReport{Driver: d.id.Driver.String(),
				Pool: d.id.Pool.String(), Device: d.id.Device.String(), State: state, Why: why})
		}
		out = append(out, rep)
	}
	return out
}

// matches evaluates the class's selectors, then the request's, with the allocator's CEL cache.
// A runtime error is reported in the allocator's words and the device does not match.
func (v *clusterView) matches(ctx context.Context, cache *cel.Cache, class *resourceapi.DeviceClass,
	spec requestSpec, d deviceView) (bool, string) {
	dev := cel.Device{Driver: d.id.Driver.String(), Attributes: d.device.Attributes,
		Capacity: d.device.Capacity, AllowMultipleAllocations: d.device.AllowMultipleAllocations}
	for owner, selectors := range [][]resourceapi.DeviceSelector{class.Spec.Selectors, spec.selectors} {
		for i, s := range selectors {
			if s.CEL == nil {
				continue
			}
			ok, _, err := cache.GetOrCompile(s.CEL.Expression).DeviceMatches(ctx, dev)
			if err != nil {
				who := "class " + class.Name
				if owner == 1 {
					who = "request " + spec.name
				}
				return false, fmt.Sprintf("%s: selector #%d on device %s: CEL runtime error: %v",
					who, i, d.id, err)
			}
			if !ok {
				return false, ""
			}
		}
	}
	return true, ""
}

func (v *clusterView) state(spec requestSpec, d deviceView) (string, string) {
	f := features()
	// allocatedBy holds dedicated allocations only (a share of a device, with a share ID, is
	// not one): a device held that way is in use even if it allows multiple allocations.
	if who, held := v.in.allocatedBy[d.id]; held && !spec.adminAccess {
		return "taken", "allocated to claim " + who
	}
	if f.DeviceTaints {
		for _, taint := range d.device.Taints {
			if taint.Effect != resourceapi.DeviceTaintEffectNoSchedule &&
				taint.Effect != resourceapi.DeviceTaintEffectNoExecute {
				continue
			}
			tolerated := false
			for _, tol := range spec.tolerations {
				tolerated = tolerated || resourceclaim.ToleratesTaint(tol, taint)
			}
			if !tolerated {
				return "tainted", fmt.Sprintf("taint %s=%s:%s", taint.Key, taint.Value, taint.Effect)
			}
		}
	}
	p := v.pools[d.pool]
	if skipsIncompletePools && p.expected > int64(p.slices) {
		return "incomplete", fmt.Sprintf("pool %s/%s is being updated (%d of %d slices of "+
			"generation %d): Kubernetes %s allocates nothing from it", d.pool.driver, d.pool.pool,
			p.slices, p.expected, p.generation, release)
	}
	if len(d.device.ConsumesCounters) == 0 {
		return "free", ""
	}
	if !f.PartitionableDevices {
		return "blocked", "consumes shared counters, and DRAPartitionableDevices is off by " +
			"default in Kubernetes " + release
	}
	if f.ConsumableCapacity && ptr.Deref(d.device.AllowMultipleAllocations, false) &&
		shareSkipsCounters(d.id, &v.in.state) {
		return "free", "" // a further share: its counters are charged already
	}
	for _, use := range d.device.ConsumesCounters {
		have, ok := p.counters[use.CounterSet]
		if !ok {
			return "blocked", fmt.Sprintf("counter set %s is not published in pool %s",
				use.CounterSet, d.pool.pool)
		}
		for name, c := range use.Counters {
			need := p.used[use.CounterSet][name]
			need.Add(c.Value)
			avail := have[name]
			if need.Cmp(avail) > 0 {
				held := p.used[use.CounterSet][name]
				own := ""
				if chargesCounters(d.id, &v.in.state) {
					// This device is among them (1.36 charges a shared one again for each share).
					own = ", this device's own allocation among them"
				}
				return "blocked", fmt.Sprintf("shared counter %s/%s is used by allocated devices "+
					"(%s of %s%s)", use.CounterSet, name, held.String(), avail.String(), own)
			}
		}
	}
	return "free", ""
}
