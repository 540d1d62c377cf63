"""Run a whole pipeline on this machine with ``kfp.local`` — the main job, ``draslice run``.

Each task runs in a subprocess of the current interpreter (``SubprocessRunner(use_venv=False)``:
nothing is installed), and every artifact lands under one run folder. kfp-kubernetes settings,
the claim among them, are ignored locally: the tasks use this machine's CPU or GPU.

The run folder holds, besides kfp.local's task folders, ``kfp-local.log`` (everything kfp.local
and the tasks printed; ``run_console.py`` here decides what the console shows) and ``report.html``
(validate's report). kfp.local writes each task's program into a ``mktemp -d`` folder it
never removes: the tasks get a ``TMPDIR`` of their own, removed when the run ends.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from kfp import local

from draslice.local import kfp_fixes, run_console
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.demo import pipeline as demo
from draslice.pipelines.steps import DEFAULT_TEMPLATE
from draslice.trainer.presets import DEMO


@dataclass
class LocalRun:
    run_dir: Path
    succeeded: bool
    verdict: str | None
    summary_path: Path | None
    report_path: Path | None
    preflight: dict | None = None  # {"decision": ..., "reason": ...} of the preflight task
    failures: list[run_console.TaskFailure] = field(default_factory=list)
    log_path: Path | None = None
    verdict_text: str | None = None  # validate's verdict line and one reason per check

    @property
    def exit_code(self) -> int:
        """0 on success; a failed task's documented code (errors.py); 1 for a FAIL verdict
        or a failure without one."""
        if self.succeeded:
            return 0
        return self.failures[0].exit_code if self.failures else 1


def new_run_dir(base: str | Path = "runs") -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(base).resolve() / stamp
    n = 1
    while path.exists():
        n += 1
        path = Path(base).resolve() / f"{stamp}-{n}"
    path.mkdir(parents=True)
    return path


def newest_output(run_dir: Path, task: str, output: str) -> Path | None:
    """The newest file ``output`` of ``task`` under a run folder kfp.local filled."""
    found = sorted(run_dir.glob(f"*/{task}/{output}"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def report_html(run_dir: Path, task: str, output: run_console.RunOutput) -> Path | None:
    """``task``'s HTML report as ``report.html`` in the run folder, a name a browser opens as
    HTML; None unless the task succeeded (kfp.local creates the file before the task runs)."""
    report = newest_output(run_dir, task, "report")
    if report is None or (task, "SUCCESS") not in {(n, st) for n, st, _ in output.finished}:
        return None
    return Path(shutil.copyfile(report, run_dir / "report.html"))


def run_pipeline(
    run_dir: Path,
    params: dict,
    template: str = DEFAULT_TEMPLATE,
    mode: str | ClaimMode = ClaimMode.POLICY,
    verbose: bool = False,
    console: TextIO | None = None,
    bar: bool | None = None,
) -> LocalRun:
    """Run the demo pipeline locally with ``params``; a failed task is reported, not raised.

    ``console`` (stdout by default) gets the short story, or with ``verbose`` kfp.local's
    whole stream; ``bar`` forces the fine-tune's progress bar on or off (default: on a
    terminal).
    """
    steps = int(params.get("steps", DEMO.default("steps")))
    with local_session(run_dir, steps, verbose, console, bar) as output:
        pipeline = demo.build(template, mode)
        try:
            pipeline(**params)
            succeeded = True
        except RuntimeError:  # kfp.local: "Pipeline ... finished with status FAILURE"
            succeeded = False
    log_path = run_dir / run_console.LOG_FILE
    summary = newest_output(run_dir, "validate", "summary")
    report = report_html(run_dir, "validate", output)
    verdict = summary.read_text() if summary else None
    return LocalRun(run_dir, succeeded, verdict, summary, report,
                    _task_outputs(run_dir, "preflight", ("decision", "reason")),
                    failures=output.failures, log_path=log_path,
                    verdict_text=(_task_outputs(run_dir, "validate", ("verdict",)) or {}
                                  ).get("verdict"))


@contextlib.contextmanager
def local_session(run_dir: Path, steps: int, verbose: bool = False,
                  console: TextIO | None = None, bar: bool | None = None
                  ) -> Iterator[run_console.RunOutput]:
    """kfp.local set up for one run in ``run_dir``: its whole output goes to
    ``kfp-local.log`` there and the console gets the short story (every pipeline run locally
    shares this, so ``run`` and ``run --sweep`` print alike); its temp folders live inside
    the run folder and are removed at the end."""
    kfp_fixes.install()
    with (run_dir / run_console.LOG_FILE).open("w") as log, own_tmpdir(run_dir):
        output = run_console.RunOutput(log, console or sys.stdout, run_dir, steps,
                                       verbose=verbose, bar=bar)
        with run_console.captured(output):
            local.init(runner=local.SubprocessRunner(use_venv=False),
                       pipeline_root=str(run_dir), raise_on_error=True)
            yield output


@contextlib.contextmanager
def own_tmpdir(run_dir: Path) -> Iterator[None]:
    """Give the tasks a ``TMPDIR`` of their own (kfp.local leaves each task's
    ``ephemeral_component.py`` folder behind) and remove it afterwards. torch's compile cache
    defaults to a folder under ``TMPDIR``: it is pinned to where it would have been, so runs
    still share it."""
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=run_dir))
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")}
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                          os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"))
    os.environ["TMPDIR"] = str(tmp)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(tmp, ignore_errors=True)


def _task_outputs(run_dir: Path, task: str, names: tuple[str, ...]) -> dict | None:
    """A task's output parameters ``names``, as kfp.local recorded them."""
    path = newest_output(run_dir, task, "executor_output.json")
    if path is None:
        return None
    params = json.loads(path.read_text()).get("parameterValues", {})
    return {k: params[k] for k in names if k in params}
