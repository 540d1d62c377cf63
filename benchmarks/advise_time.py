"""Whether `draslice advise`'s probe gives the real run's step time, on a whole GPU.

What of advise's time estimate a whole GPU can check.

    python benchmarks/advise_time.py --shape qwen2.5-1.5b --seq 2048 [--batch 8] [--steps 60]
        [--gradient-checkpointing] [--smoke] [--json-out FILE]

`advise` runs a few steps of a config with every batch padded to ``max_length`` and scales
their steady step (the median after the first) to a slice's share of the SMs
(``sizing/timing.py``). The scaling needs an SM-capped GPU to check, which the H200 measured
could not give (docs/benchmarks.md, green contexts); the step it scales can be
checked on any GPU. This runs advise's own probe (``sizing.advise.measure``) and then the real
run of the same config (packed rows of one width, ``--steps`` steps) on the same device, in one
process, and prints:

- the probe's steady step against the real run's, and their ratio;
- advise's estimate of the real run's step time on the whole GPU
  (``MeasuredStep.run_seconds``: the probe's first-step set-up once, then ``--steps`` steady
  steps) against the sum of the real run's step times, and their ratio.

The real run comes second in the same process, so its first step finds caches warm (cuBLAS,
Triton, compiled code): its first step is shorter than a fresh process's would be, which the
comparison of whole run times leans on; the steady steps do not depend on it.
Shapes and data: ``peer_trainers.py``'s (random init from the published configs, LoRA r=16 on
every linear projection, bf16 weights; ``llama-7b`` is 4-bit QLoRA).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from draslice.benchmarks.childproc import write_json
from draslice.benchmarks.peer_trainers import LORA_ALPHA, LORA_R, SHAPES, TARGETS, prepare


def config(inputs: dict, shape: str, seq: int, batch: int, steps: int, checkpointing: bool,
           device: str):
    """The user's config: packed rows of ``seq`` tokens, every other knob at its default."""
    from draslice.trainer.config import SFTConfig

    quantized = SHAPES[shape].quantized
    return SFTConfig(
        model_dir=inputs["model_dir"], data=inputs["data"], data_format="prompt-completion",
        max_length=seq, pack=True, batch_size=batch, steps=steps, lora_r=LORA_R,
        lora_alpha=LORA_ALPHA, lora_targets=",".join(TARGETS), bf16_weights=not quantized,
        load_in_4bit=quantized, gradient_checkpointing=checkpointing, log_every=steps,
        eval_fraction=0.0, device=device)


def real_run(cfg) -> tuple:
    """The run as `draslice train` makes it: its result, its measured steps and its metrics."""
    from draslice.sizing.advise import trained
    from draslice.sizing.timing import MeasuredStep

    result, records = trained(cfg)
    return result, MeasuredStep.from_run(records, result.device), records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=[s for s in SHAPES if s != "smoke"],
                        default="qwen2.5-1.5b")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=0,
                        help="rows a step (default: 16,384 tokens a step)")
    parser.add_argument("--steps", type=int, default=60, help="steps of the real run")
    parser.add_argument("--probe-steps", type=int, default=3,
                        help="steps of advise's probe (its --measure-steps)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny Qwen2 shape")
    parser.add_argument("--model-root", default="/dev/shm/draslice-peers")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if args.probe_steps < 2:
        parser.error("--probe-steps must be 2 or more: the estimate needs a steady step")
    from draslice.sizing.advise import measure

    shape, device = args.shape, "cuda"
    if args.smoke:
        shape, device, args.seq, args.batch, args.steps = "smoke", "cpu", 64, 4, 6
        args.model_root = tempfile.mkdtemp(prefix="advise-time-smoke-")
    batch = args.batch or max(1, 16384 // args.seq)
    root = Path(args.model_root)
    root.mkdir(parents=True, exist_ok=True)
    inputs = prepare(shape, args.seq, root, args.smoke)
    cfg = config(inputs, shape, args.seq, batch, args.steps, args.gradient_checkpointing, device)

    _probe_result, probe = measure(cfg, args.probe_steps)
    print(f"advise's probe ({args.probe_steps} steps, {batch} x {args.seq}, padded): first "
          f"{probe.first_s:.3f} s, steady {probe.steady_s:.4f} s a step on {probe.device}",
          flush=True)
    result, real, records = real_run(cfg)
    real_steps_s = sum(r["step_seconds"] for r in records)
    estimate_s = probe.run_seconds(args.steps)
    step_ratio, run_ratio = probe.steady_s / real.steady_s, estimate_s / real_steps_s
    print(f"real run ({args.steps} steps, packed): first {real.first_s:.3f} s, steady "
          f"{real.steady_s:.4f} s a step, {result.tokens_per_s:,.0f} tokens/s")
    print(f"steady step: advise {probe.steady_s:.4f} s / real {real.steady_s:.4f} s = "
          f"{step_ratio:.3f}x")
    print(f"{args.steps} steps: advise's estimate {estimate_s:.2f} s / real {real_steps_s:.2f} s "
          f"= {run_ratio:.3f}x")
    if args.json_out:
        write_json(args.json_out, {
            "shape": shape, "seq": args.seq, "batch": batch, "steps": args.steps,
            "gradient_checkpointing": args.gradient_checkpointing, "device": result.device,
            "probe": probe.__dict__, "real": real.__dict__, "real_steps_s": real_steps_s,
            "estimate_s": estimate_s, "step_ratio": step_ratio, "run_ratio": run_ratio})


if __name__ == "__main__":
    main()
