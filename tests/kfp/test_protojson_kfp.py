"""Every compiled file parsed as KFP's Argo compiler parses it, by the Go library it calls.

KFP's compiler reads each executor's Kubernetes config with Go's ``protojson.Unmarshal``
(strict) into ``KubernetesExecutorConfig``. KFP's own module cannot be fetched here
(docs/kfp.md), so ``protojsoncheck/`` links google.golang.org/protobuf v1.36.12 (the release
KFP's go.mod pins) and builds the message from a descriptor set: the released kfp-kubernetes
2.17.3 one (what a 2.17 backend compiles with), or that one plus upstream's field 20
(kubeflow/pipelines#14243, ``tests/platform_spec.py``). Marker ``kfp``: ``make test-kfp``.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from kfp.kubernetes import kubernetes_executor_config_pb2 as released

from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.variants import GPU_EXECUTORS, VARIANTS
from draslice.tests import platform_spec
from draslice.tests.conftest import REPO
from draslice.tests.kfpserver import kfp_strict

pytestmark = pytest.mark.kfp
HERE = Path(__file__).parent / "protojsoncheck"
COMPILED = REPO / "compiled"
UNKNOWN = re.compile(r'^proto:\s\(line 1:\d+\): unknown field "podResourceClaims"$')


@pytest.fixture(scope="module")
def protojsoncheck(tmp_path_factory) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go not found: this test links Go's protojson (Go >= 1.26)")
    binary = tmp_path_factory.mktemp("protojsoncheck") / "protojsoncheck"
    subprocess.run([go, "build", "-o", str(binary), "."], cwd=HERE, check=True, timeout=600)
    return binary


def _descriptor_set(file_desc) -> str:
    """``file_desc`` and everything it imports, as base64 of a FileDescriptorSet."""
    out, seen = descriptor_pb2.FileDescriptorSet(), set()

    def add(fd) -> None:
        for dep in fd.dependencies:
            add(dep)
        if fd.name not in seen:
            seen.add(fd.name)
            fd.CopyToProto(out.file.add())

    add(file_desc)
    return base64.b64encode(out.SerializeToString()).decode()


SHAPES = {
    "released": (released.DESCRIPTOR, released.KubernetesExecutorConfig.DESCRIPTOR.full_name),
    "upstream": (platform_spec.executor_config_class(True).DESCRIPTOR.file,
                 platform_spec.executor_config_class(True).DESCRIPTOR.full_name),
}


def go_parse(binary: Path, shape: str, configs: dict[str, dict]) -> dict[str, str]:
    file_desc, message = SHAPES[shape]
    request = {"descriptor_set": _descriptor_set(file_desc), "message": message,
               "configs": {name: json.dumps(cfg, sort_keys=True, separators=(",", ":"))
                           for name, cfg in configs.items()}}
    out = subprocess.run([str(binary)], input=json.dumps(request), capture_output=True,
                         text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def executor_configs(variant) -> dict[str, dict]:
    _, platform = platform_spec.load_documents((COMPILED / variant.filename).read_text())
    configs = (platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {})
               .get("executors", {}))
    assert configs, f"{variant.filename} has no executor configs"
    return configs


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.filename)
def test_every_executor_parses_with_upstreams_proto(protojsoncheck, variant):
    errors = go_parse(protojsoncheck, "upstream", executor_configs(variant))
    assert errors and all(e == "" for e in errors.values()), errors


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.filename)
def test_a_217_backend_parses_policy_mode_and_refuses_native_claims(protojsoncheck, variant):
    configs = executor_configs(variant)
    errors = go_parse(protojsoncheck, "released", configs)
    gpu = set(GPU_EXECUTORS[variant.kind])
    for name, error in errors.items():
        if variant.mode is ClaimMode.NATIVE and name in gpu:
            assert UNKNOWN.match(error), (name, error)
            # The fake server words it as Go does, column included (NBSP aside).
            with pytest.raises(kfp_strict.StrictError) as fake:
                kfp_strict.check_platform_spec(
                    {"platforms": {"kubernetes": {"deploymentSpec": {
                        "executors": {name: configs[name]}}}}})
            assert str(fake.value).endswith(": " + error.replace("\u00a0", " "))
        else:
            assert error == "", (name, error)


def test_resource_claim_json_is_an_input_parameter_in_go_too(protojsoncheck):
    errors = go_parse(protojsoncheck, "upstream", {
        "as-parameter": {"podResourceClaims": [
            {"resourceClaimJson": {"componentInputParameter": "claim"}}]},
        "as-string": {"podResourceClaims": [{"resourceClaimJson": '{"name": "gpu"}'}]},
    })
    assert errors["as-parameter"] == ""
    # A string where protojson wants a message: "syntax error ... unexpected token".
    assert re.match(r"^proto:\ssyntax error \(line 1:\d+\): unexpected token ",
                    errors["as-string"]), errors["as-string"]
