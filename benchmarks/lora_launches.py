"""How many operators a LoRA step dispatches per transformer layer, by LoRA forward, on a CPU.

    python benchmarks/lora_launches.py [--shape qwen2.5-0.5b] [--layers 2] [--tokens 256]

A Qwen2.5-0.5B step in a 5.75 GiB slice waits on the host: ~4,000 kernel launches a step and
device time well under wall time (docs/benchmarks.md, run L). A launch is an operator that
computes, so this counts them where no GPU is needed: the model's real layers (random init
from the shape's config, ``--layers`` of them), LoRA r=16 on every projection, bf16 weights
under bf16 autocast, gradient checkpointing as under a cap; one forward and backward of the
backbone under a ``TorchDispatchMode`` that counts every ATen operator that writes a tensor
(views, allocations and metadata are left out: they launch nothing). Counted per layer, for:

- ``peft``: peft's own ``lora.Linear.forward``;
- ``fused``: each projection's update inside one matmul (``lora_fused``, ``group=False``);
- ``grouped``: that, with the projections reading one input (q/k/v, gate/up) in one call and
  a backward of our own (``lora_fused``, the loop's default).

It prints the ratios, and checks that each forward's bf16 gradients are as close to peft's fp32
ones as peft's bf16 gradients are (exit 1 otherwise). On a GPU
most operators are one kernel each, some two; the profiler there (``profile_step.py``) counts
the kernels themselves.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from peer_trainers import LORA_ALPHA, LORA_R, SHAPES, TARGETS  # noqa: E402

FORWARDS = ("peft", "fused", "grouped")
# Operators that write no tensor data: allocations and autograd's bookkeeping.
LAUNCH_NOTHING = ("detach", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty",
                  "new_empty_strided")


def count_step(model, ids, forward: str, bf16: bool = True) -> tuple[Counter, float, dict]:
    """Operators of one forward + backward of the backbone; its loss and LoRA gradients."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from draslice.trainer import lora_fused

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            returns = func._schema.returns
            aliased = returns and all(r.alias_info is not None and not r.alias_info.is_write
                                      for r in returns)
            if not aliased and func.overloadpacket.__name__ not in LAUNCH_NOTHING:
                self.ops[func.overloadpacket.__name__] += 1
            return out

    model.zero_grad(set_to_none=True)
    fuse = (nullcontext() if forward == "peft"
            else lora_fused.fused(model, group=forward == "grouped"))
    counter = Count()
    with fuse, torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), counter:
        hidden = model.get_base_model().model(input_ids=ids, use_cache=False).last_hidden_state
        # A fixed random direction: the final norm makes the mean square ~1 whatever the
        # weights, which would leave gradients of bf16 noise alone to compare.
        probe = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1))
        loss = (hidden.float() * probe).mean()
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return counter.ops, loss.item(), grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=[s for s in SHAPES if not SHAPES[s].quantized],
                        default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=2, help="layers built (counts are per layer)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens in the one row")
    parser.add_argument("--verbose", action="store_true", help="every operator's count")
    args = parser.parse_args()
    if args.layers < 1 or args.tokens < 2:
        parser.error("--layers must be >= 1 and --tokens >= 2")

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from draslice.trainer import grad_checkpointing
    from draslice.trainer.model import wrap_lora

    shape = SHAPES[args.shape]
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        shape.arch, hidden_size=shape.hidden, num_hidden_layers=args.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.ffn, vocab_size=1024,
        tie_word_embeddings=shape.tied)
    base = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model = wrap_lora(base, LORA_R, LORA_ALPHA, 0.0, ",".join(TARGETS))
    for name, p in model.named_parameters():
        if p.requires_grad:  # peft's B starts at zero: its gradient paths would hide errors
            p.data = (torch.randn_like(p, dtype=torch.float32) * 0.02
                      if "lora_B" in name else p.data.float())
    grad_checkpointing.enable(base)
    model.train()
    ids = torch.randint(0, 1024, (1, args.tokens))

    # The reference: peft's forward in fp32 (the bf16 base's values, no autocast). Each bf16
    # forward's gradients must be as close to it as peft's own bf16 ones, give or take.
    _, _, exact = count_step(model, ids, "peft", bf16=False)
    results = {f: count_step(model, ids, f) for f in FORWARDS}
    print(f"{args.shape}: {args.layers} layer(s), {args.tokens} tokens, LoRA r={LORA_R} on every "
          "projection, bf16 autocast, gradient checkpointing; operators per layer, "
          "forward + recompute + backward:")
    base_count = sum(results["peft"][0].values()) / args.layers
    errors = {}
    for forward, (ops, _loss, grads) in results.items():
        per_layer = sum(ops.values()) / args.layers
        errors[forward] = max((torch.linalg.norm(g - exact[n]) / torch.linalg.norm(exact[n])
                               .clamp_min(1e-30)).item() for n, g in grads.items())
        print(f"  {forward:8s} {per_layer:7.1f}  ({per_layer / base_count:.2f}x peft's)  "
              f"gradients within {errors[forward]:.2e} of fp32's (largest relative norm)")
        if args.verbose:
            top = ", ".join(f"{k} {v / args.layers:g}" for k, v in ops.most_common())
            print(f"           {top}")
    allowed = 1.5 * errors["peft"] + 1e-3
    wrong = [f for f, err in errors.items() if err > allowed]
    if wrong:
        print(f"error: {', '.join(wrong)} further from fp32's gradients than {allowed:.2e} "
              "(1.5x peft's bf16 distance)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
