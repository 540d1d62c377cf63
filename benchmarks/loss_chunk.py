"""The loss through the LM head, eager against fused, on the Qwen/Llama shapes (needs a GPU).

    python benchmarks/loss_chunk.py [--tokens 16384] [--shape 896x151936 --shape 1536x151936]
        [--repeat 20] [--chunk-rows 1024,2048] [--liger-mem 2,4,8]

``trainer/speed/loss.py`` computes the cross-entropy through the frozen head a chunk of tokens at a
time, and each chunk's gradient right away. Per chunk, its softmax and gradient run either
eager (``FUSED_DEVICES = ()``: about six passes over a quarter GiB of fp32 logits) or
compiled by inductor (the default on CUDA). This prints, for each hidden x vocab shape at
``--tokens`` labelled tokens (bf16 hidden states and head, as under autocast): milliseconds a
forward and backward, peak memory above the inputs, the first call's time (inductor's compile),
the fused/eager ratios, and how far the fused loss and gradient are from the eager ones. Liger's
``liger_fused_linear_cross_entropy`` is measured beside them where ``liger-kernel`` imports.
``--chunk-rows`` adds the fused loss at other chunk sizes than ``loss.chunk_tokens``' (more rows:
fewer reads of the head and wider matmuls, at more memory), and every shape prints the floor:
the two head matmuls of a forward and backward unchunked (logits, then their gradient times the
head), which no chunking can beat. Liger's row runs at the ``chunk_mem_const`` the loop gives it
(``loss.liger_chunk_mem``, printed as C); ``--liger-mem`` adds it at other values (1 is Liger's
own default: its chunks' logits no larger than the hidden states).
"""

from __future__ import annotations

import argparse
import time

import torch

from draslice.trainer.speed import loss


def _ours(hidden, head, targets, rows: int | None = None):
    chunk = rows or loss.chunk_tokens(head.weight.shape[0])
    return loss.chunked_cross_entropy(hidden, head, targets, chunk)


def matmul_floor_ms(hidden, head, repeat: int) -> float:
    """The head's two matmuls of a forward and backward, unchunked: ``hidden @ W.T`` and a
    logits-sized gradient times ``W``."""
    w = head.weight
    logits = hidden @ w.T
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for timed in (False, True):
        if timed:
            start.record()
        for _ in range(repeat if timed else 3):
            torch.mm(hidden, w.T, out=logits)
            logits @ w
        if timed:
            end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


def _liger():
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError as exc:
        print(f"liger: not measured ({exc})")
        return None

    def run(hidden, head, targets, mem: int):
        return liger_fused_linear_cross_entropy(hidden, head.weight, targets, reduction="sum",
                                                chunk_mem_const=mem)
    return run


def measure(fn, hidden, head, targets, repeat: int) -> dict:
    """First call (compile included), steady ms a forward and backward, peak GiB above inputs."""
    def once():
        h = hidden.detach().requires_grad_()
        total = fn(h, head, targets)
        total.backward()
        return total.detach(), h.grad

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    total, grad = once()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(3):
        once()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        once()
    end.record()
    torch.cuda.synchronize()
    return {"first_s": first, "ms": start.elapsed_time(end) / repeat,
            "peak_gib": (torch.cuda.max_memory_allocated() - base) / 2**30,
            "loss": total, "grad": grad}


def _whole_numbers(parser: argparse.ArgumentParser, name: str, value: str) -> list[int]:
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        numbers = [0]
    if any(n < 1 for n in numbers):
        parser.error(f"{name}: comma-separated whole numbers above 0, not {value!r}")
    return numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--shape", action="append", help="HIDDENxVOCAB (repeatable)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--liger-mem", default="",
                        help="comma-separated chunk_mem_const values for Liger's loss too "
                             "(1: Liger's default)")
    parser.add_argument("--chunk-rows", default="",
                        help="comma-separated chunk sizes (tokens) for the fused loss too")
    args = parser.parse_args()
    rows, mems = (_whole_numbers(parser, name, value) for name, value in
                  (("--chunk-rows", args.chunk_rows), ("--liger-mem", args.liger_mem)))
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    shapes = args.shape or ["896x151936", "1536x151936"]
    liger = _liger()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.tokens} tokens")
    for shape in shapes:
        hidden_size, vocab = (int(v) for v in shape.lower().split("x"))
        gen = torch.Generator(device="cuda").manual_seed(0)
        head = torch.nn.Linear(hidden_size, vocab, bias=False, device="cuda",
                               dtype=torch.bfloat16).requires_grad_(False)
        torch.nn.init.normal_(head.weight, std=0.02, generator=gen)
        hidden = torch.randn(args.tokens, hidden_size, device="cuda", dtype=torch.bfloat16,
                             generator=gen)
        targets = torch.randint(0, vocab, (args.tokens,), device="cuda", generator=gen)
        runs = {}
        for name, fuse in (("eager", False), ("fused", True)):
            loss.FUSED_DEVICES = ("cuda",) if fuse else ()
            runs[name] = measure(_ours, hidden, head, targets, args.repeat)
        for r in rows:
            runs[f"fused@{r}"] = measure(lambda h, w, t, r=r: _ours(h, w, t, r), hidden, head,
                                         targets, args.repeat)
        ours_mem = loss.liger_chunk_mem(args.tokens, hidden_size, vocab)
        if liger is not None:
            for m in [ours_mem] + [m for m in mems if m != ours_mem]:
                runs[f"liger@{m}"] = measure(lambda h, w, t, m=m: liger(h, w, t, m), hidden,
                                             head, targets, args.repeat)
        print(f"{shape}: the head's two matmuls unchunked (the floor): "
              f"{matmul_floor_ms(hidden, head, args.repeat):.2f} ms; fused chunks of "
              f"{loss.chunk_tokens(vocab)} tokens; the loop's Liger C={ours_mem}")
        eager = runs["eager"]
        for name, run in runs.items():
            dl = abs(float(run["loss"]) - float(eager["loss"])) / float(eager["loss"])
            dg = float((run["grad"].float() - eager["grad"].float()).abs().max())
            print(f"{shape}: {name:10s} {run['ms']:7.2f} ms ({eager['ms'] / run['ms']:.2f}x eager)"
                  f"  peak +{run['peak_gib']:.2f} GiB  first call {run['first_s']:.1f} s"
                  f"  loss rel diff {dl:.1e}  grad max diff {dg:.1e}")


if __name__ == "__main__":
    main()
