"""The LoRA SFT on the CPU: the seed's lines, learnable data, the saved adapter, bad input."""

from __future__ import annotations

import json
import re

import pytest

from draslice.errors import InvalidParameter, TrainingDiverged
from draslice.trainer import loglines
from draslice.trainer.config import SFTConfig
from draslice.trainer.model import GPT2_ATTENTION_ONLY, ModelShape
from draslice.trainer.outputs import ADAPTER_DIR, REFERENCE_FILE, RUN_FILE
from draslice.trainer.sft import train


def test_default_run_prints_the_seed_lines_in_order(trained):
    lines = trained["lines"]
    device_line = r"\[slice\] device=cpu \(no CUDA device\) total_mem=\d+\.\d\d GiB"
    assert re.fullmatch(device_line, lines[0])
    assert lines[1].startswith("trainable params: ")
    assert re.fullmatch(r"\[slice\] peak_mem=\d+\.\d\d GiB", lines[-2])
    # On the CPU the GPU line would be a lie.
    assert lines[-1] == loglines.SFT_OK_CPU
    assert loglines.SFT_OK_GPU not in lines
    logged_steps = [int(m.group(1)) for m in map(re.compile(r".*'step': (\d+)").match, lines) if m]
    assert logged_steps == [1, 10, 20, 30]


def test_default_run_learns_at_least_30_percent(trained):
    result = trained["result"]
    assert result.precision == "fp32"
    assert result.steps == 30
    assert result.loss_drop >= 0.30, result
    # The synthetic data is learnable beyond token frequencies: the loss ends below the
    # unigram entropy ln(64) ~ 4.16 of the 64-token alphabet.
    assert result.final_loss < 4.0


def test_metrics_are_one_json_line_per_step(trained):
    records = [json.loads(line) for line in trained["metrics"].read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 31))
    for r in records:
        assert set(r) >= {"step", "loss", "tokens_per_s", "peak_mem_gib", "mem_gib"}
        assert r["tokens_per_s"] > 0


def test_adapter_and_run_file_are_saved(trained):
    out = trained["dir"]
    assert (out / ADAPTER_DIR / "adapter_config.json").is_file()
    assert (out / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert (out / REFERENCE_FILE).is_file()
    run = json.loads((out / RUN_FILE).read_text())
    assert run["config"]["lora_targets"] == "c_attn,c_proj,c_fc"
    assert run["result"]["trainable_params"] == trained["result"].trainable_params


def test_seed_attention_only_choice_is_one_parameter_away(tmp_path):
    lines: list[str] = []
    result = train(SFTConfig(lora_targets=GPT2_ATTENTION_ONLY, steps=3), tmp_path / "a",
                   tmp_path / "m.jsonl", log=lines.append)
    # c_attn alone: r * (in + out) = 8 * (256 + 768) per layer, 4 layers.
    assert result.trainable_params == 4 * 8 * (256 + 768)


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        ({"steps": 0}, "steps"),
        ({"steps": -3}, "steps"),
        ({"batch_size": 300}, "batch_size"),
        ({"precision": "fp8"}, "precision"),
        ({"device": "tpu"}, "device"),
        ({"device": "cuda:7"}, "device"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"lora_targets": "q_proj"}, "lora_targets"),
        ({"n_embd": 250, "n_head": 4}, "n_head"),
        ({"compile": "yes"}, "compile"),
    ],
)
def test_bad_input_is_refused_before_training(tmp_path, overrides, name):
    lines: list[str] = []
    with pytest.raises(InvalidParameter) as err:
        train(SFTConfig.from_params(overrides), tmp_path / "a", tmp_path / "m.jsonl",
              log=lines.append)
    assert err.value.name == name
    assert not any(line.startswith("{'loss'") for line in lines)  # no step ran
    assert not (tmp_path / "m.jsonl").exists()


def test_nan_loss_stops_with_a_message(tmp_path):
    with pytest.raises(TrainingDiverged, match=r"loss became nan at step \d+"):
        train(SFTConfig(learning_rate=1e6, steps=20), tmp_path / "a", tmp_path / "m.jsonl",
              log=lambda _line: None)


@pytest.mark.slow
def test_compiled_run_trains_like_the_eager_one(tmp_path):
    """torch.compile (inductor, here its C++ CPU backend) changes speed, not the training: same
    losses within float noise, same adapter file layout. reduce-overhead falls back on a CPU."""
    shape = ModelShape(vocab_size=128, n_layer=2, n_embd=64, n_head=2, seq_len=32)
    common = dict(shape=shape, steps=4, batch_size=4, dataset_size=16, alphabet=32,
                  device="cpu", log_every=1)
    eager = train(SFTConfig(**common), tmp_path / "e", tmp_path / "e.jsonl",
                  log=lambda _line: None)
    lines: list[str] = []
    compiled = train(SFTConfig(**common, compile="reduce-overhead"), tmp_path / "c",
                     tmp_path / "c.jsonl", log=lines.append)
    assert "compile: CUDA graphs need a GPU; compiling without them (mode 'default')" in lines
    want = [json.loads(x)["loss"] for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    got = [json.loads(x)["loss"] for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert len(got) == 4 and got == pytest.approx(want, rel=1e-4)
    assert compiled.final_loss == pytest.approx(eager.final_loss, rel=1e-4)
    assert sorted(p.name for p in (tmp_path / "c" / "adapter").iterdir()) == sorted(
        p.name for p in (tmp_path / "e" / "adapter").iterdir())
