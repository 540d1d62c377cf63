"""What a transformer layer of a LoRA step costs the host, by LoRA forward and checkpoint kind.

    python benchmarks/host_cost.py [--shape qwen2.5-0.5b] [--layers 2] [--tokens 256]

A Qwen2.5-0.5B step in a 5.75 GiB slice waits on the host: ~4,000 kernel launches a step and
device time well under wall time (``profile_step.py`` on an H100). A launch is an operator that
computes, so this counts them where no GPU is needed: the model's real layers (random init
from the shape's config, ``--layers`` of them), LoRA r=16 on every projection, bf16 weights
under bf16 autocast, gradient checkpointing as under a cap; one forward and backward of the
backbone under a ``TorchDispatchMode`` that counts every ATen operator that writes a tensor
(views, allocations and metadata are left out: they launch nothing), the step after a first
step and an optimizer step (which makes ``lora_fused`` cast its weights again, as in the
loop). Counted per layer, for:

- ``peft``: peft's own ``lora.Linear.forward``;
- ``fused``: each projection's update inside one matmul (``lora_fused``, ``group=False``);
- ``grouped``: that, with the projections reading one input (q/k/v, gate/up) in one call and
  a backward of our own (``lora_fused``, the loop's default);
- ``reentrant``: ``grouped`` under torch's reentrant checkpoint.

Then, at width 64 and 8 tokens (an 8-layer model of the same architecture, the variants taking
turns for 3 rounds of ``--host-steps`` steps), each one's median wall time a layer on one CPU
thread: with next to nothing
to compute, what its operators and the Python around them cost the host, which is what
bounds a small model's step on a GPU. It prints the ratios, and checks that each one's bf16
gradients are as close to peft's fp32 ones as peft's bf16 gradients are (exit 1 otherwise).
On a GPU most operators are one kernel each, some two; the profiler there
(``profile_step.py``) counts the kernels themselves.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from contextlib import nullcontext

from draslice.benchmarks.peer_trainers import LORA_ALPHA, LORA_R, SHAPES, TARGETS

# Each way of running a layer: (LoRA forward, reentrant checkpoint).
VARIANTS = {"peft": ("peft", False), "fused": ("fused", False), "grouped": ("grouped", False),
            "reentrant": ("grouped", True)}
# Operators that write no tensor data: allocations and autograd's bookkeeping.
LAUNCH_NOTHING = ("detach", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty",
                  "new_empty_strided")


def _forward_backward(model, ids, probe=None):
    import torch

    hidden = model.get_base_model().model(input_ids=ids, use_cache=False).last_hidden_state
    if probe is None:
        probe = torch.ones(())
    loss = (hidden.float() * probe).mean()
    loss.backward()
    return loss


def _no_op_step(model) -> None:
    """An optimizer step that changes no weight: what tells ``lora_fused`` the weights may have
    changed (its casts are made again), as the loop's AdamW step does."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    torch.optim.SGD(params, lr=0.0).step()


def count_step(model, ids, forward: str, bf16: bool = True) -> tuple[Counter, float, dict]:
    """Operators of one forward + backward of the backbone, a steady step (after one step and
    an optimizer step); its loss and LoRA gradients."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

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

    # A fixed random direction: the final norm makes the mean square ~1 whatever the weights,
    # which would leave gradients of bf16 noise alone to compare.
    probe = torch.randn((*ids.shape, model.get_base_model().config.hidden_size),
                        generator=torch.Generator().manual_seed(1))
    bf16_autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    counter = Count()
    with _lora_forward(model, forward):
        with bf16_autocast:
            _forward_backward(model, ids, probe)
        _no_op_step(model)
        model.zero_grad(set_to_none=True)
        with bf16_autocast, counter:
            loss = _forward_backward(model, ids, probe)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return counter.ops, loss.item(), grads


def _lora_forward(model, forward: str):
    from draslice.trainer.speed import lora_fused

    return (nullcontext() if forward == "peft"
            else lora_fused.fused(model, group=forward == "grouped"))


def lora_model(shape, layers: int, reentrant: bool, hidden: int | None = None):
    """The shape's architecture with ``layers`` layers (``hidden`` narrower, if given), bf16
    weights, LoRA on every projection with non-zero B, gradient checkpointing of the kind
    asked, training mode; the same weights every call."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from draslice.trainer.model import wrap_lora
    from draslice.trainer.speed import grad_checkpointing

    torch.manual_seed(0)
    width = hidden or shape.hidden
    config = AutoConfig.for_model(
        shape.arch, hidden_size=width, num_hidden_layers=layers,
        num_attention_heads=shape.heads if hidden is None else 4,
        num_key_value_heads=shape.kv_heads if hidden is None else 2,
        intermediate_size=shape.ffn if hidden is None else 2 * width, vocab_size=1024,
        tie_word_embeddings=shape.tied)
    base = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model = wrap_lora(base, LORA_R, LORA_ALPHA, 0.0, ",".join(TARGETS))
    for name, p in model.named_parameters():
        if p.requires_grad:  # peft's B starts at zero: its gradient paths would hide errors
            p.data = (torch.randn_like(p, dtype=torch.float32) * 0.02
                      if "lora_B" in name else p.data.float())
    grad_checkpointing.enable(base, reentrant)
    model.train()
    return model


def host_times(shape, steps: int, rounds: int = 3) -> dict[str, float]:
    """Each variant's median seconds a layer of a step at width 64 and 8 tokens: what the
    operators and the Python around them cost the host, with next to nothing to compute. The
    variants take turns, ``steps`` steps each a round, so that a drift of the machine's speed
    falls on all of them."""
    from contextlib import ExitStack

    import torch

    layers = 8
    models = {v: lora_model(shape, layers, reentrant, hidden=64)
              for v, (_, reentrant) in VARIANTS.items()}
    ids = torch.randint(0, 1024, (1, 8))
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with ExitStack() as stack:
        for v, (forward, _) in VARIANTS.items():
            stack.enter_context(_lora_forward(models[v], forward))
        for turn in range(rounds + 1):  # the first round warms allocators and caches up
            for v, model in models.items():
                for _ in range(steps):
                    start = time.perf_counter()
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        _forward_backward(model, ids)
                    if turn:
                        times[v].append(time.perf_counter() - start)
                    _no_op_step(model)  # outside the time: the same for every variant
    return {v: statistics.median(t) / layers for v, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=[s for s in SHAPES if not SHAPES[s].quantized],
                        default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=2, help="layers built (counts are per layer)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens in the one row")
    parser.add_argument("--host-steps", type=int, default=10,
                        help="steps a variant times in each of 3 rounds for the host-time "
                             "column (0: no timing)")
    parser.add_argument("--verbose", action="store_true", help="every operator's count")
    args = parser.parse_args()
    if args.layers < 1 or args.tokens < 2:
        parser.error("--layers must be >= 1 and --tokens >= 2")

    import torch

    models = {kind: lora_model(SHAPES[args.shape], args.layers, kind) for kind in (False, True)}
    ids = torch.randint(0, 1024, (1, args.tokens))

    # The reference: peft's forward in fp32 (the bf16 base's values, no autocast). Each bf16
    # forward's gradients must be as close to it as peft's own bf16 ones, give or take.
    _, _, exact = count_step(models[False], ids, "peft", bf16=False)
    results = {name: count_step(models[reentrant], ids, forward)
               for name, (forward, reentrant) in VARIANTS.items()}
    print(f"{args.shape}: {args.layers} layer(s), {args.tokens} tokens, LoRA r={LORA_R} on every "
          "projection, bf16 autocast, gradient checkpointing; operators per layer, "
          "forward + recompute + backward:")
    base_count = sum(results["peft"][0].values()) / args.layers
    torch.set_num_threads(1)  # the host's own cost: no thread pool to wake for tiny tensors
    hosts = (host_times(SHAPES[args.shape], args.host_steps) if args.host_steps
             else dict.fromkeys(VARIANTS, 0.0))
    errors = {}
    for name, (ops, _loss, grads) in results.items():
        per_layer = sum(ops.values()) / args.layers
        errors[name] = max((torch.linalg.norm(g - exact[n]) / torch.linalg.norm(exact[n])
                               .clamp_min(1e-30)).item() for n, g in grads.items())
        host = (f"  {hosts[name] * 1e6:6.0f} us a layer on the host "
                f"({hosts[name] / hosts['peft']:.2f}x)" if args.host_steps else "")
        print(f"  {name:9s} {per_layer:7.1f}  ({per_layer / base_count:.2f}x peft's){host}  "
              f"gradients within {errors[name]:.2e} of fp32's (largest relative norm)")
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
