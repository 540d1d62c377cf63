"""Each layer's MLP run a tile of tokens at a time (``tile_mlp``).

With gradient checkpointing, the peak of a step is one layer's backward: the recomputed layer
keeps everything its backward needs, and in a Llama/Qwen MLP that is three tensors of
``intermediate_size`` per token (gate, up and their product; 8,960 wide for Qwen2.5-1.5B,
5.8x the hidden size). At 8 x 2,048 tokens they are 0.9 GiB, and their gradients as much again,
in a 5.75 GiB ``1g.6gb`` slice. The MLP acts on each token alone, so it can run on tiles of the
batch's tokens, each tile under its own (nested, non-reentrant) ``torch.utils.checkpoint``:
a tile's wide tensors exist only while that tile is computed or its backward runs. The price is
one more MLP forward a step (the tile's recomputation in backward). The tiles are as many as
``intermediate_size / hidden_size`` (6 for Qwen), so a tile's widest tensor is no bigger than
the layer's input; never smaller than ``MIN_TILE_TOKENS`` tokens, which keeps the matmuls on
the GPU's efficient shapes.

DeepSpeed's ALST and Liger (``LigerTiledSwiGLUMLP``) tile the MLP the same way with an autograd
function of their own; torch's checkpoint does it here for any architecture's MLP, with or
without Liger's kernels inside, on a GPU or a CPU.
"""

from __future__ import annotations

import math
import types

import torch
from torch.utils.checkpoint import checkpoint

MIN_TILE_TOKENS = 1024


def tile_count(tokens: int, hidden: int, intermediate: int) -> int:
    """Tiles for ``tokens`` rows: ``ceil(intermediate / hidden)``, fewer when a tile would
    hold under ``MIN_TILE_TOKENS`` tokens."""
    return max(1, min(math.ceil(intermediate / hidden), tokens // MIN_TILE_TOKENS))


def tiled_forward(mlp: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """An MLP's ``forward`` once :func:`enable` tiled it: its own forward, tile by tile.

    One function, bound to each MLP (not an object per layer): ``torch.compile`` guards on
    the identity of what a layer calls, so an object per layer made each layer a graph of its
    own, and torch's recompile limit of 8 would leave the rest of 28 layers eager
    (``speed.compile_layers`` shares one graph across the layers).
    """
    forward = mlp.untiled_forward
    flat = hidden.reshape(-1, hidden.shape[-1])
    tiles = tile_count(flat.shape[0], flat.shape[1], mlp.tile_intermediate)
    if tiles == 1:
        return forward(hidden)
    if torch.is_grad_enabled():  # each tile recomputed in backward, one at a time
        outs = [checkpoint(forward, part, use_reentrant=False) for part in flat.chunk(tiles)]
    else:  # nothing kept for backward: tiling only bounds the forward's transient memory
        outs = [forward(part) for part in flat.chunk(tiles)]
    return torch.cat(outs).view(*hidden.shape[:-1], -1)


def is_tiled_forward(forward) -> bool:
    return getattr(forward, "__func__", None) is tiled_forward


def is_tiled(mlp: torch.nn.Module) -> bool:
    return is_tiled_forward(mlp.forward)


def intermediate_size(config) -> int:
    """The MLP's inner width from a Hugging Face config (Llama/Qwen2/Mistral; GPT-2's
    ``n_inner``, 4 x the hidden size when unset)."""
    width = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
    return int(width or 4 * config.hidden_size)


def enable(model: torch.nn.Module) -> int:
    """Tile the MLP of every layer of a Hugging Face ``model`` (an attribute ``mlp`` of each
    decoder block, as in Llama, Qwen2, Mistral and GPT-2); returns how many were tiled.

    The module's current ``forward`` is wrapped, so kernels patched in before (Liger's SwiGLU)
    run inside each tile, and module names, and so the saved adapter, stay the same.
    """
    width = intermediate_size(model.config)
    mlps = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == "mlp"]
    for mlp in mlps:
        if not is_tiled(mlp):
            mlp.untiled_forward = mlp.forward
            mlp.tile_intermediate = width
            mlp.forward = types.MethodType(tiled_forward, mlp)
    return len(mlps)
