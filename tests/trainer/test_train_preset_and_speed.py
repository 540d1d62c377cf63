"""Issue 37, 10 and 11: `draslice train` with a model starts where the finetune pipeline
starts (the values a user passes win) and says so once, first; a run's speed is its steady
rate, its warm-up seconds and its wall time, apart, wherever it is reported."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from draslice.cli import main
from draslice.tests.trainer.test_bad_input import _cli
from draslice.trainer import distributed, sft
from draslice.trainer.config import FINETUNE_KNOBS, KNOBS, SFTConfig
from draslice.trainer.measure import StepFigures, speed, speed_of, steady_from
from draslice.trainer.outputs import RUN_FILE
from draslice.trainer.presets import FINETUNE
from draslice.trainer.tasks import report
from draslice.trainer.tasks.validate import Verdict, read_records


def _config_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("[config] ")]
    assert len(lines) == 1, output  # once
    assert output.splitlines()[0] == lines[0]  # first
    return lines[0]


def test_a_real_run_starts_from_the_finetune_preset_and_passed_values_win(
        tiny_gpt2, demo_data, tmp_path):
    out = tmp_path / "out"
    result = _cli(out, tiny_gpt2, demo_data["prompt-completion"], "--lora-r", "4")
    assert result.exit_code == 0, result.output
    line = _config_line(result.output)
    assert line.startswith("[config] the finetune preset where not passed: model_dir=")
    for words in ("learning_rate=0.0002", "lr_schedule='cosine'", "bf16_weights=True",
                  "eval_fraction=0.05", "lora_alpha=32", "checkpoint_every=50",
                  "lora_r=4", "steps=2", "warmup_steps=0", "max_length=48"):
        assert f" {words}" in line, (words, line)
    assert "n_embd=" not in line and "dataset_size=" not in line  # the synthetic run's knobs
    config = json.loads((out / RUN_FILE).read_text())["config"]
    expected = {**FINETUNE.fill({"steps": 2, "lora_r": 4}, FINETUNE_KNOBS),
                "steps": 2, "lora_r": 4}
    assert {k: config[k] for k in expected} == expected
    assert config["checkpoint_dir"] == ""  # the volume's layout is no default in a shell


def test_the_synthetic_run_keeps_the_demo_defaults(tmp_path):
    result = CliRunner().invoke(main, ["train", "--output-dir", str(tmp_path / "out"),
                                       "--device", "cpu", "--steps", "2", "--n-layer", "1"])
    assert result.exit_code == 0, result.output
    line = _config_line(result.output)
    assert line.startswith("[config] the demo defaults: ") and " n_layer=1 n_embd=256 " in line
    assert f" learning_rate={KNOBS['learning_rate'].default} " in line
    assert "model_dir=" not in line and "max_length=" not in line


@pytest.mark.parametrize(("steps", "warmup"), [(200, 10), (100, 5), (19, 0), (2, 0)])
def test_the_presets_warmup_stays_its_share_of_the_steps_passed(steps, warmup):
    assert FINETUNE.fill({"steps": steps}, FINETUNE_KNOBS)["warmup_steps"] == warmup
    assert "warmup_steps" not in FINETUNE.fill({"steps": steps, "warmup_steps": 3},
                                               FINETUNE_KNOBS)


@pytest.mark.parametrize("model_dir", ["/data/m", ""], ids=["real", "synthetic"])
def test_a_trainjobs_command_line_trains_the_knobs_it_was_given(model_dir):
    """The TrainJob component writes `draslice train` options for a whole knob set: the
    command must run that set, not the preset where a knob sits at the config's default."""
    from draslice.cli.commands.steps_cmd import train, train_config
    from draslice.components.trainjob.launch import train_args

    knobs = {name: KNOBS[name].default for name in FINETUNE_KNOBS}
    knobs.update(model_dir=model_dir, data="/data/t.jsonl" if model_dir else "", steps=40)
    args = train_args(knobs, "/data/out")
    cfg, _origin = train_config(train.make_context("train", args))
    assert cfg == SFTConfig.from_params(knobs)


def _figures(seconds: list[float], tokens: list[int] | None = None) -> list[StepFigures]:
    tokens = tokens or [1000] * len(seconds)
    return [StepFigures(i, 1.0, s, t, 0.1)
            for i, (s, t) in enumerate(zip(seconds, tokens, strict=True), start=1)]


def test_warm_up_is_the_first_step_and_the_slow_ones_right_after_it():
    figures = _figures([30.0, 4.0, 0.1, 0.11, 0.1, 0.5, 0.1])  # compile, recompile, steady
    assert steady_from(figures) == 2
    found = speed(figures, wall_seconds=40.0)
    assert found.steady_from_step == 3 and found.warmup_seconds == pytest.approx(34.0)
    steady = figures[2:]
    assert found.tokens_per_s == pytest.approx(sum(f.tokens for f in steady)
                                               / sum(f.seconds for f in steady))
    assert found.wall_seconds == 40.0


def test_a_wide_batch_is_no_warm_up_and_a_one_step_run_has_no_steady_rate():
    # step 2 took twice as long for twice the tokens: the same rate, steady
    assert steady_from(_figures([1.0, 0.2, 0.1, 0.1], [1000, 2000, 1000, 1000])) == 1
    one = speed(_figures([2.0]), wall_seconds=5.0)
    assert one.steady_from_step is None and one.tokens_per_s == pytest.approx(500.0)
    assert one.warmup_seconds == pytest.approx(2.0)


def test_the_run_reports_its_steady_rate_warm_up_and_wall_time_apart(tmp_path, monkeypatch):
    """A first step that takes a second more (a compilation), then steady 0.05 s steps."""
    real_loss = distributed.causal_lm_loss
    calls = {"n": 0}

    def loss_with_a_slow_first_step(model, batch):
        calls["n"] += 1
        time.sleep(1.0 if calls["n"] == 1 else 0.05)
        return real_loss(model, batch)

    monkeypatch.setattr(distributed, "causal_lm_loss", loss_with_a_slow_first_step)
    cfg = SFTConfig.from_params({"steps": 6, "log_every": 100, "device": "cpu", "n_layer": 1,
                                 "n_embd": 64, "n_head": 2, "seq_len": 16})
    lines: list[str] = []
    result = sft.train(cfg, tmp_path / "out", tmp_path / "m.jsonl", log=lines.append)
    records = read_records(tmp_path / "m.jsonl")
    assert result.steady_from_step == 2
    assert result.warmup_seconds == pytest.approx(records[0]["step_seconds"])
    assert result.warmup_seconds >= 1.0
    steady = records[1:]
    assert result.tokens_per_s == pytest.approx(sum(r["tokens"] for r in steady)
                                                / sum(r["step_seconds"] for r in steady))
    everything = result.train_tokens / result.train_seconds
    assert result.tokens_per_s > 2 * everything  # the mixed figure the issue found
    assert result.wall_seconds > result.train_seconds
    assert speed_of(records) == {"steady_tokens_per_s": result.tokens_per_s,
                                 "steady_from_step": 2,
                                 "warmup_seconds": result.warmup_seconds,
                                 "wall_seconds": result.wall_seconds}
    assert all("steady_tokens_per_s" not in r for r in records[:-1])  # one schema per step
    said = [line for line in lines if line.startswith("[speed] ")]
    assert said == [f"[speed] {result.tokens_per_s:,.0f} tokens/s steady (steps 2-6); warm-up "
                    f"{result.warmup_seconds:.1f} s (step 1); wall {result.wall_seconds:.1f} s "
                    "(load, warm-up, steps, evaluation and checkpoints)"]
    run = json.loads((tmp_path / "out" / RUN_FILE).read_text())["result"]
    assert run["tokens_per_s"] == result.tokens_per_s
    assert run["warmup_seconds"] == result.warmup_seconds

    verdict = Verdict(True, [], {"peak_mem_gib": 1.0, "slice_total_mem_gib": 8.0,
                                 "memory_budget_gib": 7.2})
    html = report.render_html(verdict, records, result.device, {"template": "", "mode": ""})
    assert f"{result.tokens_per_s:,.0f} from step 2" in html
    assert f"{result.warmup_seconds:.1f} s (compilation" in html
    assert f"{result.wall_seconds:.1f} s (load" in html
    older = [{k: v for k, v in r.items() if k not in speed_of(records)} for r in records]
    assert "not recorded by this fine-tune (an older draslice)" in report.render_html(
        verdict, older, result.device, {"template": "", "mode": ""})


def test_train_json_carries_the_three_figures(tmp_path):
    result = CliRunner().invoke(main, ["train", "--output-dir", str(tmp_path / "out"),
                                       "--device", "cpu", "--steps", "3", "--n-layer", "1",
                                       "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.splitlines()[-1])
    assert summary["steady_from_step"] >= 2 and summary["tokens_per_s"] > 0
    assert summary["wall_seconds"] > summary["train_seconds"] >= summary["warmup_seconds"] > 0
