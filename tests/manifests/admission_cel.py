"""Runs a MutatingAdmissionPolicy the way the API server does, with Google's CEL runtime.

What the API server adds to plain CEL and the policy uses is provided here, no more:
- the ``JSONPatch`` object type (fields op, path, from, value), declared as a protobuf
  message whose ``value`` is a ``google.protobuf.Value`` (any JSON);
- Kubernetes' list function ``indexOf`` (k8s.io/apiserver/pkg/cel/library/lists.go);
- ``object`` and ``variables`` bound as in admission: match conditions first (no variables),
  then the variables in order (each may use the earlier ones), then the mutations.
The JSON patches the mutation returns are applied with the ``jsonpatch`` library (RFC 6902).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import jsonpatch
from cel_expr_python import cel
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, struct_pb2


def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    struct_file = descriptor_pb2.FileDescriptorProto()
    struct_pb2.DESCRIPTOR.CopyToProto(struct_file)
    pool.Add(struct_file)
    f = descriptor_pb2.FileDescriptorProto(
        name="jsonpatch_test.proto", syntax="proto3", dependency=["google/protobuf/struct.proto"]
    )
    msg = f.message_type.add(name="JSONPatch")
    string = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    for number, name in enumerate(("op", "path", "from"), start=1):
        msg.field.add(name=name, number=number, type=string, label=1)
    msg.field.add(name="value", number=4, label=1,
                  type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                  type_name=".google.protobuf.Value")
    pool.Add(f)
    return pool


def _index_of(items, value) -> int:
    items = list(items)
    return items.index(value) if value in items else -1


def new_env():
    index_of = cel.FunctionDecl("indexOf", [cel.Overload(
        "k8s_list_indexOf", cel.Type.INT, [cel.Type.List(cel.Type.DYN), cel.Type.DYN],
        is_member=True, impl=_index_of)])
    return cel.NewEnv(
        _pool(),
        variables={"object": cel.Type.DYN, "variables": cel.Type.DYN},
        extensions=[cel.CelExtension("k8s_lists", [index_of])],
    )


@dataclass
class Admission:
    matched: bool
    pod: dict
    patches: list[dict]


class PolicyRunner:
    """Compiles a policy's expressions once; :meth:`admit` runs them on a pod."""

    def __init__(self, spec: dict):
        env = new_env()
        self.conditions = [(c["name"], env.compile(c["expression"]))
                           for c in spec.get("matchConditions", [])]
        self.variables = [(v["name"], env.compile(v["expression"])) for v in spec["variables"]]
        self.mutations = [env.compile(m["jsonPatch"]["expression"]) for m in spec["mutations"]]

    def matches(self, pod: dict) -> bool:
        return all(expr.eval(data={"object": pod}).value() is True
                   for _, expr in self.conditions)

    def patches(self, pod: dict) -> list[dict]:
        variables: dict = {}
        for name, expr in self.variables:
            variables[name] = expr.eval(data={"object": pod, "variables": variables}).plain_value()
        out = []
        for expr in self.mutations:
            for item in expr.eval(data={"object": pod, "variables": variables}).plain_value():
                out.append(json_format.MessageToDict(item, preserving_proto_field_name=True))
        return out

    def admit(self, pod: dict) -> Admission:
        if not self.matches(pod):
            return Admission(False, pod, [])
        patches = self.patches(pod)
        mutated = jsonpatch.apply_patch(copy.deepcopy(pod), patches)
        return Admission(True, mutated, patches)
