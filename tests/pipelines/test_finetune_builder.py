"""The one finetune builder: model from the volume or a Model artifact x run as a task or as a
TrainJob, each compiled choice under its own kind, and the choice it cannot build refused."""

from __future__ import annotations

import pytest

from draslice.errors import InvalidParameter
from draslice.pipelines.finetune import pipeline as finetune
from draslice.pipelines.variants import PIPELINES, Builders


@pytest.mark.parametrize("kind", sorted(finetune.KINDS))
def test_each_kind_is_the_builders_choice_and_names_the_pipeline(kind):
    choice = finetune.KINDS[kind]
    assert finetune.kind_of(**choice) == kind
    built = PIPELINES[kind]("mig-1g-6gb")
    assert built.name == f"draslice-{kind}-mig-1g-6gb"
    assert built.component_spec.inputs.keys() >= set(finetune.knobs_of(**choice))


def test_a_trainjob_with_an_artifact_model_is_refused_before_any_pipeline():
    with pytest.raises(InvalidParameter, match="invalid model='artifact': must be 'volume' "
                                               "with runner 'trainjob'"):
        finetune.build(model="artifact", runner="trainjob")


@pytest.mark.parametrize(("choice", "message"), [
    ({"model": "hub"}, "invalid model='hub': must be one of volume, artifact"),
    ({"runner": "job"}, "invalid runner='job': must be one of task, trainjob"),
])
def test_an_unknown_choice_names_the_field_and_the_valid_ones(choice, message):
    with pytest.raises(InvalidParameter, match=message):
        finetune.build(**choice)


def test_the_artifact_model_is_a_required_parameter_and_the_trainjob_has_no_verdict_knobs():
    artifact = finetune.signature("artifact", "task").parameters
    assert artifact["base_model_uri"].default is artifact["base_model_uri"].empty
    assert "model_dir" not in artifact
    trainjob = finetune.signature("volume", "trainjob").parameters
    assert {"num_nodes", "num_proc_per_node", "timeout_minutes"} <= set(trainjob)
    assert "min_loss_drop" not in trainjob and "memory_headroom" not in trainjob


def test_a_kind_listed_under_a_module_that_does_not_build_it_fails_on_first_use():
    wrong = Builders({"finetune-lora": "finetune"})
    with pytest.raises(RuntimeError, match="builds finetune, finetune-artifact, "
                                           "finetune-trainjob, not 'finetune-lora'"):
        wrong["finetune-lora"]
