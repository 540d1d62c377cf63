// Command protojsoncheck parses executor configs the way KFP's Argo compiler does.
//
// KFP's compiler (backend/src/v2/compiler/argocompiler) reads each executor's Kubernetes
// config with google.golang.org/protobuf's protojson.Unmarshal into KubernetesExecutorConfig,
// strictly (no DiscardUnknown). KFP's backend cannot be fetched here (docs/kfp.md), so this
// links the same protobuf release KFP's go.mod pins and builds the message from a descriptor
// set given on stdin: {"descriptor_set": <base64 FileDescriptorSet>, "message": <full name>,
// "configs": {<executor>: <JSON text>}}. It answers {<executor>: <protojson's error or "">}.
package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

type request struct {
	DescriptorSet string            `json:"descriptor_set"`
	Message       string            `json:"message"`
	Configs       map[string]string `json:"configs"`
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "protojsoncheck: "+format+"\n", args...)
	os.Exit(code)
}

func main() {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fail(2, "bad input: %v", err)
	}
	raw, err := base64.StdEncoding.DecodeString(req.DescriptorSet)
	if err != nil {
		fail(2, "descriptor_set: %v", err)
	}
	set := &descriptorpb.FileDescriptorSet{}
	if err := proto.Unmarshal(raw, set); err != nil {
		fail(2, "descriptor_set: %v", err)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		fail(2, "descriptor_set: %v", err)
	}
	desc, err := files.FindDescriptorByName(protoreflect.FullName(req.Message))
	if err != nil {
		fail(2, "message %q: %v", req.Message, err)
	}
	msg, ok := desc.(protoreflect.MessageDescriptor)
	if !ok {
		fail(2, "%q is not a message", req.Message)
	}
	out := make(map[string]string, len(req.Configs))
	for name, text := range req.Configs {
		out[name] = ""
		if err := protojson.Unmarshal([]byte(text), dynamicpb.NewMessage(msg)); err != nil {
			out[name] = err.Error()
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(1, "%v", err)
	}
}
