"""``draslice run``: the whole pipeline on this machine, no cluster."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from draslice.cli.knobs import knob_options
from draslice.cluster.names import validate_template_name
from draslice.trainer.config import check_params
from draslice.trainer.presets import DEMO

# Literal default, not an import: `draslice --help` must not pay for importing kfp.
DEFAULT_TEMPLATE = "mig-1g-6gb"


@click.command("run")
@knob_options(DEMO.exposed, DEMO.defaults())
@click.option("--template", default=DEFAULT_TEMPLATE, show_default=True,
              help="Claim template named in the report (locally no claim is made).")
@click.option("--snapshot", type=click.Path(exists=True, dir_okay=False),
              help="Let preflight judge the cluster from this dump (`kubectl get deviceclasses,"
                   "resourceslices,resourceclaims,resourceclaimtemplates -A -o yaml`): the GPU "
                   "steps run only if the template could be allocated there.")
@click.option("--on-missing-dra", type=click.Choice(["skip", "fail"]), default="skip",
              show_default=True,
              help="With --snapshot: a cluster without DRA skips the GPU steps or fails the run.")
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Each run gets a timestamped folder here with every artifact.")
@click.option("--verbose", "-v", is_flag=True,
              help="Stream kfp.local's whole output (it always goes to kfp-local.log in the "
                   "run folder).")
@click.option("--sweep", metavar="FILE", type=click.Path(dir_okay=False),
              help="Run the sweep pipeline instead: FILE is a YAML or JSON list of runs, each "
                   "a mapping of knob values over the options above (e.g. '- {learning_rate: "
                   "0.001, lora_r: 4}'); prints the comparison and the best adapter.")
def run(**opts) -> None:
    """Run preflight -> smoke -> LoRA SFT -> validate locally with kfp.local.

    Every task runs in a subprocess of this Python (nothing is installed); the claim settings
    are ignored, so the tasks use this machine's CPU or GPU. Prints a line as each task starts
    and ends, the lines of the seed guide, the fine-tune's progress, then the verdict, the
    report (report.html) and the run folder. Exits 0 on PASS, 1 on FAIL, and when a task
    fails with its documented code: 2 bad input, 3 out of memory in the slice, 4 NaN loss.
    Bad input is refused before the first task: the options, the LoRA targets and rank on
    the model, a step too large for this device, a --snapshot file that cannot be read, a
    --runs-dir that cannot be written.

    \b
    Examples:
      draslice run                           # CPU or the local GPU, the guide's defaults
      draslice run --slice-memory-gib 6      # emulate a 1g.6gb-sized slice on a big GPU
      draslice run --lora-targets c_attn     # the guide's attention-only LoRA
      draslice run --snapshot dump.yaml      # preflight judges that cluster first
      draslice run --sweep runs.yaml         # one fine-tune per run, then compare them
    """
    params = _checked_params(opts)  # before kfp loads: bad input fails in a fraction of a second
    from draslice.local.run import new_run_dir, run_pipeline

    if opts["sweep"]:
        from draslice.local.sweep import run_command

        run_command(opts["sweep"], params, opts["runs_dir"], opts["template"], opts["verbose"])
    run_dir = new_run_dir(opts["runs_dir"])
    click.echo(f"run folder: {run_dir}")
    start = time.perf_counter()
    result = run_pipeline(run_dir, params, template=opts["template"], verbose=opts["verbose"])
    _summarize(result, time.perf_counter() - start)
    sys.exit(result.exit_code)


def _summarize(result, seconds: float) -> None:
    """The run's last lines: what it concluded, where to look, and, on a failure, which task
    failed and why (the exit code follows from it)."""
    click.echo("")
    pre = result.preflight or {}
    if pre.get("decision") == "skip":
        click.echo(f"preflight: skipped the GPU steps — {pre.get('reason', '')}")
        click.echo("verdict: none (no GPU step ran)")
    elif result.verdict_text:
        click.echo(result.verdict_text)
    if result.report_path:
        click.echo(f"report:     {result.report_path.as_uri()}")
    click.echo(f"log:        {result.log_path}")
    click.echo(f"run folder: {result.run_dir}")
    click.echo(f"pipeline {'succeeded' if result.succeeded else 'FAILED'} in {seconds:.1f} s")
    for failure in result.failures:
        click.echo(str(failure))


def _checked_params(opts: dict) -> dict:
    """Reject bad input here, before the first task starts (each task checks again): the
    knobs, what only this machine can answer, the snapshot file and the runs folder. A task
    that failed on any of them would say so only after the tasks before it (preflight and
    smoke: half a minute), with its own exit code."""
    validate_template_name(opts["template"])
    knobs = {k: opts[k] for k in DEMO.exposed}
    check_params(knobs, base=DEMO.values)  # torch-free and at once: a bad --lora-r exits 2
    # What only this machine can answer: is the device there, can it do bf16, can it be capped,
    # does a step fit it; and the model: its LoRA targets, built on the meta device.
    from draslice.trainer import budget, input_checks
    from draslice.trainer import device as dev
    from draslice.trainer.config import FINETUNE_KNOBS, SFTConfig

    cfg = SFTConfig.from_params({k: v for k, v in {**DEMO.values, **knobs}.items()
                                 if k in FINETUNE_KNOBS})
    torch_device = dev.resolve_device(knobs["device"])
    precision = dev.resolve_precision(knobs["precision"], torch_device)
    capped = dev.check_slice_cap(torch_device, knobs["slice_memory_gib"])
    info = dev.describe(torch_device, knobs["slice_memory_gib"] if capped else None)
    budget.check_synthetic_fits(cfg, precision, info.total_mem_gib, info.name)
    input_checks.check_lora(cfg)
    params = {**knobs, "on_missing_dra": opts["on_missing_dra"]}
    # Without a snapshot the local check runs ("none"); with one, preflight reads it, and a
    # file it cannot read is bad input now, in the snapshot's own words.
    params["preflight_source"] = "none"
    if opts["snapshot"]:
        from draslice.cluster.snapshot import load_snapshot

        load_snapshot(opts["snapshot"], lambda line: click.echo(line, err=True))
        params["preflight_source"] = str(Path(opts["snapshot"]).resolve())
    from draslice.trainer.outputs import check_writable_dir, remove_created

    # The check creates the folder to probe it; it is taken back, so that a refusal after it
    # (a sweep file's) leaves nothing behind: new_run_dir makes it when the run starts.
    created: list[Path] = []
    check_writable_dir(opts["runs_dir"], "runs_dir", created)
    remove_created(created)
    return params
