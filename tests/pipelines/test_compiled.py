"""compiled/: fresh, strictly parseable, and the claim on exactly the GPU executors."""

from __future__ import annotations

import pytest
import yaml
from google.protobuf import json_format

from draslice.pipelines.claim import CLAIM_LABEL, ClaimMode
from draslice.pipelines.variants import GPU_EXECUTORS, VARIANTS, compile_all
from draslice.tests import platform_spec
from draslice.tests.conftest import REPO

COMPILED = REPO / "compiled"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    out = tmp_path_factory.mktemp("compiled")
    compile_all(out)
    return out


def test_compiled_folder_holds_exactly_the_variants():
    assert sorted(p.name for p in COMPILED.glob("*.yaml")) == sorted(v.filename for v in VARIANTS)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.filename)
def test_committed_file_is_not_stale(variant, fresh):
    committed = (COMPILED / variant.filename).read_bytes()
    assert committed == (fresh / variant.filename).read_bytes(), (
        f"compiled/{variant.filename} is stale: run `draslice compile` and commit compiled/"
    )


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.filename)
def test_strict_parse_and_claims_on_exactly_the_gpu_executors(variant):
    text = (COMPILED / variant.filename).read_text()
    native = variant.mode is ClaimMode.NATIVE
    spec, configs = platform_spec.parse_strict(text, native=native)
    executors = set(spec.deployment_spec.fields["executors"].struct_value.fields)
    gpu = set(GPU_EXECUTORS[variant.kind])
    assert gpu <= executors and "exec-preflight" in executors

    claimed = set()
    for name, config in configs.items():
        as_dict = json_format.MessageToDict(config)
        if native:
            claims = as_dict.get("podResourceClaims", [])
            if claims:
                assert claims == [{"resourceClaimTemplateName": variant.template}]
                claimed.add(name)
            assert CLAIM_LABEL not in str(as_dict)
        else:
            labels = as_dict.get("podMetadata", {}).get("labels", {})
            if CLAIM_LABEL in labels:
                assert labels[CLAIM_LABEL] == variant.template
                claimed.add(name)
            assert "podResourceClaims" not in as_dict
    assert claimed == gpu


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.filename)
def test_no_device_plugin_limits_anywhere(variant):
    text = (COMPILED / variant.filename).read_text()
    assert "nvidia.com/gpu" not in text
    for doc in yaml.safe_load_all(text):
        for executor in (doc or {}).get("deploymentSpec", {}).get("executors", {}).values():
            assert "accelerator" not in str(executor.get("container", {}).get("resources", {}))


def test_native_yaml_is_rejected_by_the_released_proto():
    """Proves the strict parse is strict: 2.17's proto does not know podResourceClaims."""
    native = next(v for v in VARIANTS if v.mode is ClaimMode.NATIVE)
    with pytest.raises(json_format.ParseError, match="podResourceClaims"):
        platform_spec.parse_strict((COMPILED / native.filename).read_text(), native=False)


def test_unknown_field_fails_even_with_the_upstream_shape():
    policy = next(v for v in VARIANTS if v.mode is ClaimMode.POLICY and v.kind == "sft")
    text = (COMPILED / policy.filename).read_text().replace("podMetadata:", "podMetaData:", 1)
    with pytest.raises(json_format.ParseError):
        platform_spec.parse_strict(text, native=True)
