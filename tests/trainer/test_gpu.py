"""GPU behaviour of the SFT; run on a CUDA host (`pytest -m gpu`), skipped elsewhere."""

from __future__ import annotations

import pytest

from draslice.trainer import loglines
from draslice.trainer.errors import SliceOutOfMemory
from draslice.trainer.sft import SFTConfig, train
from tests.conftest import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]


def test_sft_on_gpu_runs_bf16_and_prints_the_seed_line(tmp_path):
    lines: list[str] = []
    result = train(SFTConfig(slice_memory_gib=6), tmp_path / "a", tmp_path / "m.jsonl",
                   log=lines.append)
    assert result.precision == "bf16"
    assert result.slice_total_mem_gib == 6
    assert result.peak_mem_gib < 6
    assert result.loss_drop >= 0.3
    assert lines[-1] == loglines.SFT_OK_GPU


def test_out_of_memory_inside_the_slice_is_one_clear_message(tmp_path):
    with pytest.raises(SliceOutOfMemory, match=r"the slice has 0\.01 GiB .* bigger profile"):
        train(SFTConfig(slice_memory_gib=0.01), tmp_path / "a", tmp_path / "m.jsonl",
              log=lambda _line: None)
