"""Gradient checkpointing whose saved layer inputs wait in host memory (``offload_activations``).

With gradient checkpointing, what a step keeps on the device between forward and backward is
one input per transformer layer: batch x sequence x hidden values, 28 of them for a 1.5B Qwen.
At 8 x 2,048 tokens that is 1.4 GiB, a quarter of a ``1g.6gb`` slice. Unsloth's "offloaded"
checkpointing moves them to the host; this does the same with PyTorch's own pieces:
``torch.utils.checkpoint`` saves a layer's inputs through the autograd saved-tensor hooks
(the non-reentrant kind through its own hooks inside; the reentrant kind, an autograd Function,
saves only those), so hooks around the call see exactly those tensors and nothing inside the
layer. The pack hook copies a CUDA tensor into
pinned host memory without waiting; the unpack hook hands it back when backward recomputes
the layer.

The copy out runs on a side stream, after the compute that made the tensor, so the next
layer's forward does not wait for it (a copy on the compute stream stalled it: 28 layers x
100 MB over PCIe at 16 x 2,048 tokens is a tenth of a second a step). ``record_stream`` keeps
the caching allocator from reusing the tensor's device block before that copy is done. The
copy back of the input backward needs next starts one layer early, on the side stream too
(:class:`_Layer`), so it also runs beside the compute; the pinned host block is reused
only after the copies that use it (the host allocator records them).

transformers 5.2x offers the same as ``activation_checkpointing_enable(offload=True)``, through
torch's ``save_on_cpu``: every saved tensor, its copies on the compute stream (its docstring says
the step gets slower). Here the copy out runs beside the compute, and the small tensors every
layer shares stay put; transformers 5.17 (the one benchmarked) may not have it either.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import TYPE_CHECKING

import torch

from draslice.trainer.speed import grad_checkpointing

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


class _Layer:
    """What one checkpointed layer's call put in host memory, and the layer called before it.

    Backward recomputes the layers in the reverse of the order forward called them, so when
    one of a layer's inputs is handed back, the next layer backward will recompute is
    ``before``: its inputs' copies back start then, on the side stream, while this layer is
    recomputed and differentiated (a copy on the compute stream waits for PCIe every layer).
    At most one layer is fetched ahead, so the device holds one layer's inputs more than
    without prefetching, never more. Only weak references point back, to the layer before
    and to the inputs: a step's chain lives as long as autograd keeps the inputs.
    """

    __slots__ = ("__weakref__", "before", "saved")

    def __init__(self, before: _Layer | None) -> None:
        self.before = weakref.ref(before) if before is not None else None
        self.saved: list[weakref.ref[_Offloaded]] = []

    def prefetch_before(self) -> None:
        before = self.before() if self.before is not None else None
        self.before = None  # once: the layer's first input to come back starts it
        for ref in before.saved if before is not None else ():
            if (saved := ref()) is not None:
                saved.prefetch()


class _Offloaded:
    """One saved tensor in pinned host memory; once prefetched, its copy on the device."""

    __slots__ = ("__weakref__", "device", "fetched", "host", "layer", "ready", "used")

    def __init__(self, device: torch.device, host: torch.Tensor, layer: _Layer) -> None:
        self.device, self.host, self.layer = device, host, layer
        self.fetched: torch.Tensor | None = None
        self.ready: torch.cuda.Event | None = None
        self.used = False
        layer.saved.append(weakref.ref(self))

    def prefetch(self) -> None:
        """Start the copy back on the side stream, behind this tensor's copy out.

        The device block comes from the compute stream's pool, where the tensor will be used
        and freed: a block allocated on the side stream returns to the side stream's pool,
        which the compute stream's allocations cannot draw from, and in a slice that second
        pool ran the step into the cap (5.75 GiB and 18 allocator retries at Qwen2.5-1.5B,
        8 x 2,048, against 5.34 without prefetching). The copy waits for the work queued on
        the compute stream so far, which may still use the block's previous contents; that
        is the layer ahead's backward, so it still runs beside this layer's.
        """
        if self.used or self.fetched is not None:
            return
        compute = torch.cuda.current_stream(self.device)
        side = _copy_stream(self.device)
        self.fetched = torch.empty_like(self.host, device=self.device)
        side.wait_stream(compute)
        with torch.cuda.stream(side):
            self.fetched.copy_(self.host, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record(side)

    def take(self) -> torch.Tensor:
        """The tensor on the device, ready for the compute stream."""
        compute = torch.cuda.current_stream(self.device)
        if self.fetched is not None:
            compute.wait_event(self.ready)
            tensor, self.fetched, self.ready = self.fetched, None, None
        else:
            compute.wait_stream(_copy_stream(self.device))
            tensor = self.host.to(self.device, non_blocking=True)
        self.used = True
        self.layer.prefetch_before()
        return tensor


_calling: _Layer | None = None
"""The layer whose checkpointed call is running (its saved inputs join it)."""
_last: weakref.ref[_Layer] | None = None
"""The layer called most recently: the next one points back to it."""


def _pack(tensor: torch.Tensor):
    if tensor.device.type != "cuda" or tensor.numel() < MIN_NUMEL:
        return tensor
    host = torch.empty_like(tensor, device="cpu", pin_memory=True)
    side = _copy_stream(tensor.device)
    side.wait_stream(torch.cuda.current_stream(tensor.device))
    with torch.cuda.stream(side):
        host.copy_(tensor, non_blocking=True)
    tensor.record_stream(side)
    return _Offloaded(tensor.device, host, _calling)


def _unpack(packed) -> torch.Tensor:
    if isinstance(packed, torch.Tensor):
        return packed
    return packed.take()


def offloaded_checkpoint(function: Callable, *args, inner: Callable, **kwargs):
    """``inner``, the layer's own checkpoint function (``torch.utils.checkpoint.checkpoint`` of
    the kind ``grad_checkpointing.enable`` gave it), with the saved inputs on the host."""
    global _calling, _last
    layer = _Layer(_last() if _last is not None else None)
    _calling, _last = layer, weakref.ref(layer)
    try:
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            return inner(function, *args, **kwargs)
    finally:
        _calling = None


def enable(model: torch.nn.Module) -> int:
    """Make every checkpointed layer of a Hugging Face ``model`` (checkpointing already on)
    offload its saved input; returns how many layers now do."""
    for module in grad_checkpointing.flagged(model):
        module._gradient_checkpointing_func = partial(
            offloaded_checkpoint, inner=module._gradient_checkpointing_func)
    return len(grad_checkpointing.layers(model))
