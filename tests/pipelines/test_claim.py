"""The claim binding and the template-name rule."""

from __future__ import annotations

import pytest
from kfp import dsl

from draslice.cluster.names import validate_template_name
from draslice.components.smoke import smoke
from draslice.errors import InvalidParameter
from draslice.pipelines.canary import pipeline as canary
from draslice.pipelines.claim import CLAIM_LABEL, NATIVE_FIELD, ClaimMode, bind_claim
from draslice.pipelines.demo import pipeline as demo


@pytest.mark.parametrize("name", ["mig-1g-6gb", "shared-gpu-timeslice", "a", "gpu-slice-2",
                                  "x" * 63])
def test_valid_template_names(name):
    assert validate_template_name(name) == name


@pytest.mark.parametrize(
    ("name", "why"),
    [("", "non-empty"), ("Mig-1g", "DNS-1123"), ("mig_1g", "DNS-1123"), ("-mig", "DNS-1123"),
     ("mig-", "DNS-1123"), ("1g.6gb/x", "DNS-1123"), ("gpu.slice", "no dots"),
     ("x" * 64, "at most 63")],
)
def test_invalid_template_names_say_what_is_valid(name, why):
    with pytest.raises(InvalidParameter, match=why) as err:
        validate_template_name(name)
    assert err.value.name == "claim_template"


def _task():
    captured = {}

    @dsl.pipeline(name="t")
    def p():
        captured["task"] = smoke(device="cpu")

    return captured["task"]


def test_policy_mode_is_a_pod_label():
    task = bind_claim(_task(), "mig-1g-6gb", "policy")
    assert task.platform_config["kubernetes"]["podMetadata"]["labels"] == {
        CLAIM_LABEL: "mig-1g-6gb"}


def test_native_mode_is_the_upstream_field_once():
    task = bind_claim(_task(), "mig-1g-6gb", ClaimMode.NATIVE)
    bind_claim(task, "mig-1g-6gb", ClaimMode.NATIVE)
    assert task.platform_config["kubernetes"][NATIVE_FIELD] == [
        {"resourceClaimTemplateName": "mig-1g-6gb"}]
    assert "podMetadata" not in task.platform_config["kubernetes"]


def test_bad_mode_and_bad_template_fail_at_compile_time():
    with pytest.raises(InvalidParameter, match="'policy'.*'native'"):
        bind_claim(_task(), "mig-1g-6gb", "annotation")
    with pytest.raises(InvalidParameter, match="claim_template"):
        demo.build("MIG_1g")
    with pytest.raises(InvalidParameter, match="claim_template"):
        canary.build("x" * 64)
