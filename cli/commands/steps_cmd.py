"""``draslice smoke`` and ``draslice train``: one pipeline step, outside KFP.

The same code the components run, for a plain Pod, Job or Kubeflow TrainJob that claims a
slice, and for trying one step on a workstation.
"""

from __future__ import annotations

import json

import click
from click.core import ParameterSource

from draslice.cli.error_output import JsonErrorCommand
from draslice.cli.knobs import flag, knob_options
from draslice.trainer import loglines
from draslice.trainer.config import FINETUNE_KNOBS, SFTConfig, check_params
from draslice.trainer.presets import FINETUNE
from draslice.trainer.torchrun_env import launched


@click.command("smoke", cls=JsonErrorCommand)
@knob_options(["device"])
@click.option("--matmul-size", type=click.IntRange(min=0), default=0, show_default=True,
              help="Square matmul size; 0 picks 8192 on a GPU, 1024 on the CPU.")
@knob_options(["slice_memory_gib"])
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON too.")
def smoke(device: str, matmul_size: int, slice_memory_gib: float, as_json: bool) -> None:
    """Print what the pod sees and run a checked, timed matmul on it.

    Prints the GPU-slicing guide's smoke pod lines (nvidia-smi -L, cuda_available, device,
    slice_total_mem_GiB, matmul_on_slice). Exits 1 if the matmul is wrong.
    """
    # The knobs' own checks, before torch loads: a bad --device answers at once.
    check_params({"device": device, "slice_memory_gib": slice_memory_gib})
    from draslice.trainer.tasks.smoke import run_smoke

    result = run_smoke(device=device, matmul_size=matmul_size, slice_memory_gib=slice_memory_gib)
    click.echo("\n".join(result.lines()))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    raise SystemExit(0 if result.ok else 1)


def _preset_words() -> str:
    """The finetune preset's values as ``--flag value`` words, for --help."""
    return ", ".join(f"{flag(k)}" if v is True else f"{flag(k)} {v}"
                     for k, v in FINETUNE.fill({}, FINETUNE_KNOBS).items())


TRAIN_HELP = f"""LoRA SFT on this pod's device; ends with 'DRA LoRA SFT on GPU slice: OK' on a GPU.

    Without --model-dir/--data it is the GPU-slicing guide's training script: a small GPT-2-style
    model built from a config, trained on learnable synthetic data, from the defaults shown
    below. With them it fine-tunes your model on your data (loss on completion / assistant
    tokens only), offline, starting from the finetune pipeline's preset for every option you
    do not pass: {_preset_words()} (with --steps, the warmup stays
    {FINETUNE.values["warmup_steps"] / FINETUNE.values["steps"]:.0%} of them). The
    configuration a run starts with is printed once, first.

    \b
    Examples:
      draslice train --output-dir out                         # synthetic, about a minute
      draslice train --output-dir out --model-dir /data/qwen2.5-1.5b \\
          --data /data/train.jsonl --max-length 1024 --pack \\
          --gradient-checkpointing --checkpoint-every 100 --merge
      draslice train ... --load-in-4bit --slice-memory-gib 11.5   # 7B QLoRA in a 2g.12gb
    """


def train_config(ctx: click.Context) -> tuple[SFTConfig, str]:
    """The config a parsed ``draslice train`` command line runs with, and where its values
    come from: the options passed, then for a real fine-tune the finetune preset, then the
    config's defaults (the synthetic demo's)."""
    knobs = {k: v for k, v in ctx.params.items() if k in FINETUNE_KNOBS}
    given = {k: v for k, v in knobs.items() if ctx.get_parameter_source(k) not in
             (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)}
    if not (knobs["model_dir"] or knobs["data"]):
        return SFTConfig.from_params(knobs), "the demo defaults"
    filled = FINETUNE.fill(given, FINETUNE_KNOBS)  # the finetune pipeline's start
    return SFTConfig.from_params({**knobs, **filled}), "the finetune preset where not passed"


@click.command("train", cls=JsonErrorCommand, help=TRAIN_HELP)
@click.option("--output-dir", required=True, type=click.Path(file_okay=False),
              help="Where the adapter, metrics.jsonl, checkpoints/ and merged/ are written. "
                   "Rerunning with the same output resumes from its newest checkpoint.")
@knob_options(FINETUNE_KNOBS)
@click.option("--json", "as_json", is_flag=True,
              help="End with one JSON line of the result (tokens_per_s, warmup_seconds, "
                   "wall_seconds, peak_mem_gib, ...).")
@click.pass_context
def train(ctx: click.Context, output_dir: str, as_json: bool, **_knobs) -> None:
    from pathlib import Path

    from draslice.trainer.input_checks import check_early

    cfg, origin = train_config(ctx)  # bad input fails here, before torch is imported
    if launched()[0] == 0:  # torchrun's other processes would print the same line
        click.echo(loglines.effective_config(origin, cfg.in_use()))
    check_early(cfg, output_dir)  # and a bad folder or file here
    from draslice.trainer.sft import train as run_train

    result = run_train(cfg, output_dir, Path(output_dir) / "metrics.jsonl")
    if as_json:
        summary = result.to_dict()
        summary["device"] = result.device["name"]
        click.echo(json.dumps(summary))
