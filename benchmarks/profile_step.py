"""Where a step of our loop spends its time, on a peer benchmark's shape and cap.

    python benchmarks/profile_step.py --shape qwen2.5-1.5b --seq 2048 --batch 16 \
        --cap 1g.6gb [--offload] [--tile] [--compile default] [--skip 3] [--active 3]
    python benchmarks/profile_step.py --peer unsloth --shape qwen2.5-0.5b --seq 1024 ...

Runs ``draslice.trainer.sft.train`` as ``peer_trainers.py``'s ``ours`` runner does (the same
random-init model, packed rows, LoRA and cap; gradient checkpointing under a cap) inside
``torch.profiler`` and prints the timed steps' tokens/s from the loop's own metrics, then, over
``--active`` steps after ``--skip`` (model load, the first steps' allocations, autotuning and
cuDNN plans left out), the host and device time and the kernel launches a step, the operators
with the most of each, then the same by input shape (which tensors the copies and casts are
of). A step whose device time is well below its wall time is waiting on the host: the host
table says on what. ``--single`` and ``--checkpoint`` turn the switches of ``peer_trainers``'
``ours-offload-single``, ``ours-offload-reentrant`` and ``ours-offload-hooks``, for their
launches side by side. ``--peer`` profiles another trainer's step the same way (its step-end
callback steps the profiler; the tokens/s line is then the timed steps' from its clock), to
set its launches and kernels beside ours.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

# Unsloth patches transformers, peft and trl as it is imported: first, as in its peer's child.
if "--peer=unsloth" in sys.argv or any(
        a == "--peer" and b == "unsloth" for a, b in zip(sys.argv, sys.argv[1:], strict=False)):
    import unsloth  # noqa: F401

from draslice.benchmarks.peer_trainers import (  # noqa: E402
    CAPS,
    OTHERS,
    SHAPES,
    Clock,
    Ours,
    prepare,
    set_up_process,
    train_ours,
    train_peer,
    use_switches,
)
from draslice.trainer.config import COMPILE_MODES  # noqa: E402

# The runtime and driver calls that start work on the GPU (a graph's replay is one).
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaGraphLaunch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=("ours", *OTHERS),
                        default="ours", help="whose step: our loop (default) or another "
                        "trainer's, as peer_trainers.py runs it")
    parser.add_argument("--shape", choices=list(SHAPES), default="qwen2.5-1.5b")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--cap", choices=list(CAPS), default="1g.6gb")
    parser.add_argument("--offload", action="store_true", help="offload_activations")
    parser.add_argument("--tile", action="store_true", help="tile_mlp")
    parser.add_argument("--compile", choices=COMPILE_MODES, default="auto",
                        help="the loop's compile knob; under a cap (checkpointed) 'default' "
                             "compiles each layer inside its checkpoint")
    parser.add_argument("--single", action="store_true",
                        help="every LoRA projection alone (lora_fused's group=False)")
    parser.add_argument("--checkpoint", choices=("auto", "reentrant", "hooks"), default="auto",
                        help="torch's reentrant checkpoint or its non-reentrant one (saved-"
                             "tensor hooks) whatever the model; auto: the loop's choice "
                             "(grad_checkpointing.choose)")
    parser.add_argument("--skip", type=int, default=3, help="steps before the profiled ones")
    parser.add_argument("--active", type=int, default=3, help="steps profiled")
    parser.add_argument("--rows", type=int, default=25, help="operators per table")
    parser.add_argument("--model-root", default="/dev/shm/draslice-peers")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, the tiny Qwen2 shape, no cap (checks this script's own code)")
    args = parser.parse_args()
    if args.smoke:
        args.shape, args.seq, args.batch, args.cap = "smoke", 64, 4, "none"
        args.model_root = tempfile.mkdtemp(prefix="profile-smoke-")

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    root = Path(args.model_root)
    root.mkdir(parents=True, exist_ok=True)
    ctx = {"shape": SHAPES[args.shape], "seq": args.seq, "smoke": args.smoke,
           "cap": CAPS[args.cap], **prepare(args.shape, args.seq, root, smoke=args.smoke)}
    if args.peer != "ours":  # as peer_trainers' child does: the rows, the cap set here
        set_up_process(ctx)
    # The loop logs a step when it reads its loss, one step late on a GPU: the window lags the
    # steps by one, which leaves the per-step averages as they are.
    steps = args.skip + args.active + 1
    clock = Clock(1, steps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])
    window = schedule(wait=args.skip - 1, warmup=1, active=args.active, repeat=1)
    # Input shapes too: the third table tells which tensors the copies and casts are of.
    with profile(activities=activities, schedule=window, record_shapes=True) as prof:

        def on_line(line: str) -> None:
            if line.startswith("{'loss'"):  # a step's line (loglines.step_loss)
                prof.step()

        if args.peer == "ours":
            kind = {"auto": None, "reentrant": True, "hooks": False}[args.checkpoint]
            use_switches(Ours("profiled", lora_groups=not args.single, reentrant=kind))
            train_ours(ctx, args.batch, CAPS[args.cap] > 0, clock, offload=args.offload,
                       tile=args.tile, compile=args.compile, on_line=on_line)
        else:  # its step-end callback steps the window (one step earlier than ours: the same)
            clock.on_step = prof.step
            train_peer(args.peer, ctx, args.batch, CAPS[args.cap] > 0, clock)
    table = prof.key_averages()
    host = sum(e.self_cpu_time_total for e in table) / args.active / 1e6
    device = sum(e.self_device_time_total for e in table) / args.active / 1e6
    launches = sum(e.count for e in table if e.key in LAUNCHES) / args.active
    print(json.dumps({"timed_steps": steps - 1, "tokens_per_s": (steps - 1) * args.batch
                      * args.seq / clock.seconds(),
                      "step_seconds": clock.seconds() / (steps - 1),
                      "profiled_host_seconds_a_step": host,
                      "profiled_device_seconds_a_step": device,
                      "kernel_launches_a_step": launches,
                      "peak_reserved_gib": (torch.cuda.max_memory_reserved() / 1024**3
                                            if torch.cuda.is_available() else None)}))
    print(table.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))
    print(table.table(sort_by="self_device_time_total", row_limit=args.rows,
                      max_name_column_width=60))
    by_shape = prof.key_averages(group_by_input_shape=True)
    print(by_shape.table(sort_by="self_device_time_total" if torch.cuda.is_available()
                         else "self_cpu_time_total", row_limit=args.rows,
                         max_name_column_width=40, max_shapes_column_width=80))


if __name__ == "__main__":
    main()
