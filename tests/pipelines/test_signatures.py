"""Component and pipeline signatures derived from the config: a knob's name, type and default
may not drift between the config, a component's inputs and a pipeline's parameters, and each
pipeline parameter that is a knob reaches the task input of the same name."""

from __future__ import annotations

import inspect

import pytest
from google.protobuf import json_format

from draslice.components.finetune import finetune
from draslice.components.finetune.component import NOT_KNOBS as FINETUNE_NOT_KNOBS
from draslice.components.smoke import smoke
from draslice.components.validate import validate
from draslice.components.validate.component import NOT_KNOBS as VALIDATE_NOT_KNOBS
from draslice.errors import InvalidParameter
from draslice.pipelines.variants import PIPELINES
from draslice.trainer.config import FINETUNE_KNOBS, KNOBS, VERDICT_KNOBS
from draslice.trainer.presets import DEMO, FINETUNE

KFP_TYPES = {int: "Integer", float: "Float", bool: "Boolean", str: "String"}
# Pipeline parameters that are not fine-tune knobs: preflight's, the artifact's address, the
# sweep's runs (each run's knobs come from its loop item: tests/pipelines/test_sweep.py), and the
# TrainJob's shape.
PIPELINE_OWN = {"on_missing_dra", "preflight_source", "base_model_uri", "configs", "preset",
                "num_nodes", "num_proc_per_node", "timeout_minutes"}
# kind -> (the knobs it exposes, where their values start)
EXPECTED = {
    "sft": (set(DEMO.exposed), DEMO.default),
    "finetune": (set(FINETUNE.exposed), FINETUNE.default),
    "finetune-artifact": (set(FINETUNE.exposed) - {"model_dir"}, FINETUNE.default),
    "canary": ({"device"}, lambda name: KNOBS[name].default),
    "sweep": (set(), FINETUNE.default),
    # validate's knobs stay out: the TrainJob's outputs are not validated in this pipeline
    "finetune-trainjob": (set(FINETUNE.exposed) - set(VERDICT_KNOBS), FINETUNE.default),
}


def _assert_knob_inputs(component, knob_names, others, default_of) -> None:
    """The component's inputs are exactly the knobs and ``others``; each knob input has the
    knob's type and ``default_of(name)``, in the Python signature and in the KFP spec."""
    params = inspect.signature(component.python_func).parameters
    assert set(params) == set(knob_names) | set(others)
    for name in knob_names:
        knob, spec = KNOBS[name], component.component_spec.inputs[name]
        assert params[name].annotation is knob.type, name
        assert params[name].default == default_of(name), name
        assert spec.type == KFP_TYPES[knob.type] and spec.default == default_of(name), name
        assert knob.help in spec.description, name  # the description is the config's help


def test_finetune_component_takes_every_knob_with_the_configs_default():
    _assert_knob_inputs(finetune, FINETUNE_KNOBS, FINETUNE_NOT_KNOBS,
                        lambda name: KNOBS[name].default)


def test_validate_component_takes_the_verdict_knobs_with_the_configs_default():
    _assert_knob_inputs(validate, VERDICT_KNOBS, VALIDATE_NOT_KNOBS,
                        lambda name: KNOBS[name].default)


def test_smoke_components_device_is_the_knobs():
    params = inspect.signature(smoke.python_func).parameters
    for name in ("device", "slice_memory_gib"):
        assert params[name].default == KNOBS[name].default


def test_the_component_refuses_an_out_of_range_knob_before_any_work(tmp_path):
    from kfp import dsl

    outputs = {name: cls(name=name, uri=str(tmp_path / name), metadata={})
               for name, cls in (("adapter", dsl.Model), ("train_log", dsl.Artifact),
                                 ("metrics", dsl.Metrics))}
    with pytest.raises(InvalidParameter, match="invalid lora_r=0: must be >= 1"):
        finetune.python_func(**outputs, lora_r=0, device="cpu")
    assert not (tmp_path / "adapter").exists()


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_pipeline_parameters_are_its_presets_knobs_with_the_presets_values(kind):
    exposed, default_of = EXPECTED[kind]
    inputs = PIPELINES[kind]().component_spec.inputs
    knobs = {name for name in inputs if name in KNOBS}
    assert knobs == exposed
    assert set(inputs) - knobs <= PIPELINE_OWN
    for name in knobs:
        spec = inputs[name]
        assert spec.type == KFP_TYPES[KNOBS[name].type], name
        assert spec.default == default_of(name), name
        KNOBS[name].check(spec.default)  # and inside the knob's range


def _tasks(spec: dict) -> dict:
    """Every task of the compiled pipeline by name, sub-DAGs (dsl.If) included."""
    tasks = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    return tasks


@pytest.mark.parametrize("kind", sorted(set(PIPELINES) - {"canary"}))
def test_each_knob_parameter_reaches_the_task_input_of_the_same_name(kind):
    pipeline = PIPELINES[kind]()
    tasks = _tasks(json_format.MessageToDict(pipeline.pipeline_spec))
    wired = {}
    for task in ("finetune", "validate", "trainjob"):
        for name, value in tasks.get(task, {}).get("inputs", {}).get("parameters", {}).items():
            source = value.get("componentInputParameter", "")
            if source.startswith("pipelinechannel--"):
                wired[name] = source.removeprefix("pipelinechannel--")
    knobs = {name for name in pipeline.component_spec.inputs if name in KNOBS}
    assert {name: wired.get(name) for name in knobs} == {name: name for name in knobs}
