"""The whole pipeline through kfp.local, as `draslice run` runs it."""

from __future__ import annotations

import pytest

from draslice.pipelines.local_run import new_run_dir, run_pipeline

pytestmark = pytest.mark.slow


def test_default_pipeline_passes_and_keeps_every_artifact(tmp_path):
    run_dir = new_run_dir(tmp_path)
    result = run_pipeline(run_dir, {"device": "cpu"})
    assert result.succeeded
    assert result.verdict.startswith("# draslice verdict: PASS")
    (pipeline_dir,) = run_dir.iterdir()
    for path in ("preflight/report", "smoke/executor_output.json",
                 "finetune/adapter/adapter/adapter_config.json", "finetune/train_log",
                 "validate/report", "validate/summary"):
        assert (pipeline_dir / path).exists(), path


def test_failing_verdict_fails_the_run_but_keeps_the_report(tmp_path):
    run_dir = new_run_dir(tmp_path)
    result = run_pipeline(run_dir, {"device": "cpu", "steps": 5, "min_loss_drop": 0.95})
    assert not result.succeeded
    assert result.verdict.startswith("# draslice verdict: FAIL")
    assert result.report_path.is_file()
