"""Gradient checkpointing (``gradient_checkpointing``): each layer's activations recomputed in
backward instead of kept, the way every memory lever of the loop builds on.

Transformers checkpoints a layer by calling that layer's ``_gradient_checkpointing_func`` with
the layer's call; that attribute is the one place where draslice changes what a checkpoint does
(``offload``: the saved input to the host; ``speed.compile_layers``: a compiled layer inside).
"""

from __future__ import annotations

from contextlib import suppress

import torch

REENTRANT: bool | None = None
"""Which of torch's two checkpoints every layer (and ``offload``'s) uses; ``None`` (the
default): :func:`choose` decides by the model.

The non-reentrant one recomputes through saved-tensor hooks, a Python call for every tensor a
layer saves. The reentrant one is an autograd Function that saves the layer's inputs and, in
backward, runs the layer's forward and backward again inside it, as Unsloth's offloaded
checkpointing does: on a CPU at a width where the host's cost is all there is, a Qwen2 layer
took 0.87-0.89x the host time (``benchmarks/host_cost.py``). It needs the embeddings' output to
require grad, which costs a backward through the first layer's frozen weights and breaks a
compiled body's graph. On an H100 it made the offloaded step 1.04-1.21x faster where the step
is bound by launching kernels (Qwen2.5-0.5B, hidden size 896, in a 5.75 GiB slice, +0.03 GiB at
the peak) and no faster at 1.5B (hidden size 1,536) or at the 7B QLoRA shape, where it held
0.32-0.54 GiB more at the peak (``benchmarks/peer_trainers.py``, ``ours-offload-reentrant``
against ``ours-offload-hooks``).
"""

LAUNCH_BOUND_WIDTH = 1024
"""Up to this hidden size :func:`choose` takes the reentrant checkpoint: on an H100 the
Qwen2.5-0.5B step (hidden 896) in a slice was bound by launching kernels, the 1.5B (1,536) was
not."""


def choose(base: torch.nn.Module, eager: bool) -> bool:
    """Whether ``base``'s checkpoints are the reentrant kind: :data:`REENTRANT` where set, else
    only where it was measured faster and no bigger, a model of hidden size up to
    :data:`LAUNCH_BOUND_WIDTH` in an ``eager`` single-process run (neither inductor, whose
    graph the embeddings' hook breaks, nor a CUDA graph capture, which has not been run over
    a reentrant backward).
    Under DDP or FSDP the non-reentrant kind stays: a reentrant backward runs inside another
    backward, which DDP's reducer handles only in some cases without ``static_graph`` (not set
    by the loop), and FSDP2's hooks were not checked with it.
    """
    if REENTRANT is not None:
        return REENTRANT
    width = getattr(getattr(base, "config", None), "hidden_size", None)
    if not (eager and isinstance(width, int) and width <= LAUNCH_BOUND_WIDTH):
        return False
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return not (distributed and torch.distributed.get_world_size() > 1)


def enable(base: torch.nn.Module, reentrant: bool = False) -> None:
    """Gradient checkpointing of every layer (``reentrant``: which kind, :func:`choose`), by
    the name the installed transformers has for it (``activation_checkpointing_enable`` since
    5.x; the old name now warns that v6 removes it)."""
    kwargs = {"use_reentrant": reentrant}
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(kwargs)  # its first parameter: the kwargs
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if reentrant:  # it needs the embeddings' output to require grad (transformers' hook)
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
