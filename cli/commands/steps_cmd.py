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
              help="Where the adapter, metrics.jsonl, checkpoints/ and merged/ are written. "
                   "Rerunning with the same output resumes from its newest checkpoint.")
@click.option("--model-dir", default="", type=click.Path(),
              help="Base model: a local Hugging Face directory (config.json, weights, "
                   "tokenizer). Nothing is downloaded. Omit for the synthetic GPT-2 run.")
@click.option("--data", default="", type=click.Path(),
              help="Training data: JSONL of prompt/completion or of chat messages, or a "
                   "directory saved by datasets' save_to_disk. Needs --model-dir.")
@click.option("--data-format", type=click.Choice(["auto", "prompt-completion", "chat",
                                                  "datasets"]),
              default="auto", show_default=True, help="auto reads the first record's columns.")
@click.option("--max-length", type=int, default=512, show_default=True,
              help="Tokens per example (or per packed row); longer ones are cut.")
@click.option("--pack", is_flag=True, help="Pack examples into full --max-length rows.")
@click.option("--eval-fraction", type=float, default=0.0, show_default=True,
              help="Hold out this fraction for an eval loss, logged at every log step.")
@click.option("--gradient-checkpointing", is_flag=True,
              help="Recompute activations in backward: less memory, ~30% slower.")
@click.option("--bf16-weights", is_flag=True, help="Keep the frozen base in bf16 (half of fp32).")
@click.option("--load-in-4bit", is_flag=True,
              help="QLoRA: a 4-bit NF4 base through bitsandbytes (pip install 'draslice[qlora]'; "
                   "GPU or CPU).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--precision", default="auto", show_default=True, help="auto, bf16 or fp32.")
@click.option("--slice-memory-gib", type=float, default=0.0, show_default=True,
              help="Emulate a slice of N GiB on a bigger GPU by capping CUDA memory (0: none).")
@click.option("--steps", type=int, default=30, show_default=True, help="Optimizer steps.")
@click.option("--batch-size", type=int, default=8, show_default=True,
              help="Examples (or packed rows) per step.")
@click.option("--seq-len", type=int, default=64, show_default=True,
              help="Sequence length of the synthetic run (a real run uses --max-length).")
@click.option("--learning-rate", type=float, default=3e-3, show_default=True,
              help="AdamW rate. The default suits the synthetic run; for a pretrained model "
                   "1e-4 to 3e-4 with --warmup-steps is the usual LoRA range.")
@click.option("--compile", type=click.Choice(["off", "default", "reduce-overhead"]),
              default="off", show_default=True,
              help="torch.compile the transformer body: faster steps after a one-off compile "
                   "(tens of seconds), worth it for long runs. reduce-overhead also replays "
                   "each pass as a CUDA graph (GPU only; one graph per batch shape, so use it "
                   "with --pack or the synthetic run). Measured on GPT-2 shapes; with "
                   "--load-in-4bit it is not measured yet.")
@click.option("--lr-schedule", type=click.Choice(["constant", "cosine"]), default="constant",
              show_default=True, help="After warmup: keep the rate, or decay it to 0.")
@click.option("--warmup-steps", type=int, default=0, show_default=True,
              help="Raise the learning rate linearly over the first N steps.")
@click.option("--lora-r", type=int, default=8, show_default=True)
@click.option("--lora-alpha", type=int, default=16, show_default=True)
@click.option("--lora-targets", default="auto", show_default=True,
              help="auto (GPT-2: c_attn,c_proj,c_fc; Llama/Qwen2/Mistral: q,k,v,o,gate,up,"
                   "down projections) or a comma-separated list of module names.")
@click.option("--checkpoint-every", type=int, default=0, show_default=True,
              help="Write an atomic checkpoint every N steps (0: none).")
@click.option("--checkpoint-dir", default="", type=click.Path(file_okay=False),
              help="Where checkpoints go (default: OUTPUT_DIR/checkpoints).")
@click.option("--merge", is_flag=True,
              help="Also save the base with the adapter merged in (OUTPUT_DIR/merged), with "
                   "the tokenizer: it loads as a plain Hugging Face model.")
@click.option("--log-every", type=int, default=10, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True,
              help="End with one JSON line of the result (tokens_per_s, peak_mem_gib, ...).")
def train(output_dir: str, seq_len: int, as_json: bool, **opts) -> None:
    """LoRA SFT on this pod's device; ends with 'DRA LoRA SFT on GPU slice: OK' on a GPU.

    Without --model-dir/--data it is the seed guide's training script: a small GPT-2-style
    model built from a config, trained on learnable synthetic data. With them it fine-tunes
    your model on your data (loss on completion / assistant tokens only), offline.

    \b
    Examples:
      draslice train --output-dir out                         # synthetic, about a minute
      draslice train --output-dir out --model-dir /data/qwen2.5-1.5b \\
          --data /data/train.jsonl --max-length 1024 --pack --eval-fraction 0.05 \\
          --gradient-checkpointing --bf16-weights --checkpoint-every 100 --merge
      draslice train ... --load-in-4bit --slice-memory-gib 11.5   # 7B QLoRA in a 2g.12gb
    """
    from pathlib import Path

    from draslice.trainer.model import ModelShape
    from draslice.trainer.sft import SFTConfig
    from draslice.trainer.sft import train as run_train

    cfg = SFTConfig(shape=ModelShape(seq_len=seq_len), **opts)
    result = run_train(cfg, output_dir, Path(output_dir) / "metrics.jsonl")
    if as_json:
        summary = result.to_dict()
        summary["device"] = result.device["name"]
        click.echo(json.dumps(summary))
