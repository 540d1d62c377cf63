"""`draslice run --sweep FILE` end to end through kfp.local: two runs of the demo model, the
comparison, and the best adapter as the pipeline's Model."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from draslice.cli import main

# plan, preflight, compare, gate and per run smoke, fine-tune, validate: ten processes, each
# importing torch.
pytestmark = pytest.mark.slow

# Two runs of a smaller model than the demo's (each takes seconds), with an eval split.
TINY = "n_layer: 1, n_embd: 64, n_head: 2, vocab_size: 128, alphabet: 32, dataset_size: 64, " \
       "eval_fraction: 0.25"
RUNS = f"""\
- {{name: quick, learning_rate: 0.01, lora_r: 4, {TINY}}}
- {{name: crawl, learning_rate: 0.00001, lora_r: 8, {TINY}}}
"""


def test_a_two_run_sweep_compares_the_runs_and_outputs_the_best_adapter(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    sweep_file = tmp_path / "runs.yaml"
    sweep_file.write_text(RUNS)
    res = CliRunner().invoke(main, [
        "run", "--sweep", str(sweep_file), "--device", "cpu", "--steps", "20",
        "--seq-len", "16", "--batch-size", "8", "--min-loss-drop", "0.05",
        "--runs-dir", str(tmp_path / "runs")])
    assert res.exit_code == 0, res.output
    assert "best of 2 runs: quick (lowest eval loss among the runs that passed" in res.output
    (pipeline_dir,) = (p for p in (tmp_path / "runs").glob("*/*") if p.is_dir())

    summary = (pipeline_dir / "compare" / "summary").read_text()
    rows = [line for line in summary.splitlines() if line.startswith("| ")]
    assert rows[0].split(" | ")[:3] == ["| run", "lora_r", "learning_rate"]
    quick, crawl = rows[2], rows[3]
    assert quick.startswith("| ★ quick | 4 | 0.01 |") and quick.endswith("| PASS |")
    assert crawl.startswith("| crawl | 8 | 1e-05 |") and crawl.endswith("| FAIL |")
    eval_quick, eval_crawl = (float(r.split(" | ")[3]) for r in (quick, crawl))
    assert eval_quick < eval_crawl
    html = (pipeline_dir / "compare" / "report").read_text()
    assert (pipeline_dir.parent / "report.html").read_text() == html
    assert f"report:       {(pipeline_dir.parent / 'report.html').as_uri()}" in res.output
    assert "<table>" in html and "data:image/png;base64," in html

    best = pipeline_dir / "compare" / "best_adapter"
    assert f"best adapter: {best}" in res.output
    assert (best / "adapter" / "adapter_config.json").is_file()
    run = json.loads((best / "draslice_sft.json").read_text())
    assert (run["config"]["learning_rate"], run["config"]["lora_r"]) == (0.01, 4)
    assert run["result"]["eval_loss"] == pytest.approx(eval_quick, abs=1e-4)
