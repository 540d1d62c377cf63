package main

import (
	"context"
	"fmt"
	"runtime/debug"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// nodeTimeout: the scheduler gives the allocator this long per node (DRASchedulerFilterTimeout).
const nodeTimeout = 10 * time.Second

// maxReasons: distinct per-node reasons kept for the report.
const maxReasons = 5

// anyNode names the node tried when the input names none (slices for all nodes only).
const anyNode = "(any node)"

const module = "k8s.io/dynamic-resource-allocation"

func moduleVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == module {
				return module + " " + dep.Version
			}
		}
	}
	return module + " (unknown version)"
}

// featureMap: the allocator's feature set by gate name, for the report.
func featureMap() map[string]bool {
	out := map[string]bool{}
	for name := range features().Set() {
		out[name] = true
	}
	return out
}

// classLister serves DeviceClasses the way the scheduler's informer lister does, with the
// same not-found error.
type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// checkNew validates one selector as the API server validates a new object's selector:
// length, compilation in the environment for new expressions, estimated cost.
func checkNew(expression string) string {
	if len(expression) > resourceapi.CELSelectorExpressionMaxLength {
		return fmt.Sprintf("Too long: may not be more than %d bytes (it has %d)",
			resourceapi.CELSelectorExpressionMaxLength, len(expression))
	}
	envType := environment.NewExpressions
	result := cel.GetCompiler(celFeatures()).CompileCELExpression(expression, cel.Options{EnvType: &envType})
	if result.Error != nil {
		return result.Error.Detail
	}
	if result.MaxCost > resourceapi.CELSelectorExpressionMaxCost {
		return "too complex, exceeds cost limit"
	}
	return ""
}

type input struct {
	classes classLister
	slices  []*resourceapi.ResourceSlice
	// allocatedBy: device -> the claim holding it (dedicated allocations only).
	allocatedBy map[structured.DeviceID]string
	state       structured.AllocatedState
	nodes       []*v1.Node
}

func decodeInput(req *request) (*input, error) {
	in := &input{classes: classLister{}, allocatedBy: map[structured.DeviceID]string{}}
	for _, raw := range req.DeviceClasses {
		c, err := decodeClass(raw)
		if err != nil {
			return nil, err
		}
		in.classes[c.Name] = c
	}
	for _, raw := range req.ResourceSlices {
		s, err := decodeSlice(raw)
		if err != nil {
			return nil, err
		}
		in.slices = append(in.slices, s)
	}
	in.state = structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	consumable := features().ConsumableCapacity
	for _, raw := range req.Claims {
		c, err := decodeClaim(raw)
		if err != nil {
			return nil, err
		}
		if c.Status.Allocation == nil {
			continue
		}
		// As the scheduler's claim tracker: adminAccess results hold no device; with
		// consumable capacity, a result with a share ID holds a share and its capacity.
		for _, r := range c.Status.Allocation.Devices.Results {
			if ptr.Deref(r.AdminAccess, false) {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if consumable && r.ShareID != nil {
				in.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					in.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
				continue
			}
			in.state.AllocatedDevices.Insert(id)
			in.allocatedBy[id] = c.Namespace + "/" + c.Name
		}
	}
	for _, n := range req.Nodes {
		node := &v1.Node{}
		node.Name, node.Labels = n.Name, n.Labels
		in.nodes = append(in.nodes, node)
	}
	if len(in.nodes) == 0 {
		names := sets.New[string]()
		for _, s := range in.slices {
			if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
				names.Insert(*s.Spec.NodeName)
			}
			for _, d := range s.Spec.Devices {
				if d.NodeName != nil && *d.NodeName != "" {
					names.Insert(*d.NodeName)
				}
			}
		}
		for _, name := range sets.List(names) {
			node := &v1.Node{}
			node.Name = name
			in.nodes = append(in.nodes, node)
		}
	}
	if len(in.nodes) == 0 && len(in.slices) > 0 {
		// Only slices for all nodes (or a node selector) and no Node objects: any node.
		node := &v1.Node{}
		node.Name = anyNode
		in.nodes = append(in.nodes, node)
	}
	return in, nil
}

func run(req *request) response {
	resp := response{Release: release, Module: moduleVersion(), Features: featureMap()}
	for _, e := range req.Checks {
		resp.Checks = append(resp.Checks, compileError{Expression: e, Error: checkNew(e)})
	}
	if len(req.Templates) == 0 && len(req.ResourceSlices) == 0 {
		return resp
	}
	in, err := decodeInput(req)
	if err != nil {
		resp.Error = err.Error()
		return resp
	}
	view := newClusterView(in)
	resp.Inventory = view.inventory()
	claims := make([]*resourceapi.ResourceClaim, len(req.Templates))
	names := make([]string, len(req.Templates))
	for i, raw := range req.Templates {
		claims[i], names[i], err = decodeUnderTest(raw, i)
		if err != nil {
			resp.Error = err.Error()
			return resp
		}
	}
	cache := cel.NewCache(1000, celFeatures())
	resp.CompileErrors = compileAll(cache, in.classes, claims)
	if len(resp.CompileErrors) > 0 {
		return resp
	}
	ctx := context.Background()
	allocator, err := structured.NewAllocator(ctx, features(), in.state, in.classes, in.slices, cache)
	if err != nil {
		resp.Error = err.Error()
		return resp
	}
	for i, claim := range claims {
		res := allocate(ctx, allocator, in.nodes, claim)
		res.Template = names[i]
		res.Requests = view.report(ctx, cache, claim)
		resp.Results = append(resp.Results, res)
	}
	return resp
}

// compileAll compiles every selector the allocator will evaluate, as it compiles them (the
// cache's environment for stored expressions), so a broken selector is reported up front and
// by expression rather than as the first device it fails on.
func compileAll(cache *cel.Cache, classes classLister, claims []*resourceapi.ResourceClaim) []compileError {
	var out []compileError
	seen := sets.New[string]()
	add := func(where string, selectors []resourceapi.DeviceSelector) {
		for i, s := range selectors {
			if s.CEL == nil || seen.Has(s.CEL.Expression) {
				continue
			}
			seen.Insert(s.CEL.Expression)
			if r := cache.GetOrCompile(s.CEL.Expression); r.Error != nil {
				out = append(out, compileError{Expression: s.CEL.Expression,
					Where: fmt.Sprintf("%s, selector #%d", where, i), Error: r.Error.Detail})
			}
		}
	}
	names := make([]string, 0, len(classes))
	for name := range classes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		add("DeviceClass "+name, classes[name].Spec.Selectors)
	}
	for _, c := range claims {
		for _, r := range c.Spec.Devices.Requests {
			if r.Exactly != nil {
				add("request "+r.Name, r.Exactly.Selectors)
			}
			for _, sub := range r.FirstAvailable {
				add("request "+r.Name+"/"+sub.Name, sub.Selectors)
			}
		}
	}
	return out
}

// noAllocation is what kube-scheduler's DRA plugin reports for a node where the allocator found
// no devices for the claim and no error (its Filter's "cannot allocate all claims"), so that the
// reason preflight gives is the one a Pending pod's PodScheduled condition then shows.
const noAllocation = "cannot allocate all claims"

// allocate tries the nodes in order, as the scheduler's Filter does for each node, and stops
// at the first node that can serve the claim.
func allocate(ctx context.Context, a structured.Allocator, nodes []*v1.Node,
	claim *resourceapi.ResourceClaim) result {
	res := result{}
	reasons := sets.New[string]()
	for _, node := range nodes {
		res.NodesTried++
		nctx, cancel := context.WithTimeout(ctx, nodeTimeout)
		out, err := a.Allocate(nctx, node, []*resourceapi.ResourceClaim{claim})
		cancel()
		reason := ""
		switch {
		case nodeFailure(err):
			reason = err.Error()
		case err != nil:
			res.Error = err.Error()
			return res
		case len(out) == 1:
			res.Allocatable, res.Node = true, node.Name
			for _, r := range out[0].Devices.Results {
				res.Devices = append(res.Devices, allocated{Request: r.Request, Driver: r.Driver,
					Pool: r.Pool, Device: r.Device, AdminAccess: ptr.Deref(r.AdminAccess, false)})
			}
			return res
		default:
			reason = noAllocation
		}
		if reasons.Len() < maxReasons && !reasons.Has(reason) {
			res.Unschedulable = append(res.Unschedulable, fmt.Sprintf("node %s: %s", node.Name, reason))
		}
		reasons.Insert(reason)
	}
	return res
}
