"""``draslice run --sweep FILE``: the sweep pipeline on this machine with kfp.local.

The file's runs start from the demo run (the built-in model and data) and the command line's
knob options, so ``draslice run --sweep lrs.yaml --steps 20`` sweeps what the file varies at
20 steps. Every run is checked (``draslice.sweep.plan.plan_runs``) before kfp.local starts;
kfp.local runs at most two iterations at once whatever the pipeline's ``parallelism`` says.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from draslice.errors import InvalidParameter
from draslice.sweep.plan import SweepFileError, load_runs, plan_runs

PRESET = "demo"


@dataclass
class SweepRun:
    run_dir: Path
    succeeded: bool
    best_adapter: Path | None
    summary_path: Path | None
    report_path: Path | None


def planned_runs(path: str | Path, base: dict) -> list[dict]:
    """The file's runs over ``base`` (knob values from the command line), checked and
    completed from the demo preset; each run's LoRA targets and rank are checked on the
    model too, as ``draslice run`` checks its own (a bad one would fail only its fine-tune)."""
    from draslice.trainer.config import FINETUNE_KNOBS, SFTConfig
    from draslice.trainer.input_checks import check_lora

    try:
        runs = plan_runs([{**base, **run} for run in load_runs(path)], PRESET)
        for i, run in enumerate(runs):
            try:
                check_lora(SFTConfig.from_params({k: run[k] for k in FINETUNE_KNOBS}))
            except InvalidParameter as err:
                raise InvalidParameter(f"configs[{i}].{err.name}", err.value, err.valid) \
                    from err
        return runs
    except InvalidParameter as err:
        raise SweepFileError(f"{path}: {err}") from err


def run_sweep(run_dir: Path, runs: list[dict], template: str, preflight_source: str,
              verbose: bool = False) -> SweepRun:
    """Run the sweep pipeline locally; a failed task is reported, not raised."""
    from draslice.local.run import local_session, newest_output, report_html
    from draslice.pipelines.sweep import pipeline

    steps = max(int(run.get("steps", 0)) for run in runs)
    with local_session(run_dir, steps, verbose, bar=False) as output:
        try:
            pipeline.build(template)(configs=runs, preset=PRESET,
                                     preflight_source=preflight_source)
            succeeded = True
        except RuntimeError:  # kfp.local: "Pipeline ... finished with status FAILURE"
            succeeded = False  # the gate too, when no run passed: compare's outputs are there
    for failure in output.failures:
        click.echo(str(failure))
    return SweepRun(run_dir, succeeded, newest_output(run_dir, "compare", "best_adapter"),
                    newest_output(run_dir, "compare", "summary"),
                    report_html(run_dir, "compare", output))


def run_command(sweep_file: str, params: dict, runs_dir: str, template: str,
                verbose: bool = False) -> None:
    """What ``draslice run --sweep`` does after its options are checked: plan, run, print the
    comparison, exit 0 when the best run passed, 1 otherwise."""
    from draslice.local.run import new_run_dir
    from draslice.trainer.presets import DEMO

    runs = planned_runs(sweep_file, {k: v for k, v in params.items() if k in DEMO.exposed})
    run_dir = new_run_dir(runs_dir)
    click.echo(f"sweep of {len(runs)} runs: {', '.join(r['name'] for r in runs)}")
    click.echo(f"run folder: {run_dir}")
    start = time.perf_counter()
    result = run_sweep(run_dir, runs, template, params["preflight_source"], verbose)
    click.echo("")
    if result.summary_path:
        click.echo(result.summary_path.read_text().rstrip())
        if result.report_path:
            click.echo(f"report:       {result.report_path.as_uri()}")
    else:
        click.echo("comparison: none (the sweep stopped before compare)")
    if result.best_adapter:
        click.echo(f"best adapter: {result.best_adapter}")
    click.echo(f"sweep {'succeeded' if result.succeeded else 'FAILED'} in "
               f"{time.perf_counter() - start:.1f} s")
    sys.exit(0 if result.succeeded else 1)
