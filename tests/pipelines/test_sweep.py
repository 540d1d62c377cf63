"""The sweep: its plan (every run checked and completed before any task), its compiled shape
(a claim per run's GPU tasks, the parallelism, the Model output) and `draslice run --sweep`
refusing a bad file with one line and exit 2."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from google.protobuf import json_format

from draslice.cli import main
from draslice.errors import InvalidParameter
from draslice.pipelines.claim import CLAIM_LABEL, NATIVE_FIELD, ClaimMode
from draslice.pipelines.sweep import pipeline as sweep
from draslice.sweep.compare import Run, best_run, render_markdown, varied_knobs
from draslice.sweep.plan import SweepFileError, load_runs, plan_runs
from draslice.trainer.config import FINETUNE_KNOBS, KNOBS, VERDICT_KNOBS
from draslice.trainer.presets import FINETUNE


def test_plan_completes_each_run_from_the_preset_and_names_it():
    runs = plan_runs([{"learning_rate": 1e-4}, {"name": "big", "lora_r": 32.0}], "finetune")
    assert [r["name"] for r in runs] == ["run-0", "big"]
    assert set(runs[0]) == {"name", *KNOBS}
    assert runs[0]["learning_rate"] == 1e-4 and runs[0]["lora_r"] == FINETUNE.default("lora_r")
    assert runs[1]["lora_r"] == 32 and isinstance(runs[1]["lora_r"], int)  # KFP's 32.0
    # runs of one pipeline run never resume from each other's checkpoints
    assert [r["checkpoint_dir"] for r in runs] == ["checkpoints/run-0", "checkpoints/big"]


@pytest.mark.parametrize("runs, message", [
    ([{"learning_rate": 0}], "invalid configs[0].learning_rate=0: must be > 0"),
    ([{}, {"lora_rank": 8}], "invalid configs[1].lora_rank=8: is not a fine-tune knob"),
    ([{"steps": 5, "warmup_steps": 10}], "configs[0].warmup_steps"),
    ([{"seed": 1}, {"seed": 1}], "repeats run run-0"),
    ([{"name": "a"}, {"name": "a", "seed": 2}], "configs[1].name='a': must be unique"),
    ([{"name": "A b"}], "configs[0].name='A b'"),
    ([], "configs=[]: must be a non-empty list"),
    (["lr"], "configs[0]='lr': must be a mapping"),
])
def test_plan_refuses_a_bad_run_naming_it(runs, message):
    with pytest.raises(InvalidParameter) as err:
        plan_runs(runs, "finetune")
    assert message in str(err.value)


def test_plan_refuses_an_unknown_preset():
    with pytest.raises(InvalidParameter, match="preset='x': must be one of demo, finetune"):
        plan_runs([{}], "x")


@pytest.mark.parametrize("text, message", [
    ("- {lr: [1, 2\n", ":2: not valid YAML or JSON"),
    ('{"learning_rate": 0.1}', "expected a non-empty list of runs"),
    ("[]", "expected a non-empty list of runs"),
    ("- 0.1\n", "run 0 is a float"),
])
def test_a_bad_sweep_file_is_named(tmp_path, text, message):
    path = tmp_path / "runs.yaml"
    path.write_text(text)
    with pytest.raises(SweepFileError) as err:
        load_runs(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_a_json_file_is_read(tmp_path):
    path = tmp_path / "runs.json"
    path.write_text('[{"learning_rate": 0.001, "lora_r": 4}, {"name": "b", "lora_r": 8}]')
    assert load_runs(path) == [{"learning_rate": 0.001, "lora_r": 4}, {"name": "b", "lora_r": 8}]


@pytest.mark.parametrize("text, message", [
    ("- {learning_rate: -1}\n", "invalid configs[0].learning_rate=-1: must be > 0"),
    ("- {lora_r: 4}\n- [1]\n", "run 1 is a list"),
    ("nope: [\n", "not valid YAML or JSON"),
    ("- {lora_r: 4}\n- {lora_targets: ln_1}\n",
     "invalid configs[1].lora_targets='ln_1': 'ln_1' names a LayerNorm"),
    ("- {lora_targets: bogus}\n", "invalid configs[0].lora_targets='bogus': ['bogus'] not in "
                                  "the model"),
])
def test_run_sweep_refuses_a_bad_file_with_one_line_and_exit_2(tmp_path, text, message):
    path = tmp_path / "runs.yaml"
    path.write_text(text)
    res = CliRunner().invoke(main, ["run", "--sweep", str(path), "--runs-dir",
                                    str(tmp_path / "runs"), "--device", "cpu"])
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert line.startswith(f"error: {path}") and message in line
    assert not (tmp_path / "runs").exists()  # refused before any work


def test_run_sweep_on_a_missing_file_exits_2(tmp_path):
    res = CliRunner().invoke(main, ["run", "--sweep", str(tmp_path / "none.yaml")])
    assert res.exit_code == 2
    assert "cannot read the sweep file" in res.output and len(res.output.splitlines()) == 1


def _spec(mode: ClaimMode, parallelism: int = sweep.DEFAULT_PARALLELISM) -> dict:
    return json_format.MessageToDict(sweep.build(mode=mode, parallelism=parallelism)
                                     .pipeline_spec)


def _loop(spec: dict) -> tuple[dict, dict]:
    """(the ParallelFor task of the root DAG, its iteration's component)."""
    (task,) = [t for t in spec["root"]["dag"]["tasks"].values() if "parameterIterator" in t]
    return task, spec["components"][task["componentRef"]["name"]]


def test_the_runs_fan_out_from_the_plan_with_the_parallelism_and_end_in_a_model():
    spec = _spec(ClaimMode.POLICY, parallelism=3)
    task, _ = _loop(spec)
    assert task["iteratorPolicy"] == {"parallelismLimit": 3}
    assert task["parameterIterator"]["items"]["inputParameter"].endswith("sweep-plan-Output")
    outputs = spec["root"]["outputDefinitions"]["artifacts"]
    assert outputs["Output"]["artifactType"]["schemaTitle"] == "system.Model"
    compare = spec["root"]["dag"]["tasks"]["compare"]["inputs"]
    assert compare["artifacts"]["adapters"]["taskOutputArtifact"]["outputArtifactKey"] \
        == "pipelinechannel--finetune-adapter"
    with pytest.raises(InvalidParameter, match="parallelism"):
        sweep.build(parallelism=-1)


def test_every_knob_of_a_run_comes_from_its_loop_item():
    _, body = _loop(_spec(ClaimMode.POLICY))
    tasks = body["dag"]["tasks"]
    for task, names in (("finetune", FINETUNE_KNOBS), ("validate", VERDICT_KNOBS)):
        params = tasks[task]["inputs"]["parameters"]
        for name in names:
            assert params[name]["parameterExpressionSelector"] == \
                f'parseJson(string_value)["{name}"]', (task, name)
            assert params[name]["componentInputParameter"].endswith("-loop-item")


@pytest.mark.parametrize("mode", list(ClaimMode), ids=str)
def test_each_runs_gpu_tasks_carry_the_claim_and_nothing_else_does(mode):
    pipeline = sweep.build(mode=mode)
    spec = json_format.MessageToDict(pipeline.pipeline_spec)
    _, body = _loop(spec)
    assert {"smoke", "finetune", "validate"} <= set(body["dag"]["tasks"])
    platform = json_format.MessageToDict(pipeline.platform_spec)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    claimed = set()
    for name, config in executors.items():
        if mode is ClaimMode.POLICY:
            labels = config.get("podMetadata", {}).get("labels", {})
            if CLAIM_LABEL in labels:
                claimed.add(name)
                assert labels[CLAIM_LABEL] == sweep.DEFAULT_TEMPLATE
        elif NATIVE_FIELD in config:
            claimed.add(name)
            assert config[NATIVE_FIELD] == [
                {"resourceClaimTemplateName": sweep.DEFAULT_TEMPLATE}]
    assert claimed == {"exec-smoke", "exec-finetune"}


def _run(name, eval_loss, passed, tokens=100.0, lr=1e-3):
    return Run(name, {"learning_rate": lr, "lora_r": 8}, {"eval_loss": eval_loss,
               "final_loss": 1.0, "loss_drop": 0.5, "tokens_per_s": tokens,
               "peak_mem_gib": 1.0}, passed, "verdict: PASS" if passed else "verdict: FAIL",
               None, [], [])


def test_the_best_run_is_the_lowest_eval_loss_among_those_that_passed():
    runs = [_run("a", 0.5, False, lr=1e-2), _run("b", 0.9, True), _run("c", 0.7, True, lr=1e-4)]
    best, passed = best_run(runs)
    assert (best.name, passed) == ("c", True)
    assert varied_knobs(runs) == ["learning_rate"]
    text = render_markdown(runs, best, passed)
    assert "| ★ c | 0.0001 | 0.7000 |" in text and "| a | 0.01 | 0.5000 |" in text
    best, passed = best_run([_run("a", 0.5, False), _run("b", 0.4, False, lr=1e-4)])
    assert (best.name, passed) == ("b", False)  # the gate fails the sweep


def test_the_sweeps_own_components_install_nothing_at_run_time():
    from draslice.components.compare import compare
    from draslice.components.sweep_plan import sweep_plan

    for component in (sweep_plan, compare):
        container = component.component_spec.implementation.container
        assert "pip install" not in " ".join(container.command), component.name
        assert container.image.startswith("ghcr.io/draslice/trainer:")
