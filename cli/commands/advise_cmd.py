"""``draslice advise``: the smallest slice a fine-tune fits, measured."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from draslice.cli.error_output import JsonErrorCommand
from draslice.cli.knobs import knob_options
from draslice.trainer.config import SFTConfig, VerdictConfig

if TYPE_CHECKING:  # the command's import stays light: `draslice --help` lists it
    from draslice.sizing.advise import Advice
    from draslice.sizing.profiles import SliceProfile

# The fine-tune knobs that change how much memory a run needs; advise measures with them.
ADVISE_KNOBS = ("model_dir", "data", "data_format", "max_length", "seq_len", "batch_size",
                "lora_r", "lora_alpha", "lora_targets", "gradient_checkpointing",
                "bf16_weights", "load_in_4bit", "pack", "device", "precision")

# Literal, not imported: `draslice --help` must not pay for importing torch.
GPU_CHOICES = ["all", "A30-24GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB",
               "B200-180GB"]


@click.command("advise", cls=JsonErrorCommand)
@knob_options(ADVISE_KNOBS)
@click.option("--gpu", type=click.Choice(GPU_CHOICES, case_sensitive=False), default="all",
              show_default=True, help="Which GPU model's MIG profiles to choose from.")
@click.option("--snapshot", "snapshot_file", type=click.Path(dir_okay=False),
              help="Choose from the slices a cluster dump publishes (the file `draslice "
                   "preflight --snapshot` reads) instead of the built-in table; slices with none "
                   "free are never chosen.")
@click.option("--cluster", "live", is_flag=True,
              help="Choose from the slices the cluster publishes now (kubeconfig or in-cluster).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="For --cluster.")
@click.option("--context", help="Kubeconfig context for --cluster.")
@knob_options(["memory_headroom"])
@click.option("--measure-steps", type=click.IntRange(min=1), default=3, show_default=True,
              help="Optimizer steps of each measured run (a few suffice: the optimizer's "
                   "state exists after the first).")
@click.option("--peak-gib", type=float, default=None,
              help="Skip the measurement and recommend for this peak (GiB).")
@click.option("--no-knob-trials", is_flag=True,
              help="List the levers for the next smaller profile without measuring them.")
@click.option("--json", "as_json", is_flag=True, help="Print the advice as JSON.")
@click.option("--verbose", "-v", is_flag=True,
              help="List every profile (by default, with several GPU models, each model's "
                   "profiles around the peak), and say what each time estimate rests on and "
                   "what it leaves out.")
def advise(gpu: str, snapshot_file: str | None, live: bool, kubeconfig: str | None,
           context: str | None, memory_headroom: float, measure_steps: int,
           peak_gib: float | None, no_knob_trials: bool, as_json: bool, verbose: bool,
           **knobs) -> None:
    """Measure a fine-tune's peak memory and recommend the smallest slice that holds it.

    Runs a few steps of your config on this machine's GPU with every batch padded to
    --max-length (the worst case), reads the peak, and picks the smallest MIG profile whose
    memory less the headroom holds it, from a built-in table per GPU model (memory figures
    not confirmed from a capture are marked 'estimated'). Then it tries the memory levers
    you are not using yet, one at a time, until the next smaller profile fits, and prints
    what each one measured.

    On a GPU it also estimates time: the measured step scaled by each profile's share of
    the SMs (published by the cluster, or the MIG profile's compute fraction), so you see
    how long --steps would take on the recommended slice and what each lever costs there.
    An estimate, not a measurement on a slice: --verbose says what it leaves out.

    \b
    Examples:
      draslice advise --model-dir /data/qwen2.5-1.5b --data /data/train.jsonl \\
          --max-length 1024 --gpu H100-80GB
      draslice advise --peak-gib 5.1 --gpu A30-24GB        # no measurement
      draslice advise --peak-gib 5.1 --snapshot dump.yaml  # the slices your cluster has
    """
    from draslice.sizing.profiles import candidates, check_peak

    cfg = SFTConfig.from_params(knobs)  # bad input fails here, before torch is imported
    VerdictConfig(memory_headroom=memory_headroom)
    if peak_gib is not None:
        check_peak(peak_gib)
    from draslice.sizing.advise import advise as run_advise

    if snapshot_file or live:
        pool = cluster_candidates(snapshot_file or "live", kubeconfig, context)
    else:
        pool = candidates(gpu)
    advice = run_advise(cfg, pool, headroom=memory_headroom, steps=measure_steps,
                        peak_gib=peak_gib,
                        try_knobs=not no_knob_trials)
    if as_json:
        click.echo(json.dumps(advice.to_dict(), indent=2))
        return
    click.echo("\n".join(render(advice, verbose)))


def cluster_candidates(source: str, kubeconfig: str | None, context: str | None) -> list:
    """The slice profiles a cluster (or its dump) publishes, through the preflight code."""
    from draslice.cluster.analysis import published_slices
    from draslice.cluster.preflight import read_snapshot
    from draslice.errors import DrasliceError
    from draslice.sizing.profiles import from_published

    found = from_published(published_slices(read_snapshot(source, None, kubeconfig, context)))
    if not found:
        where = "the cluster" if source == "live" else source
        raise DrasliceError(f"{where}: no GPU or MIG device of gpu.nvidia.com is published; "
                            "nothing to choose from (drop --snapshot/--cluster for the table)")
    return found


def _time_lines(advice: Advice, profile: SliceProfile, verbose: bool) -> list[str]:
    """How long the run's steps would take on ``profile``: the estimate and its basis."""
    from draslice.sizing.timing import Pace, duration

    found = advice.pace(profile)
    if not isinstance(found, Pace):
        return [f"  time: {found}"]
    step = advice.step
    lines = [f"  time: ~{found.step_s:.2f} s a step, ~{found.tokens_per_s:,.0f} tokens/s; "
             f"{advice.run_steps} steps (--steps) in ~{duration(found.run_s)}",
             f"    estimated: {step.steady_s:.3f} s a step measured on {step.device}, scaled to "
             f"{found.basis}"]
    if verbose:
        lines += ["    left out: the slice's share of memory bandwidth and L2 (a memory-bound "
                  "step loses more);",
                  "      SMs idle on the whole GPU (a small model or batch loses less); "
                  "evaluation, checkpoints, export;",
                  "      a MIG compute slice's own SM count (an A100's 1g has 14 of 108, not "
                  "15.4). Not checked on a real slice."]
    else:
        lines.append("    (--verbose: what the estimate leaves out)")
    return lines


def boundary(ranked: list[tuple[SliceProfile, bool]], *always: SliceProfile | None
             ) -> list[tuple[SliceProfile, bool]]:
    """Where the peak falls on each GPU model: its largest profile that does not fit and its
    smallest that does, and ``always`` (the chosen one: on a cluster the smallest fit may
    have none free), in ``ranked``'s order. With one GPU model's few profiles, all of them."""
    if len({profile.gpu for profile, _ in ranked}) <= 1:
        return ranked
    keep: dict[tuple[str, bool], SliceProfile] = {}
    for profile, fits in ranked:  # smallest first: the last miss, the first fit
        if not fits or (profile.gpu, True) not in keep:
            keep[(profile.gpu, fits)] = profile
    kept = {id(p) for p in (*keep.values(), *always) if p is not None}
    return [(p, fits) for p, fits in ranked if id(p) in kept]


def render(advice: Advice, verbose: bool = False) -> list[str]:
    """The advice as lines for a terminal."""
    from draslice.sizing.timing import Pace

    rec = advice.recommendation
    source = advice.device if advice.measured else "given with --peak-gib, not measured"
    lines = [f"peak memory: {advice.peak_gib:.2f} GiB ({'measured on ' if advice.measured else ''}"
             f"{source})"]
    if not advice.on_cuda:
        lines.append("  note: on the CPU this is the process's peak resident memory (Python, "
                     "torch and the model), not GPU memory; measure on a GPU for a real fit")
    lines.append(f"rule: peak <= slice memory less {rec.headroom:.0%} headroom")
    shown = rec.ranked if verbose else boundary(rec.ranked, rec.chosen, rec.next_smaller)
    lines.append("profiles (smallest first):" if len(shown) == len(rec.ranked) else
                 "profiles (smallest first; for each GPU model the largest that does not fit "
                 "and the smallest that does):")
    for profile, fits in shown:
        mark = "fits" if fits else "    "
        note = " (estimated)" if profile.estimated else ""
        free = f", {profile.free} free" if profile.free is not None else ""
        found = advice.pace(profile)
        speed = f"  ~{found.tokens_per_s:,.0f} tokens/s" if isinstance(found, Pace) else ""
        lines.append(f"  {mark}  {profile.label:<22} {profile.memory_gib:7.2f} GiB{note}{free}"
                     f"{speed}")
    if len(shown) < len(rec.ranked):
        lines.append(f"  ({len(rec.ranked) - len(shown)} more: --verbose lists every profile, "
                     "--gpu MODEL one GPU model's)")
    if rec.chosen:
        c = rec.chosen
        lines.append(f"recommended: {c.label} ({c.memory_gib:.2f} GiB"
                     f"{', estimated' if c.estimated else ''})")
        lines += _time_lines(advice, c, verbose)
    else:
        lines.append("recommended: none of these profiles holds the peak; use a whole GPU or "
                     "the levers below")
    if rec.next_smaller:
        n = rec.next_smaller
        lines.append(f"to fit the next smaller profile, {n.label} ({n.memory_gib:.2f} GiB):")
        for trial in advice.trials:
            knobs = " ".join(trial.knobs)
            if trial.peak_gib is None:
                lines.append(f"  {knobs}: {trial.note or 'not measured'}")
            else:
                verdict = "fits" if trial.fits else "does not fit"
                found = trial.pace(n, advice.run_steps)
                time = (f", ~{found.step_s:.2f} s a step there" if isinstance(found, Pace)
                        else "")
                lines.append(f"  {knobs}: peak {trial.peak_gib:.2f} GiB, {verdict}{time}")
        for knob in advice.untested_knobs:
            lines.append(f"  try {knob}")
        if not advice.trials and not advice.untested_knobs:
            lines.append("  no lever left to try: every one is already in use")
    return lines
