package main

import "encoding/json"

// request is what draslice sends: Kubernetes objects as the API server returns them (any
// served version of resource.k8s.io), plus the nodes to try.
type request struct {
	DeviceClasses  []json.RawMessage `json:"deviceClasses"`
	ResourceSlices []json.RawMessage `json:"resourceSlices"`
	// Claims already in the cluster: their status.allocation marks devices as in use.
	Claims []json.RawMessage `json:"claims"`
	// Templates (ResourceClaimTemplates or ResourceClaims) under test, each decided alone
	// against the same cluster state.
	Templates []json.RawMessage `json:"templates"`
	// Nodes to try, in order. Empty: every node a ResourceSlice names.
	Nodes []nodeInput `json:"nodes"`
	// Checks: CEL selector expressions to validate as the API server validates a new object.
	Checks []string `json:"checks"`
}

type nodeInput struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
}

type response struct {
	Release  string          `json:"release"`
	Module   string          `json:"module"`
	Features map[string]bool `json:"features,omitempty"`
	// Error: the input as a whole was refused (an object that does not decode, or the
	// allocator refusing the cluster state). Verbatim, naming the object.
	Error string `json:"error,omitempty"`
	// CompileErrors: every selector (classes and templates) that does not compile.
	CompileErrors []compileError `json:"compileErrors,omitempty"`
	Checks        []compileError `json:"checks,omitempty"`
	// Inventory: every device of the newest generation of each pool, with its state.
	Inventory []deviceReport `json:"inventory,omitempty"`
	Results   []result       `json:"results,omitempty"`
}

type compileError struct {
	Expression string `json:"expression"`
	Where      string `json:"where,omitempty"`
	Error      string `json:"error,omitempty"`
}

type result struct {
	Template    string `json:"template"`
	Allocatable bool   `json:"allocatable"`
	Node        string `json:"node,omitempty"`
	// Devices: the allocation result on Node.
	Devices []allocated `json:"devices,omitempty"`
	// Error: the allocator stopped with an error (the scheduler would retry the pod and
	// report this message), verbatim.
	Error string `json:"error,omitempty"`
	// Unschedulable: the allocator's distinct reasons for nodes that cannot serve the claim.
	Unschedulable []string        `json:"unschedulable,omitempty"`
	NodesTried    int             `json:"nodesTried"`
	Requests      []requestReport `json:"requests"`
}

type allocated struct {
	Request     string `json:"request"`
	Driver      string `json:"driver"`
	Pool        string `json:"pool"`
	Device      string `json:"device"`
	AdminAccess bool   `json:"adminAccess,omitempty"`
}

type requestReport struct {
	Name        string         `json:"name"`
	Parent      string         `json:"parent,omitempty"` // firstAvailable: the request it belongs to
	DeviceClass string         `json:"deviceClass"`
	Mode        string         `json:"allocationMode"`
	Count       int64          `json:"count"`
	Selectors   []string       `json:"selectors"`
	Matching    int            `json:"matching"`
	Free        int            `json:"free"`
	Errors      []string       `json:"errors"`
	Devices     []deviceReport `json:"devices"`
}

type deviceReport struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
	State  string `json:"state"` // free | taken | tainted | blocked
	Why    string `json:"why,omitempty"`
}
