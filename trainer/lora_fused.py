"""LoRA's update added to the base projection inside one matmul while the loop trains.

peft adds a LoRA layer's update as ``result + lora_B(lora_A(x)) * scaling``: the update is
written at the projection's full output width, read and written again to scale it, and read
once more with ``result`` to add them, and the scaling's backward makes one more full-width
pass. For the seven projections of a Qwen2.5-1.5B layer that is about 4.5 GB of memory traffic
a forward at 16,384 tokens. ``torch.addmm(result, x A^T, B^T, alpha=scaling)`` does the same in
the matmul's epilogue (cuBLAS reads ``result`` once and writes the sum once; ``alpha`` scales in
the accumulator), and its backward scales only the rank-wide gradients. On an H200 that made a
Qwen2.5-1.5B step at 8 x 2,048 tokens 1.05x faster, uncapped and in a 5.75 GiB slice alike
(docs/benchmarks.md, run H).

Only while the loop trains under bf16 autocast (``build.Training.lora_inputs_uncast``), and only
for plain LoRA (one active adapter, no dropout, not merged, no DoRA or other variant, no
per-call arguments): anything else, and every forward outside the loop, is peft's own.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from draslice.trainer.device import matmul_dtype

if TYPE_CHECKING:
    from collections.abc import Iterator


class FusedForward:
    """Replaces a peft ``lora.Linear``'s ``forward`` while installed."""

    def __init__(self, layer: torch.nn.Module) -> None:
        self.layer = layer

    def plain_adapter(self) -> str | None:
        """The one active adapter's name when the fused sum computes what peft would."""
        layer = self.layer
        if layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
            return None
        name = layer.active_adapters[0]
        if (name not in layer.lora_A or name in getattr(layer, "lora_variant", {})
                or not isinstance(layer.lora_dropout[name], torch.nn.Identity)):
            return None
        return name

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        layer = self.layer
        name = None if args or kwargs else self.plain_adapter()
        if name is None:
            return type(layer).forward(layer, x, *args, **kwargs)
        result = layer.base_layer(x)
        dtype = matmul_dtype(x.device.type, result.dtype)
        a = layer.lora_A[name].weight.to(dtype)
        b = layer.lora_B[name].weight.to(dtype)
        low = x.reshape(-1, x.shape[-1]).to(dtype) @ a.t()
        summed = torch.addmm(result.reshape(-1, result.shape[-1]).to(dtype), low, b.t(),
                             alpha=layer.scaling[name])
        return summed.view(result.shape).to(result.dtype)


def lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The peft LoRA linear layers of ``model``: over a plain or a 4-bit (QLoRA) base layer.

    peft's 4-bit layer also clones the base output before adding to it ("defensively", against
    an in-place add on a view); the fused sum adds nothing in place, so that full-width copy
    goes too. Subclasses (FSDP2's, other quantisations) keep peft's forward.
    """
    from peft.tuners.lora import Linear

    kinds: tuple[type, ...] = (Linear,)
    try:
        from peft.tuners.lora.bnb import Linear4bit
    except ImportError:  # bitsandbytes not installed: no 4-bit layers either
        pass
    else:
        kinds += (Linear4bit,)
    return [m for m in model.modules() if type(m) in kinds]


@contextmanager
def fused(model: torch.nn.Module) -> Iterator[int]:
    """Install :class:`FusedForward` on every plain LoRA linear layer; yields how many."""
    layers = lora_layers(model)
    for layer in layers:
        layer.forward = FusedForward(layer)
    try:
        yield len(layers)
    finally:
        for layer in layers:
            del layer.forward
