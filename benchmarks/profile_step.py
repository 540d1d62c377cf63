"""Where a step of our loop spends its time, on a peer benchmark's shape and cap.

    python benchmarks/profile_step.py --shape qwen2.5-1.5b --seq 2048 --batch 16 \
        --cap 1g.6gb [--offload] [--tile] [--steps 6]

Runs ``draslice.trainer.sft.train`` as ``peer_trainers.py``'s ``ours`` runner does (the same
random-init model, packed rows, LoRA and cap; gradient checkpointing under a cap) inside
``torch.profiler`` and prints each step's time from the loop's own metrics, then the operators
with the most host time and the most device time. A step whose device time is well below its
wall time is waiting on the host: the host table says on what.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from peer_trainers import CAPS, SHAPES, _Clock, _train_ours, prepare  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="qwen2.5-1.5b")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--cap", choices=list(CAPS), default="1g.6gb")
    parser.add_argument("--offload", action="store_true", help="offload_activations")
    parser.add_argument("--tile", action="store_true", help="tile_mlp")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rows", type=int, default=25, help="operators per table")
    parser.add_argument("--model-root", default="/dev/shm/draslice-peers")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    root = Path(args.model_root)
    root.mkdir(parents=True, exist_ok=True)
    ctx = {"shape": SHAPES[args.shape], "seq": args.seq, "smoke": False,
           "cap": CAPS[args.cap], **prepare(args.shape, args.seq, root, smoke=False)}
    clock = _Clock(1, args.steps)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        _train_ours(ctx, args.batch, CAPS[args.cap] > 0, clock, offload=args.offload,
                    tile=args.tile)
    print(json.dumps({"timed_seconds": clock.given, "steps": args.steps - 1,
                      "tokens_per_s": (args.steps - 1) * args.batch * args.seq / clock.given,
                      "peak_reserved_gib": torch.cuda.max_memory_reserved() / 1024**3}))
    table = prof.key_averages()
    print(table.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))
    print(table.table(sort_by="self_cuda_time_total", row_limit=args.rows,
                      max_name_column_width=60))


if __name__ == "__main__":
    main()
