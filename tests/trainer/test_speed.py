"""The speed decision (trainer/speed/): what ``compile="auto"`` becomes, where."""

from __future__ import annotations

import pytest

from draslice.trainer.sft import SFTConfig, train
from draslice.trainer.speed import choose, choose_mode


@pytest.mark.parametrize(
    ("on_cuda", "fixed", "ckpt", "quant", "want"),
    [
        (True, True, False, False, "cudagraphs"),  # synthetic or packed on a GPU
        (True, False, False, False, "off"),  # variable widths: one graph per shape won't do
        (True, True, True, False, "off"),  # gradient checkpointing stays eager
        (True, True, False, True, "off"),  # a 4-bit base stays eager
        (False, True, False, False, "off"),  # a CPU has no CUDA graphs
    ],
)
def test_auto_graphs_only_fixed_width_unquantised_unrecomputed_gpu_runs(on_cuda, fixed, ckpt,
                                                                          quant, want):
    assert choose_mode("auto", on_cuda, fixed, ckpt, quant) == want


def test_an_explicit_mode_is_kept_except_graphs_on_a_cpu():
    assert choose_mode("default", False, False, False, False) == "default"
    assert choose_mode("off", True, True, False, False) == "off"
    assert choose_mode("reduce-overhead", False, True, False, False) == "default"
    assert choose_mode("cudagraphs", False, True, False, False) == "off"


def test_a_real_run_is_fixed_width_when_packed_or_padded():
    lines: list[str] = []
    packed = SFTConfig(model_dir="m", data="d.jsonl", pack=True)
    unpacked = SFTConfig(model_dir="m", data="d.jsonl")
    assert choose(packed, True, lines.append) == "cudagraphs"
    assert choose(unpacked, True, lines.append) == "off"
    assert choose(SFTConfig(compile="cudagraphs"), False, lines.append) == "off"
    assert lines == ["compile: CUDA graphs need a GPU; running eager"]


def test_checkpointed_layers_compile_without_cuda_graphs_and_say_so():
    lines: list[str] = []
    checkpointed = SFTConfig(compile="reduce-overhead", gradient_checkpointing=True)
    assert choose(checkpointed, True, lines.append) == "default"
    assert len(lines) == 1 and "gradient_checkpointing" in lines[0] and "'default'" in lines[0]
    assert choose(SFTConfig(compile="reduce-overhead"), True, lines.append) == "reduce-overhead"


def test_the_default_on_a_cpu_says_it_runs_eager(tmp_path):
    lines: list[str] = []
    train(SFTConfig(steps=2, batch_size=4, dataset_size=8, device="cpu"), tmp_path / "o",
          tmp_path / "m.jsonl", log=lines.append)
    assert "speed: off" in lines
