"""``draslice smoke`` and ``draslice train``: one pipeline step, outside KFP.

The same code the components run, for a plain Pod, Job or Kubeflow TrainJob that claims a
slice, and for trying one step on a workstation.
"""

from __future__ import annotations

import json

import click


@click.command("smoke")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--matmul-size", type=int, default=0, show_default=True,
              help="Square matmul size; 0 picks 8192 on a GPU, 1024 on the CPU.")
@click.option("--slice-memory-gib", type=float, default=0.0, show_default=True,
              help="Emulate a slice of N GiB on a bigger GPU (0: no cap).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON too.")
def smoke(device: str, matmul_size: int, slice_memory_gib: float, as_json: bool) -> None:
    """Print what the pod sees and run a checked, timed matmul on it.

    Prints the seed smoke pod's lines (nvidia-smi -L, cuda_available, device,
    slice_total_mem_GiB, matmul_on_slice). Exits 1 if the matmul is wrong.
    """
    from draslice.trainer.smoke import run_smoke

    result = run_smoke(device=device, matmul_size=matmul_size, slice_memory_gib=slice_memory_gib)
    click.echo("\n".join(result.lines()))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    raise SystemExit(0 if result.ok else 1)


@click.command("train")
@click.option("--output-dir", required=True, type=click.Path(file_okay=False),
              help="Where the adapter and metrics.jsonl are written.")
@click.option("--device", default="auto", show_default=True)
@click.option("--precision", default="auto", show_default=True, help="auto, bf16 or fp32.")
@click.option("--slice-memory-gib", type=float, default=0.0, show_default=True)
@click.option("--steps", type=int, default=30, show_default=True)
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--seq-len", type=int, default=64, show_default=True)
@click.option("--learning-rate", type=float, default=3e-3, show_default=True)
@click.option("--lora-r", type=int, default=8, show_default=True)
@click.option("--lora-alpha", type=int, default=16, show_default=True)
@click.option("--lora-targets", default="c_attn,c_proj,c_fc", show_default=True)
@click.option("--log-every", type=int, default=10, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def train(output_dir: str, seq_len: int, **opts) -> None:
    """LoRA SFT on this pod's device; ends with 'DRA LoRA SFT on GPU slice: OK' on a GPU.

    The seed guide's training script as a command: builds a small GPT-2-style model from a
    config, trains a LoRA adapter on learnable synthetic data, saves it with save_pretrained.
    """
    from pathlib import Path

    from draslice.trainer.model import ModelShape
    from draslice.trainer.sft import SFTConfig
    from draslice.trainer.sft import train as run_train

    cfg = SFTConfig(shape=ModelShape(seq_len=seq_len), **opts)
    run_train(cfg, output_dir, Path(output_dir) / "metrics.jsonl")
