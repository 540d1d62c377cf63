"""``draslice run --snapshot``: preflight judges the dump, and the GPU steps run only on ready."""

from __future__ import annotations

import json

from click.testing import CliRunner

from draslice.cli import main
from draslice.tests.cluster.conftest import mig, rslice, write_snapshot


def _run(tmp_path, snapshot, *args):
    runs = tmp_path / "runs"
    res = CliRunner().invoke(main, ["run", "--snapshot", str(snapshot), "--device", "cpu",
                                    "--runs-dir", str(runs), *args])
    (run_dir,) = runs.iterdir()
    (pipeline_dir,) = (p for p in run_dir.iterdir() if p.is_dir())
    return res, pipeline_dir


def test_snapshot_without_dra_skips_the_gpu_steps(tmp_path):
    res, pipeline_dir = _run(tmp_path, write_snapshot(tmp_path / "no-dra.yaml", []))
    assert res.exit_code == 0, res.output
    assert ("preflight: skipped the GPU steps — no DRA at all: no DeviceClass and no "
            "ResourceSlice in the cluster") in res.output
    assert "pipeline succeeded" in res.output
    assert sorted(p.name for p in pipeline_dir.iterdir()) == ["preflight"]  # nothing else ran
    outputs = json.loads((pipeline_dir / "preflight" / "executor_output.json").read_text())
    assert outputs["parameterValues"]["decision"] == "skip"
    report = (pipeline_dir / "preflight" / "report").read_text()
    assert report.startswith("# preflight: skip") and "driver is not installed" in report


def test_snapshot_without_dra_and_fail_policy_fails_at_preflight(tmp_path):
    res, pipeline_dir = _run(tmp_path, write_snapshot(tmp_path / "no-dra.yaml", []),
                             "--on-missing-dra", "fail")
    assert res.exit_code == 1
    assert "pipeline FAILED" in res.output
    assert sorted(p.name for p in pipeline_dir.iterdir()) == ["preflight"]


def test_snapshot_where_the_template_is_missing_fails_with_the_reason(tmp_path, capfd):
    dump = write_snapshot(tmp_path / "dump.yaml", [rslice("node-a", [mig("gpu-0-mig-0")])])
    res, pipeline_dir = _run(tmp_path, dump, "--template", "mig-1g-10gb")
    assert res.exit_code == 1
    assert sorted(p.name for p in pipeline_dir.iterdir()) == ["preflight"]
    logs = capfd.readouterr()
    assert "ResourceClaimTemplate mig-1g-10gb not found" in logs.out + logs.err + res.output


def test_snapshot_that_can_serve_the_template_runs_the_gpu_steps(tmp_path):
    """The canary (preflight -> smoke) with a dump where mig-1g-10gb has a free device."""
    from kfp import local

    from draslice.cluster.templates import mig_claim_template
    from draslice.local import kfp_fixes
    from draslice.pipelines.canary import pipeline as canary

    dump = write_snapshot(tmp_path / "dump.yaml", [
        rslice("node-a", [mig("gpu-0-mig-0")]), mig_claim_template("1g.10gb", namespace="ml")])
    kfp_fixes.install()
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "r"),
               raise_on_error=True)
    canary.build("mig-1g-10gb")(preflight_source=str(dump), device="cpu")
    (pipeline_dir,) = (tmp_path / "r").iterdir()
    assert sorted(p.name for p in pipeline_dir.iterdir()) == ["preflight", "smoke"]
    report = (pipeline_dir / "preflight" / "report").read_text()
    assert report.startswith("# preflight: ready")
    assert "request gpu-slice: 1 match, 1 free (node node-a can serve it)" in report
