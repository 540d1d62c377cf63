"""``draslice run``: the whole pipeline on this machine, no cluster."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from draslice.cluster.names import validate_template_name

# Literal defaults, not imports: `draslice --help` must not pay for importing torch.
DEFAULT_TEMPLATE = "mig-1g-6gb"
DEFAULT_LORA_TARGETS = "c_attn,c_proj,c_fc"
DEFAULT_HEADROOM = 0.1


@click.command("run")
@click.option("--device", default="auto", show_default=True,
              help="auto, cpu, cuda or cuda:N.")
@click.option("--precision", default="auto", show_default=True,
              help="auto (bf16 where supported, else fp32), bf16 or fp32.")
@click.option("--slice-memory-gib", type=float, default=0.0, show_default=True,
              help="Emulate a slice of N GiB on a bigger local GPU by capping CUDA memory "
                   "(0: no cap). The report then compares against N.")
@click.option("--steps", type=int, default=30, show_default=True, help="Optimizer steps.")
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--seq-len", type=int, default=64, show_default=True)
@click.option("--learning-rate", type=float, default=3e-3, show_default=True)
@click.option("--lora-r", type=int, default=8, show_default=True)
@click.option("--lora-alpha", type=int, default=16, show_default=True)
@click.option("--lora-targets", default=DEFAULT_LORA_TARGETS, show_default=True,
              help="Comma-separated modules; the seed guide's choice is c_attn.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--memory-headroom", type=float, default=DEFAULT_HEADROOM,
              show_default=True, help="Fraction of the slice validate keeps free.")
@click.option("--min-loss-drop", type=float, default=0.3, show_default=True,
              help="Fraction by which the loss must fall for a PASS.")
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
def run(**opts) -> None:
    """Run preflight -> smoke -> LoRA SFT -> validate locally with kfp.local.

    Every task runs in a subprocess of this Python (nothing is installed); the claim settings
    are ignored, so the tasks use this machine's CPU or GPU. Prints the run folder and the
    verdict; exits 0 on PASS, 1 on FAIL, 2 on bad input.

    \b
    Examples:
      draslice run                           # CPU or the local GPU, seed defaults
      draslice run --slice-memory-gib 6      # emulate a 1g.6gb-sized slice on a big GPU
      draslice run --lora-targets c_attn     # the seed guide's attention-only LoRA
      draslice run --snapshot dump.yaml      # preflight judges that cluster first
    """
    from draslice.pipelines.local_run import new_run_dir, run_pipeline

    params = _checked_params(opts)
    run_dir = new_run_dir(opts["runs_dir"])
    click.echo(f"run folder: {run_dir}")
    start = time.perf_counter()
    result = run_pipeline(run_dir, params, template=opts["template"])
    seconds = time.perf_counter() - start
    click.echo("")
    click.echo(f"run folder: {run_dir}")
    if result.report_path:
        click.echo(f"report:     {result.report_path}")
    pre = result.preflight or {}
    if pre.get("decision") == "skip":
        click.echo(f"preflight: skipped the GPU steps — {pre.get('reason', '')}")
        click.echo("verdict: none (no GPU step ran)")
    else:
        click.echo(result.verdict or "verdict: none (the pipeline stopped before validate)")
    click.echo(f"pipeline {'succeeded' if result.succeeded else 'FAILED'} in {seconds:.1f} s")
    sys.exit(0 if result.succeeded else 1)


def _checked_params(opts: dict) -> dict:
    """Reject bad input here, before the first task starts (each task checks again)."""
    from draslice.errors import InvalidParameter
    from draslice.trainer import budget
    from draslice.trainer import device as dev
    from draslice.trainer.model import ModelShape
    from draslice.trainer.sft import SFTConfig

    validate_template_name(opts["template"])
    cfg = SFTConfig(
        shape=ModelShape(seq_len=opts["seq_len"]),
        lora_r=opts["lora_r"],
        lora_alpha=opts["lora_alpha"],
        lora_targets=opts["lora_targets"],
        batch_size=opts["batch_size"],
        steps=opts["steps"],
        learning_rate=opts["learning_rate"],
        seed=opts["seed"],
        device=opts["device"],
        precision=opts["precision"],
        slice_memory_gib=opts["slice_memory_gib"],
    )
    cfg.check()
    torch_device = dev.resolve_device(cfg.device)
    dev.resolve_precision(cfg.precision, torch_device)
    dev.check_slice_cap(torch_device, cfg.slice_memory_gib)
    budget.check_headroom(opts["memory_headroom"])
    if not 0.0 <= opts["min_loss_drop"] < 1.0:
        raise InvalidParameter("min_loss_drop", opts["min_loss_drop"], "must be in [0, 1)")
    keys = ("device", "precision", "slice_memory_gib", "steps", "batch_size", "seq_len",
            "learning_rate", "lora_r", "lora_alpha", "lora_targets", "seed",
            "memory_headroom", "min_loss_drop", "on_missing_dra")
    params = {k: opts[k] for k in keys}
    # Without a snapshot the local check runs ("none"); with one, preflight reads it.
    params["preflight_source"] = str(Path(opts["snapshot"]).resolve()) if opts["snapshot"] \
        else "none"
    return params
