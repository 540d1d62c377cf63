package main

// Objects arrive in whichever version of resource.k8s.io the cluster served or the dump holds.
// The allocator works on resource.k8s.io/v1; older versions are converted here with
// Kubernetes' own conversion functions (k8s.io/dynamic-resource-allocation/api/v1beta1 and
// v1beta2, the code the allocator's own helpers use), so draslice never re-implements a
// version change. v1alpha3 ResourceSlices are not served by any release we support and have no
// converter here: draslice rewrites them to v1beta1 in Python (cluster/resources.py) first.

import (
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	draapiv1beta1 "k8s.io/dynamic-resource-allocation/api/v1beta1"
	draapiv1beta2 "k8s.io/dynamic-resource-allocation/api/v1beta2"
)

type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

func (h header) String() string {
	name := h.Metadata.Name
	if h.Metadata.Namespace != "" {
		name = h.Metadata.Namespace + "/" + name
	}
	return fmt.Sprintf("%s %s (%s)", h.Kind, name, h.APIVersion)
}

func readHeader(raw json.RawMessage) (header, error) {
	var h header
	if err := json.Unmarshal(raw, &h); err != nil {
		return h, fmt.Errorf("not a Kubernetes object: %w", err)
	}
	return h, nil
}

// typed is what every Kubernetes object type has: apiVersion, kind and metadata.
type typed interface {
	GetObjectKind() schema.ObjectKind
	GetName() string
	GetNamespace() string
}

// decode reads one object of the given v1 type from any served version. The v1 object is
// decoded first (one pass over the JSON, the common case); another version is decoded again
// into its own type and converted.
func decode[V1 any, B1 any, B2 any, PV1 interface {
	*V1
	typed
}](raw json.RawMessage, want string, c1 func(*B1, *V1) error, c2 func(*B2, *V1) error) (*V1, header, error) {
	out := PV1(new(V1))
	err := json.Unmarshal(raw, out)
	gvk := out.GetObjectKind().GroupVersionKind()
	h := header{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind}
	h.Metadata.Name, h.Metadata.Namespace = out.GetName(), out.GetNamespace()
	if err != nil && h.Kind == "" {
		if h2, herr := readHeader(raw); herr == nil {
			h = h2
		} else {
			return nil, h, herr
		}
	}
	if h.Kind != want {
		return nil, h, fmt.Errorf("%s: expected kind %s", h, want)
	}
	switch h.APIVersion {
	case "resource.k8s.io/v1", "":
	case "resource.k8s.io/v1beta1":
		in := new(B1)
		out = PV1(new(V1))
		if err = json.Unmarshal(raw, in); err == nil {
			err = c1(in, out)
		}
	case "resource.k8s.io/v1beta2":
		in := new(B2)
		out = PV1(new(V1))
		if err = json.Unmarshal(raw, in); err == nil {
			err = c2(in, out)
		}
	default:
		return nil, h, fmt.Errorf("%s: apiVersion %q is not one this allocator reads "+
			"(resource.k8s.io/v1, v1beta2, v1beta1)", h, h.APIVersion)
	}
	if err != nil {
		return nil, h, fmt.Errorf("%s: %w", h, err)
	}
	return out, h, nil
}

func decodeSlice(raw json.RawMessage) (*resourceapi.ResourceSlice, error) {
	s, _, err := decode(raw, "ResourceSlice",
		func(in *resourcev1beta1.ResourceSlice, out *resourceapi.ResourceSlice) error {
			return draapiv1beta1.Convert_v1beta1_ResourceSlice_To_v1_ResourceSlice(in, out, nil)
		},
		func(in *resourcev1beta2.ResourceSlice, out *resourceapi.ResourceSlice) error {
			return draapiv1beta2.Convert_v1beta2_ResourceSlice_To_v1_ResourceSlice(in, out, nil)
		})
	return s, err
}

func decodeClass(raw json.RawMessage) (*resourceapi.DeviceClass, error) {
	c, _, err := decode(raw, "DeviceClass",
		func(in *resourcev1beta1.DeviceClass, out *resourceapi.DeviceClass) error {
			return draapiv1beta1.Convert_v1beta1_DeviceClass_To_v1_DeviceClass(in, out, nil)
		},
		func(in *resourcev1beta2.DeviceClass, out *resourceapi.DeviceClass) error {
			return draapiv1beta2.Convert_v1beta2_DeviceClass_To_v1_DeviceClass(in, out, nil)
		})
	return c, err
}

func decodeClaim(raw json.RawMessage) (*resourceapi.ResourceClaim, error) {
	c, _, err := decode(raw, "ResourceClaim",
		func(in *resourcev1beta1.ResourceClaim, out *resourceapi.ResourceClaim) error {
			return draapiv1beta1.Convert_v1beta1_ResourceClaim_To_v1_ResourceClaim(in, out, nil)
		},
		func(in *resourcev1beta2.ResourceClaim, out *resourceapi.ResourceClaim) error {
			return draapiv1beta2.Convert_v1beta2_ResourceClaim_To_v1_ResourceClaim(in, out, nil)
		})
	return c, err
}

// decodeUnderTest turns a ResourceClaimTemplate (or a ResourceClaim) into the claim the
// resourceclaim controller would create from it: same spec, no status.
func decodeUnderTest(raw json.RawMessage, index int) (*resourceapi.ResourceClaim, string, error) {
	h, err := readHeader(raw)
	if err != nil {
		return nil, "", err
	}
	name := h.Metadata.Name
	var claim *resourceapi.ResourceClaim
	switch h.Kind {
	case "ResourceClaim":
		claim, err = decodeClaim(raw)
		if err == nil {
			claim.Status = resourceapi.ResourceClaimStatus{}
		}
	case "ResourceClaimTemplate":
		var t *resourceapi.ResourceClaimTemplate
		t, _, err = decode(raw, "ResourceClaimTemplate",
			func(in *resourcev1beta1.ResourceClaimTemplate, out *resourceapi.ResourceClaimTemplate) error {
				return draapiv1beta1.Convert_v1beta1_ResourceClaimTemplate_To_v1_ResourceClaimTemplate(in, out, nil)
			},
			func(in *resourcev1beta2.ResourceClaimTemplate, out *resourceapi.ResourceClaimTemplate) error {
				return draapiv1beta2.Convert_v1beta2_ResourceClaimTemplate_To_v1_ResourceClaimTemplate(in, out, nil)
			})
		if err == nil {
			claim = &resourceapi.ResourceClaim{Spec: t.Spec.Spec}
			claim.Name = name
			claim.Namespace = t.Namespace
		}
	default:
		return nil, name, fmt.Errorf("%s: expected a ResourceClaimTemplate or a ResourceClaim", h)
	}
	if err != nil {
		return nil, name, err
	}
	if claim.Namespace == "" {
		claim.Namespace = "default"
	}
	applyDefaults(claim)
	claim.UID = types.UID("draslice-preflight-" + fmt.Sprint(index))
	return claim, name, nil
}

// applyDefaults sets what the API server's defaulting sets on every stored claim (allocation
// mode ExactCount, count 1), which a template read from a file or trimmed dump may lack.
func applyDefaults(claim *resourceapi.ResourceClaim) {
	exact := func(mode *resourceapi.DeviceAllocationMode, count *int64) {
		if *mode == "" {
			*mode = resourceapi.DeviceAllocationModeExactCount
		}
		if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
			*count = 1
		}
	}
	for i := range claim.Spec.Devices.Requests {
		r := &claim.Spec.Devices.Requests[i]
		if r.Exactly != nil {
			exact(&r.Exactly.AllocationMode, &r.Exactly.Count)
		}
		for j := range r.FirstAvailable {
			exact(&r.FirstAvailable[j].AllocationMode, &r.FirstAvailable[j].Count)
		}
	}
}
