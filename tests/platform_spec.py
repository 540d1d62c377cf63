"""Strict parsing of compiled pipelines, including native mode's upstream field: how the tests
check that compiled/ holds only what KFP's protos (released, or upstream's for native mode)
accept. Nothing in the package needs it, so it lives with the tests.

The released ``KubernetesExecutorConfig`` proto (kfp-kubernetes 2.17) has no
``pod_resource_claims``. Upstream (kubeflow/pipelines#14243) adds
``repeated PodResourceClaim pod_resource_claims = 20`` with
``PodResourceClaim{string resource_claim_template_name = 1;
ml_pipelines.TaskInputsSpec.InputParameterSpec resource_claim_json = 2}`` (field 2 is a
parameter, constant or from a pipeline input, like the other ``*_json`` fields of that proto,
so a bare string there is refused as it would be upstream).
:func:`executor_config_class` builds that message from the released descriptor plus exactly
this field, so native-mode YAML is parsed against the upstream shape, and anything else
unknown still fails.
"""

from __future__ import annotations

from functools import cache

import yaml
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from kfp.kubernetes import kubernetes_executor_config_pb2 as released
from kfp.pipeline_spec import pipeline_spec_pb2

from draslice.cluster.names import NATIVE_FIELD

_PACKAGE = "draslice.upstream"
# The message that upstream's other ``*_json`` fields (toleration_json, node_selector_json) use.
_INPUT_PARAMETER_SPEC = f".{pipeline_spec_pb2.DESCRIPTOR.package}.TaskInputsSpec.InputParameterSpec"


@cache
def executor_config_class(with_pod_resource_claims: bool) -> type:
    """``KubernetesExecutorConfig``, optionally extended by upstream's field 20."""
    if not with_pod_resource_claims:
        return released.KubernetesExecutorConfig
    source = descriptor_pb2.FileDescriptorProto()
    released.DESCRIPTOR.CopyToProto(source)
    source.name = "draslice/upstream_kubernetes_executor_config.proto"
    source.package = _PACKAGE
    # Re-point type references from the released package to ours.
    old = f".{released.DESCRIPTOR.package}."
    for msg in source.message_type:
        _retarget(msg, old, f".{_PACKAGE}.")
    claim = source.message_type.add(name="PodResourceClaim")
    claim.field.add(
        name="resource_claim_template_name", number=1, json_name="resourceClaimTemplateName",
        type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    claim.field.add(
        name="resource_claim_json", number=2, json_name="resourceClaimJson",
        type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE, type_name=_INPUT_PARAMETER_SPEC,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    config = next(m for m in source.message_type if m.name == "KubernetesExecutorConfig")
    config.field.add(
        name="pod_resource_claims", number=20, json_name=NATIVE_FIELD,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        type_name=f".{_PACKAGE}.PodResourceClaim",
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    for dep in released.DESCRIPTOR.dependencies:
        _add_with_deps(pool, dep)
    pool.Add(source)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{_PACKAGE}.KubernetesExecutorConfig")
    )


def _retarget(msg: descriptor_pb2.DescriptorProto, old: str, new: str) -> None:
    for f in msg.field:
        if f.type_name.startswith(old):
            f.type_name = new + f.type_name[len(old):]
    for nested in msg.nested_type:
        _retarget(nested, old, new)


def _add_with_deps(pool: descriptor_pool.DescriptorPool, file_desc) -> None:
    for dep in file_desc.dependencies:
        _add_with_deps(pool, dep)
    try:
        pool.FindFileByName(file_desc.name)
    except KeyError:
        proto = descriptor_pb2.FileDescriptorProto()
        file_desc.CopyToProto(proto)
        pool.Add(proto)


def load_documents(text: str) -> tuple[dict, dict]:
    """(pipeline spec, platform spec) of a compiled pipeline YAML."""
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    return docs[0], (docs[1] if len(docs) > 1 else {})


def parse_strict(text: str, native: bool) -> tuple[pipeline_spec_pb2.PipelineSpec, dict]:
    """Parse a compiled pipeline strictly; return the spec and each executor's config.

    Raises ``google.protobuf.json_format.ParseError`` on any field the protos do not know.
    """
    spec_dict, platform = load_documents(text)
    spec = json_format.ParseDict(spec_dict, pipeline_spec_pb2.PipelineSpec())
    config_cls = executor_config_class(native)
    executors = (
        platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {})
        .get("executors", {})
    )
    configs = {name: json_format.ParseDict(raw, config_cls()) for name, raw in executors.items()}
    return spec, configs
