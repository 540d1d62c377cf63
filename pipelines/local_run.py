"""Run a whole pipeline on this machine with ``kfp.local`` — the main job, ``draslice run``.

Each task runs in a subprocess of the current interpreter (``SubprocessRunner(use_venv=False)``:
nothing is installed), and every artifact lands under one run folder. kfp-kubernetes settings,
the claim among them, are ignored locally: the tasks use this machine's CPU or GPU.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

from kfp import local

from draslice.pipelines import kfp_local_fixes
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.demo import pipeline as demo
from draslice.pipelines.steps import DEFAULT_TEMPLATE


@dataclass
class LocalRun:
    run_dir: Path
    succeeded: bool
    verdict: str | None
    summary_path: Path | None
    report_path: Path | None
    preflight: dict | None = None  # {"decision": ..., "reason": ...} of the preflight task


def new_run_dir(base: str | Path = "runs") -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(base).resolve() / stamp
    n = 1
    while path.exists():
        n += 1
        path = Path(base).resolve() / f"{stamp}-{n}"
    path.mkdir(parents=True)
    return path


def _newest(run_dir: Path, task: str, output: str) -> Path | None:
    found = sorted(run_dir.glob(f"*/{task}/{output}"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def run_pipeline(
    run_dir: Path,
    params: dict,
    template: str = DEFAULT_TEMPLATE,
    mode: str | ClaimMode = ClaimMode.POLICY,
) -> LocalRun:
    """Run the demo pipeline locally with ``params``; a failed task is reported, not raised."""
    kfp_local_fixes.install()
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(run_dir),
        raise_on_error=True,
    )
    pipeline = demo.build(template, mode)
    try:
        pipeline(**params)
        succeeded = True
    except RuntimeError:  # kfp.local: "Pipeline ... finished with status FAILURE"
        succeeded = False
    summary = _newest(run_dir, "validate", "summary")
    report = _newest(run_dir, "validate", "report")
    verdict = summary.read_text() if summary else None
    return LocalRun(run_dir, succeeded, verdict, summary, report, _preflight_outputs(run_dir))


def _preflight_outputs(run_dir: Path) -> dict | None:
    """The preflight task's ``decision`` and ``reason``, as kfp.local recorded them."""
    path = _newest(run_dir, "preflight", "executor_output.json")
    if path is None:
        return None
    params = json.loads(path.read_text()).get("parameterValues", {})
    return {k: params[k] for k in ("decision", "reason") if k in params}
