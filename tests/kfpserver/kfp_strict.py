"""Strict parsing of KFP REST bodies against the ``kfp-server-api`` models.

The generated client's own deserializer ignores unknown keys and never checks types; a fake
server that used it would accept bodies the real API server rejects. This walks the model's
``openapi_types``/``attribute_map`` and refuses unknown keys, wrong JSON types, enum values
outside ``allowable_values`` and unparsable timestamps, naming the JSON path.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

import kfp_server_api
from google.protobuf import json_format
from kfp.kubernetes import kubernetes_executor_config_pb2
from kfp.pipeline_spec import pipeline_spec_pb2

# int64 fields: protojson (the real server) takes them as JSON numbers or strings, the
# swagger models type them 'str'.
INT64_FIELDS = {"max_concurrency", "interval_second", "total_size"}


class StrictError(ValueError):
    """A body that the real KFP API server would not take."""


def _model(name: str):
    cls = getattr(kfp_server_api.models, name, None)
    if cls is None:
        raise StrictError(f"unknown model {name}")
    return cls


def check(data, typ: str, where: str = "$", field: str = "") -> None:
    """Raise :class:`StrictError` unless ``data`` is a valid JSON value of swagger type ``typ``."""
    if data is None:
        return
    m = re.match(r"list\[(.*)\]$", typ)
    if m:
        if not isinstance(data, list):
            raise StrictError(f"{where}: expected a list, got {type(data).__name__}")
        for i, item in enumerate(data):
            check(item, m.group(1), f"{where}[{i}]", field)
        return
    m = re.match(r"dict\(([^,]*), (.*)\)$", typ)
    if m:
        if not isinstance(data, dict):
            raise StrictError(f"{where}: expected an object, got {type(data).__name__}")
        for k, v in data.items():
            check(v, m.group(2), f"{where}.{k}", field)
        return
    if typ == "str":
        if isinstance(data, str) or (field in INT64_FIELDS and isinstance(data, int)
                                     and not isinstance(data, bool)):
            return
        raise StrictError(f"{where}: expected a string, got {type(data).__name__}")
    if typ == "int":
        if isinstance(data, int) and not isinstance(data, bool):
            return
        raise StrictError(f"{where}: expected an integer, got {type(data).__name__}")
    if typ == "bool":
        if isinstance(data, bool):
            return
        raise StrictError(f"{where}: expected a boolean, got {type(data).__name__}")
    if typ == "float":
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return
        raise StrictError(f"{where}: expected a number")
    if typ == "object":
        return
    if typ == "datetime":
        try:
            datetime.fromisoformat(str(data).replace("Z", "+00:00"))
        except ValueError:
            raise StrictError(f"{where}: {data!r} is not an RFC 3339 time") from None
        return
    cls = _model(typ)
    allowed = getattr(cls, "allowable_values", None)
    if allowed is not None:
        if data not in allowed:
            raise StrictError(f"{where}: {data!r} is not one of {allowed}")
        return
    if not cls.openapi_types:
        return  # e.g. protobufAny: free-form
    if not isinstance(data, dict):
        raise StrictError(f"{where}: expected a {typ} object, got {type(data).__name__}")
    by_json = {j: a for a, j in cls.attribute_map.items()}
    for key, value in data.items():
        if key not in by_json:
            raise StrictError(f"{where}: unknown field {key!r} for {typ}")
        attr = by_json[key]
        check(value, cls.openapi_types[attr], f"{where}.{key}", attr)


def parse(data, typ: str):
    """``data`` checked strictly, then built into the model (which runs its validators)."""
    check(data, typ)
    client = kfp_server_api.ApiClient()
    return client._ApiClient__deserialize(data, typ)


def split_spec(spec: dict) -> tuple[dict, dict]:
    """(pipeline spec, platform spec) of a run's or version's ``pipeline_spec`` object."""
    if "pipeline_spec" in spec:
        return spec["pipeline_spec"], spec.get("platform_spec") or {}
    return spec, {}


def check_pipeline_spec(spec: dict) -> None:
    """Strict protojson parse of a PipelineSpec, as the API server does on upload."""
    try:
        json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
    except json_format.ParseError as err:
        raise StrictError(f"invalid pipeline spec: {err}") from None


def executor_config_error(platform: dict, executor: str) -> str | None:
    """What a KFP 2.17 backend says when it parses ``executor``'s Kubernetes config into the
    released ``KubernetesExecutorConfig`` while compiling a run, or None when it parses.

    An unknown field is Go protojson's own error, its form measured by running Go's protojson
    on the released descriptor and observed from a real 2.17.0 server (a plain space after
    ``proto:``): ``proto: (line 1:C): unknown field "podResourceClaims"``. Go's column counts
    in its own JSON encoding, which adds a random space now and then, so C may be one more
    than the compact JSON position used here. Other errors are Python protobuf's words."""
    executors = (platform.get("platforms", {}).get("kubernetes", {})
                 .get("deploymentSpec", {}).get("executors", {}))
    cfg = executors.get(executor)
    if cfg is None:
        return None
    config = kubernetes_executor_config_pb2.KubernetesExecutorConfig.DESCRIPTOR
    known = set(config.fields_by_camelcase_name) | set(config.fields_by_name)
    unknown = sorted(key for key in cfg if key not in known)
    if unknown:
        text = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
        column = text.index(json.dumps(unknown[0])) + 1
        return f'proto: (line 1:{column}): unknown field "{unknown[0]}"'
    try:
        json_format.ParseDict(cfg, kubernetes_executor_config_pb2.KubernetesExecutorConfig())
    except json_format.ParseError as err:
        return f"proto: {err}"
    return None


def check_platform_spec(platform: dict) -> None:
    """The platform spec parses, and every executor's Kubernetes config parses as a KFP 2.17
    backend parses it (:func:`executor_config_error`, after the words of KFP's Argo compiler
    around it: ``failed to unmarshal kubernetes config``)."""
    try:
        json_format.ParseDict(platform, pipeline_spec_pb2.PlatformSpec())
    except json_format.ParseError as err:
        raise StrictError(str(err)) from None
    executors = (platform.get("platforms", {}).get("kubernetes", {})
                 .get("deploymentSpec", {}).get("executors", {}))
    for name in executors:
        problem = executor_config_error(platform, name)
        if problem:
            raise StrictError(f"error creating executor for {json.dumps(name)}: failed to "
                              f"unmarshal kubernetes config: {problem}")
