"""The trainjob component's pure parts: the TrainJob name, ``draslice train``'s options from the
knobs (checked by the config first), how an ended TrainJob reads; and its inputs against the
knobs' declaration. Creating and waiting run against the real API server
(tests/realcluster/test_trainjob_launch.py)."""

from __future__ import annotations

import inspect

import pytest

from draslice.cluster.manifests.workloads import MAX_TRAINJOB_NAME
from draslice.components.trainjob import trainjob
from draslice.components.trainjob.component import NOT_KNOBS
from draslice.components.trainjob.launch import condition, job_name, train_args
from draslice.errors import InvalidParameter
from draslice.trainer.config import KNOBS, VERDICT_KNOBS
from draslice.trainer.presets import FINETUNE


def test_job_name_is_a_short_stable_dns_label():
    name = job_name("3F2a_9c1e-UUID-of-a-very-long-kfp-run-0123456789")
    assert name == job_name("3F2a_9c1e-UUID-of-a-very-long-kfp-run-0123456789")
    assert len(name) <= MAX_TRAINJOB_NAME and name.startswith("draslice-3f2a-9c1e-")
    assert name != job_name("3F2a_9c1e-UUID-of-a-very-long-kfp-run-other")
    with pytest.raises(InvalidParameter, match="run_id"):
        job_name("")


def test_train_args_are_what_draslice_train_parses():
    args = train_args({"steps": 5, "lora_r": 4, "pack": True, "bf16_weights": False,
                       "learning_rate": 2e-4, "model_dir": "/data/m", "data": "/data/t.jsonl",
                       "seed": 0}, "/data/out")
    # bf16_weights False is the config's default but not the finetune preset's, which
    # `draslice train` would start from: it is passed
    assert args == ["--output-dir", "/data/out", "--steps", "5", "--lora-r", "4", "--pack",
                    "--no-bf16-weights", "--learning-rate", "0.0002", "--model-dir", "/data/m",
                    "--data", "/data/t.jsonl"]
    # `draslice train` parses them back into the same values (without running).
    from draslice.cli.commands.steps_cmd import train

    params = train.make_context("train", list(args)).params
    assert (params["output_dir"], params["steps"], params["lora_r"], params["pack"],
            params["learning_rate"], params["bf16_weights"]) == ("/data/out", 5, 4, True, 2e-4,
                                                                 False)


def test_a_bad_knob_fails_before_any_trainjob():
    with pytest.raises(InvalidParameter, match="invalid lora_r=0"):
        train_args({"lora_r": 0}, "/data/out")


@pytest.mark.parametrize(("conditions", "ended"), [
    ([], None),
    ([{"type": "Suspended", "status": "True"}], None),
    ([{"type": "Complete", "status": "False"}], None),
    ([{"type": "Complete", "status": "True", "message": "done"}], ("Complete", "done")),
    ([{"type": "Failed", "status": "True", "reason": "BackoffLimit"}],
     ("Failed", "BackoffLimit")),
])
def test_condition(conditions, ended):
    assert condition({"status": {"conditions": conditions}}) == ended


def test_inputs_are_the_finetune_presets_knobs_with_the_configs_defaults():
    params = inspect.signature(trainjob.python_func).parameters
    knobs = set(FINETUNE.exposed) - set(VERDICT_KNOBS)
    assert set(params) == knobs | set(NOT_KNOBS)
    for name in knobs:
        assert params[name].annotation is KNOBS[name].type, name
        assert params[name].default == KNOBS[name].default, name
        assert KNOBS[name].help in trainjob.component_spec.inputs[name].description, name
