"""Gradient checkpointing (``gradient_checkpointing``): each layer's activations recomputed in
backward instead of kept, the way every memory lever of the loop builds on.

Transformers checkpoints a layer by calling that layer's ``_gradient_checkpointing_func`` with
the layer's call; that attribute is the one place where draslice changes what a checkpoint does
(``offload``: the saved input to the host; ``speed.compile_layers``: a compiled layer inside).
"""

from __future__ import annotations

from contextlib import suppress

import torch

REENTRANT = False
"""Which of torch's two checkpoints every layer (and ``offload``'s) uses.

The non-reentrant one (the default) recomputes through saved-tensor hooks, a Python call for
every tensor a layer saves. The reentrant one is an autograd Function that saves the layer's
inputs and, in backward, runs the layer's forward and backward again inside it, as Unsloth's
offloaded checkpointing does: on a CPU at a width where the host's cost is all there is, a
Qwen2 layer took 0.87-0.89x the host time (``benchmarks/host_cost.py``). It needs the
embeddings' output to require grad, which costs a backward through the first layer's frozen
weights and breaks a compiled body's graph. On an H100 (docs/benchmarks.md, run M) it made
the offloaded step 1.04-1.08x faster where the step is bound by launching kernels
(Qwen2.5-0.5B in a 5.75 GiB slice) and no faster at 1.5B or at the 7B QLoRA shape, where it
held 0.32-0.54 GiB more at the peak: so it stays off.
"""


def enable(base: torch.nn.Module) -> None:
    """Gradient checkpointing of every layer (:data:`REENTRANT` says which kind), by the name
    the installed transformers has for it (``activation_checkpointing_enable`` since 5.x; the
    old name now warns that v6 removes it)."""
    kwargs = {"use_reentrant": REENTRANT}
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(kwargs)  # its first parameter: the kwargs
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if REENTRANT:  # it needs the embeddings' output to require grad (transformers' hook)
        return
    # transformers also makes the embeddings' output require grad, which the reentrant kind
    # needs and the non-reentrant one does not: kept, it costs a backward through the first
    # layer's frozen weights and breaks torch.compile's graph (a forward hook calling
    # requires_grad_). Older transformers raise AttributeError when no hook was added.
    with suppress(AttributeError):
        base.disable_input_require_grads()


def flagged(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` whose ``_gradient_checkpointing_func`` checkpoints a call: its
    layers, and the model itself, which carries the flag too (for its ``use_cache`` warning)."""
    return [m for m in model.modules()
            if getattr(m, "gradient_checkpointing", False)
            and hasattr(m, "_gradient_checkpointing_func")]


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The checkpointed layers of ``model``: the flagged modules with no other inside."""
    marked = flagged(model)
    return [m for m in marked if not any(c in marked for c in m.modules() if c is not m)]
