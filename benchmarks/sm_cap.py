"""Can an emulated slice be given a slice's share of the GPU's compute, not only its memory?

    python benchmarks/sm_cap.py [--sms 32,64] [--json-out FILE]

A memory cap on a big GPU (``trainer/device.py``) leaves every SM to the job; a real MIG
``1g`` slice has a fraction of them. CUDA green contexts (``torch.cuda.green_contexts``,
PyTorch >= 2.9) run a process's work on a subset of the SMs without touching the GPU's
settings (no MIG mode, no MPS daemon). This measures, in one run, a bf16 matmul (compute
bound) and a device-to-device copy (bandwidth bound) on all SMs and inside green contexts of
``--sms`` SMs each, and prints each figure's ratio to the whole GPU next to the SM share.
Each SM count runs in its own process: a green context is set for the rest of a process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from draslice.benchmarks.childproc import write_json

WAYS = ("init-set-stream", "stream-only", "set-only")


def enter_green_context(sms: int, way: str = WAYS[0]) -> None:
    """Run the rest of this process on ``sms`` SMs through a CUDA green context.

    ``way``: how the context is entered (PyTorch's API is beta and which use works depends on
    its version): ``init-set-stream`` initialises CUDA, makes the green context current and
    its stream the current stream; ``stream-only`` only switches to its stream; ``set-only``
    only makes it current.
    """
    import torch
    from torch.cuda.green_contexts import GreenContext

    if way != "set-only":
        torch.cuda.init()
        torch.empty(1, device="cuda")
    ctx = GreenContext.create(num_sms=sms, device_id=0)
    if way != "stream-only":
        ctx.set_context()
    if way != "set-only" and hasattr(ctx, "Stream"):
        torch.cuda.set_stream(ctx.Stream())


def measure(sms: int, way: str) -> dict:
    import torch

    if sms:
        enter_green_context(sms, way)
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def timed(fn, reps: int) -> float:
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    matmul_s = timed(lambda: a @ b, 10)
    copy_s = timed(lambda: dst.copy_(src), 10)
    return {"sms": sms or torch.cuda.get_device_properties(0).multi_processor_count,
            "matmul_tflops": 2 * n**3 / matmul_s / 1e12,
            "copy_tb_s": 2 * src.numel() / copy_s / 1e12}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sms", default="32,64", help="SM counts to try (comma separated)")
    parser.add_argument("--json-out")
    parser.add_argument("--child", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--way", default=WAYS[0], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child >= 0:
        print(json.dumps({**measure(args.child, args.way), "way": args.way}))
        return
    import torch
    from torch.cuda import green_contexts

    out: dict = {"torch": torch.__version__, "green_contexts": green_contexts.SUPPORTED,
                 "runs": []}
    if not torch.cuda.is_available():
        print("sm_cap: no CUDA device here; nothing to measure")
        return
    for sms in [0, *(int(s) for s in args.sms.split(",") if s.strip())]:
        errors = []
        for way in WAYS[:1] if sms == 0 else WAYS:
            done = subprocess.run([sys.executable, __file__, "--child", str(sms), "--way", way],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode == 0:
                out["runs"].append(json.loads(done.stdout.strip().splitlines()[-1]))
                break
            lines = [ln for ln in done.stderr.strip().splitlines() if "Error" in ln]
            errors.append(f"{way}: {(lines or ['exit ' + str(done.returncode)])[-1][:200]}")
        else:
            out["runs"].append({"sms": sms, "error": "; ".join(errors)})
            print(f"{sms} SMs: " + "; ".join(errors))
    whole = out["runs"][0]
    if "error" in whole:
        print(f"sm_cap: the whole-GPU run failed: {whole['error']}")
        return
    print(f"torch {out['torch']}, green contexts supported: {out['green_contexts']}")
    print("| SMs | share | bf16 matmul TFLOP/s | ratio | copy TB/s | ratio |")
    print("|---|---|---|---|---|---|")
    for run in out["runs"]:
        if "error" in run:
            print(f"| {run['sms']} | | {run['error']} | | | |")
            continue
        print(f"| {run['sms']} ({run['way']}) | {run['sms'] / whole['sms']:.2f} | "
              f"{run['matmul_tflops']:.0f} | "
              f"{run['matmul_tflops'] / whole['matmul_tflops']:.2f} | {run['copy_tb_s']:.2f} | "
              f"{run['copy_tb_s'] / whole['copy_tb_s']:.2f} |")
    if args.json_out:
        write_json(args.json_out, out)


if __name__ == "__main__":
    main()
