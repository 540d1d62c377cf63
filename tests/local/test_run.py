"""The whole pipeline through kfp.local, as `draslice run` runs it: what a user sees on
success (short, the grepped lines, an openable report) and on a failed task (its name, its
reason, the documented exit code)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from draslice.cli import main

pytestmark = pytest.mark.slow

GREPPED = ("cuda_available:", "device:", "slice_total_mem_GiB:", "matmul_on_slice: OK",
           "[slice] device=", "[slice] peak_mem=", "LoRA SFT on CPU: OK")


def test_default_run_is_short_keeps_the_grepped_lines_and_an_openable_report(tmp_path):
    result = CliRunner().invoke(main, ["run", "--device", "cpu", "--runs-dir", str(tmp_path)])
    lines = result.output.splitlines()
    assert result.exit_code == 0, result.output
    assert len(lines) <= 60, result.output
    for grepped in GREPPED:
        assert any(line.startswith(grepped) for line in lines), grepped
    for task in ("preflight", "smoke", "finetune", "validate", "gate"):
        assert f"[task] {task}: started" in lines
        assert any(line.startswith(f"[task] {task}: SUCCESS in ") for line in lines), task
    assert "executorInput" not in result.output and "non-Python base image" not in result.output
    assert "verdict: PASS" in lines
    assert "host RAM" in result.output  # the memory check says what it compared on a CPU
    (run_dir,) = tmp_path.iterdir()
    report = run_dir / "report.html"
    assert f"report:     {report.as_uri()}" in lines
    assert report.read_text().count("data:image/png;base64,") == 3
    log = (run_dir / "kfp-local.log").read_text()
    assert "executor_input" in log or "executorInput" in log  # kfp.local's stream, kept whole
    assert lines[-1].startswith("pipeline succeeded in ")

    # kfp.local's per-task program folders were ours to remove (test_run_tmpdir.py).
    assert not list(run_dir.glob(".tmp-*"))


def test_a_diverging_run_names_the_task_its_reason_and_exits_4(tmp_path):
    result = CliRunner().invoke(main, ["run", "--device", "cpu", "--steps", "5",
                                       "--learning-rate", "1e6", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 4, result.output
    last = result.output.splitlines()[-1]
    assert last.startswith("task finetune FAILED (exit 4): loss became nan at step"), last
    assert "Traceback" not in result.output
    assert "verdict: none" not in result.output


def test_a_slice_too_small_names_the_task_and_exits_3(tmp_path):
    """On a GPU host only (a CPU cannot be capped: that is refused before any task, exit 2)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to cap")
    result = CliRunner().invoke(main, ["run", "--slice-memory-gib", "0.001", "--runs-dir",
                                       str(tmp_path)])
    assert result.exit_code == 3, result.output
    last = result.output.splitlines()[-1]
    assert last.startswith("task smoke FAILED (exit 3): out of memory inside the slice"), last
