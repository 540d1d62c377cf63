"""The upstream (kubeflow/pipelines#14243) shape of ``PodResourceClaim`` that native mode parses.

Upstream's ``kubernetes_executor_config.proto`` declares ``resource_claim_json = 2`` as an
``ml_pipelines.TaskInputsSpec.InputParameterSpec`` (a constant or a pipeline input, like
``toleration_json``), not a string. These tests pin that: a string there must fail as it would
in the Go backend's strict ``protojson`` parse, and both parameter forms must parse.
"""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from draslice.tests import platform_spec


def _parse(claim: dict):
    config_cls = platform_spec.executor_config_class(True)
    return json_format.ParseDict({"podResourceClaims": [claim]}, config_cls())


def test_claim_json_from_a_pipeline_input_parses():
    config = _parse({"resourceClaimJson": {"componentInputParameter": "claim_spec"}})
    claim = config.pod_resource_claims[0]
    assert claim.resource_claim_json.component_input_parameter == "claim_spec"
    assert claim.resource_claim_template_name == ""


def test_claim_json_as_a_constant_parses_to_a_struct():
    spec = {"name": "gpu", "resourceClaimTemplateName": "mig-1g-6gb"}
    config = _parse({"resourceClaimJson": {"runtimeValue": {"constant": spec}}})
    constant = config.pod_resource_claims[0].resource_claim_json.runtime_value.constant
    assert json_format.MessageToDict(constant) == spec


def test_claim_json_as_a_bare_string_is_refused():
    with pytest.raises(json_format.ParseError, match="InputParameterSpec"):
        _parse({"resourceClaimJson": '{"name": "gpu"}'})


def test_field_numbers_match_upstream():
    descriptor = platform_spec.executor_config_class(True).DESCRIPTOR
    field = descriptor.fields_by_name["pod_resource_claims"]
    assert field.number == 20
    claim = field.message_type.fields_by_name
    assert claim["resource_claim_template_name"].number == 1
    assert claim["resource_claim_json"].number == 2
    assert claim["resource_claim_json"].message_type.full_name == (
        "ml_pipelines.TaskInputsSpec.InputParameterSpec"
    )
