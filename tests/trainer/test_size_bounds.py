"""Issue 37, 3: sizes that cannot fit are refused with the bound in the message: a LoRA rank
past the smallest targeted projection, a synthetic sequence past the device's memory, a smoke
matmul past it."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from draslice.cli import main
from draslice.errors import InvalidParameter
from draslice.tests.trainer.test_bad_input import _cli, _one_error_line
from draslice.trainer import budget, device, input_checks
from draslice.trainer.config import SFTConfig
from draslice.trainer.loglines import GIB, gib


def test_a_rank_past_the_smallest_projection_is_refused_before_the_load(
        tiny_llama, demo_data, tmp_path, no_model_load):
    """The tiny Llama's k_proj maps 64 to 32 (two of four heads): no rank above 32 exists."""
    out = tmp_path / "out"
    _one_error_line(_cli(out, tiny_llama, demo_data["prompt-completion"], "--lora-r", "100000"),
                    "invalid lora_r=100000: must be at most 32, the smallest dimension of the "
                    "targeted projections (model.layers.0.self_attn.k_proj is 64 x 32)")
    assert not out.exists()


@pytest.mark.parametrize(("targets", "largest"), [("q_proj,o_proj", 64), ("auto", 32),
                                                  ("down_proj", 64)])
def test_the_rank_bound_follows_the_targets(tiny_llama, demo_data, targets, largest):
    cfg = dict(model_dir=str(tiny_llama), data=str(demo_data["prompt-completion"]),
               lora_targets=targets)
    input_checks.check_lora(SFTConfig(**cfg, lora_r=largest))
    with pytest.raises(InvalidParameter, match=f"must be at most {largest},"):
        input_checks.check_lora(SFTConfig(**cfg, lora_r=largest + 1))


def test_a_target_the_model_lacks_is_refused_before_the_load(tiny_llama, demo_data, tmp_path,
                                                             no_model_load):
    _one_error_line(_cli(tmp_path / "out", tiny_llama, demo_data["prompt-completion"],
                         "--lora-targets", "q_proj,bogus"),
                    "invalid lora_targets='q_proj,bogus': ['bogus'] not in the model",
                    "'q_proj'")


@pytest.mark.parametrize(("targets", "words"), [
    ("ln_1", "'ln_1' names a LayerNorm, not a layer LoRA can wrap"),
    ("c_attn,attn", "'attn' names a GPT2Attention, not a layer LoRA can wrap"),
])
def test_a_target_lora_cannot_wrap_is_refused_before_the_model_is_built(tmp_path, targets,
                                                                        words):
    """A LayerNorm's or a block's name is in the model, but peft refuses it only when it
    wraps the model (a ValueError traceback, after the model was built)."""
    result = CliRunner().invoke(main, ["train", "--output-dir", str(tmp_path / "out"),
                                       "--device", "cpu", "--lora-targets", targets])
    _one_error_line(result, f"invalid lora_targets={targets!r}: {words}",
                    "projections are ['c_attn', 'c_fc', 'c_proj']")
    assert not (tmp_path / "out").exists()


def test_the_synthetic_rank_is_bounded_by_its_width(tmp_path):
    result = CliRunner().invoke(main, ["train", "--output-dir", str(tmp_path / "out"),
                                       "--device", "cpu", "--lora-r", "300"])
    _one_error_line(result, "invalid lora_r=300: must be at most 256",
                    "transformer.h.0.attn.c_attn is 256 x 768")
    assert not (tmp_path / "out").exists()


def test_a_synthetic_sequence_past_the_hosts_memory_is_refused(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["train", "--output-dir", str(out), "--device", "cpu",
                                       "--seq-len", "100000"])
    line = _one_error_line(result, "invalid seq_len=100000: a synthetic step of 8 x 100000 "
                           "tokens needs about", f"more than the {gib(device.host_memory_bytes())}"
                           " GiB of cpu", "tokens fit at batch_size 8")
    assert "Traceback" not in result.output
    longest = int(line.split("at most about ")[1].split(" tokens")[0].replace(",", ""))
    assert 1000 < longest < 100000
    assert not out.exists()  # the folder made for the run is taken back with its lock


def test_the_longest_synthetic_sequence_named_is_the_longest_that_fits():
    memory = 4.0

    def cfg(seq_len: int) -> SFTConfig:
        return SFTConfig.from_params({"device": "cpu", "seq_len": seq_len})

    with pytest.raises(InvalidParameter, match="at most about") as err:
        budget.check_synthetic_fits(cfg(10**6), "fp32", memory, "a 4 GiB device")
    longest = int(str(err.value).split("at most about ")[1].split(" ")[0].replace(",", ""))
    budget.check_synthetic_fits(cfg(longest), "fp32", memory, "a 4 GiB device")
    with pytest.raises(InvalidParameter):
        budget.check_synthetic_fits(cfg(longest + 1), "fp32", memory, "a 4 GiB device")
    # bf16 activations are half of fp32's: a longer sequence fits
    budget.check_synthetic_fits(cfg(longest + 1), "bf16", memory, "a 4 GiB device")


def test_smoke_refuses_a_matmul_past_the_hosts_memory():
    result = CliRunner().invoke(main, ["smoke", "--device", "cpu", "--matmul-size", "200000"])
    host = gib(device.host_memory_bytes())
    largest = int(math.sqrt(host * GIB / 16))
    _one_error_line(result, f"invalid matmul_size=200000: must be at most {largest:,} here: a "
                    f"200000 x 200000 check needs 596.0 GiB of host memory and it has "
                    f"{host:.2f} GiB")


def test_host_memory_is_the_containers_limit_where_lower(tmp_path, monkeypatch):
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(device, "CGROUP_MEMORY_LIMITS", (str(limit),))
    limit.write_text("1073741824\n")
    assert device.host_memory_bytes() == GIB
    limit.write_text("max\n")  # no limit: the machine's memory
    assert device.host_memory_bytes() > GIB
