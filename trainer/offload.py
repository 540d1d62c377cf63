"""Gradient checkpointing whose saved layer inputs wait in host memory (``offload_activations``).

With gradient checkpointing, what a step keeps on the device between forward and backward is
one input per transformer layer: batch x sequence x hidden values, 28 of them for a 1.5B Qwen.
At 8 x 2,048 tokens that is 1.4 GiB, a quarter of a ``1g.6gb`` slice. Unsloth's "offloaded"
checkpointing moves them to the host; this does the same with PyTorch's own pieces:
``torch.utils.checkpoint`` (non-reentrant) saves a layer's inputs through the autograd
saved-tensor hooks, so hooks around the call see exactly those tensors and nothing inside the
layer (the checkpoint's own hooks take over there). The pack hook copies a CUDA tensor into
pinned host memory without waiting; the unpack hook copies it back when backward recomputes
the layer.

The copy out runs on a side stream, after the compute that made the tensor, so the next
layer's forward does not wait for it (a copy on the compute stream stalled it: 28 layers x
100 MB over PCIe at 16 x 2,048 tokens is a tenth of a second a step). ``record_stream`` keeps
the caching allocator from reusing the tensor's device block before that copy is done. The
copy back runs on the compute stream after waiting for the side stream, where backward is
about to use it; the pinned host block is reused only after the copies that use it (the host
allocator records them).

transformers 5.2x offers the same as ``activation_checkpointing_enable(offload=True)``, through
torch's ``save_on_cpu``: every saved tensor, its copies on the compute stream (its docstring says
the step gets slower). Here the copy out runs beside the compute, and the small tensors every
layer shares stay put; the GPU host's transformers (5.17) may not have it either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils.checkpoint import checkpoint

from draslice.trainer import grad_checkpointing

if TYPE_CHECKING:
    from collections.abc import Callable

# Tensors smaller than this stay where they are: position tables and masks are shared by all
# layers (offloading them would copy the same values once per layer) and save little.
MIN_NUMEL = 1 << 20


_COPY_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _COPY_STREAMS:
        _COPY_STREAMS[device] = torch.cuda.Stream(device)
    return _COPY_STREAMS[device]


def _pack(tensor: torch.Tensor):
    if tensor.device.type != "cuda" or tensor.numel() < MIN_NUMEL:
        return tensor
    host = torch.empty_like(tensor, device="cpu", pin_memory=True)
    side = _copy_stream(tensor.device)
    side.wait_stream(torch.cuda.current_stream(tensor.device))
    with torch.cuda.stream(side):
        host.copy_(tensor, non_blocking=True)
    tensor.record_stream(side)
    return tensor.device, host


def _unpack(packed) -> torch.Tensor:
    if isinstance(packed, torch.Tensor):
        return packed
    device, host = packed
    torch.cuda.current_stream(device).wait_stream(_copy_stream(device))
    return host.to(device, non_blocking=True)


def offloaded_checkpoint(function: Callable, *args, **kwargs):
    """``torch.utils.checkpoint.checkpoint`` (non-reentrant) with the saved inputs on the host."""
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        return checkpoint(function, *args, use_reentrant=False, **kwargs)


def enable(model: torch.nn.Module) -> int:
    """Make every checkpointed layer of a Hugging Face ``model`` (checkpointing already on)
    offload its saved input; returns how many layers now do."""
    for module in grad_checkpointing.flagged(model):
        module._gradient_checkpointing_func = offloaded_checkpoint
    return len(grad_checkpointing.layers(model))
