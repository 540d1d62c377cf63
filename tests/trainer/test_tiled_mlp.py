"""tile_mlp: each layer's MLP run on tiles of the batch's tokens (trainer/speed/tiled_mlp.py).

On a CPU these check the tiling itself with the installed transformers (tiles as documented,
every MLP wrapped, gradients unchanged under checkpointing) and the knob's rule;
tests/trainer/test_gpu.py checks the memory saved on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from draslice.tests.trainer.grads import checkpointed_base, lm_grads
from draslice.trainer.config import ModelShape
from draslice.trainer.model import build_base
from draslice.trainer.speed import tiled_mlp


@pytest.mark.parametrize(("tokens", "hidden", "intermediate", "tiles"), [
    (16384, 1536, 8960, 6),  # Qwen2.5-1.5B at 8 x 2,048: ceil(8960 / 1536)
    (2048, 1536, 8960, 2),   # never under MIN_TILE_TOKENS a tile
    (512, 1536, 8960, 1),    # too few tokens to tile at all
    (8192, 768, 3072, 4),    # GPT-2's 4 x hidden
])
def test_tile_count(tokens, hidden, intermediate, tiles):
    assert tiled_mlp.tile_count(tokens, hidden, intermediate) == tiles


@pytest.mark.parametrize("reentrant", [False, True])  # the tiles' checkpoints nest in either
def test_every_mlp_runs_in_tiles_and_the_gradients_stay(reentrant):
    shape = ModelShape(vocab_size=64, n_layer=3, n_embd=32, n_head=2, seq_len=512)
    model = checkpointed_base(shape, reentrant)
    ids = torch.randint(0, 64, (4, 512), generator=torch.Generator().manual_seed(0))
    whole = lm_grads(model, ids)

    assert tiled_mlp.enable(model) == shape.n_layer
    rows: list[int] = []
    for block in model.transformer.h:
        inner = block.mlp.untiled_forward
        block.mlp.untiled_forward = lambda x, inner=inner: rows.append(x.shape[0]) or inner(x)
    tiled = lm_grads(model, ids)
    # 2,048 tokens: 2 tiles of 1,024 a layer, each run in the forward and recomputed in
    # backward (the layer's recomputation may stop before its last tile: checkpoint's early
    # stop once every saved tensor is back).
    assert set(rows) == {1024}
    assert 2 * 2 * shape.n_layer <= len(rows) <= 2 * 3 * shape.n_layer
    assert whole.keys() == tiled.keys()
    for name, grad in whole.items():
        torch.testing.assert_close(tiled[name], grad, msg=name)


def test_enabling_twice_wraps_once():
    model = build_base(ModelShape(vocab_size=64, n_layer=2, n_embd=32, n_head=2, seq_len=16), 0)
    tiled_mlp.enable(model)
    tiled_mlp.enable(model)
    mlp = model.transformer.h[0].mlp
    assert tiled_mlp.is_tiled(mlp) and not tiled_mlp.is_tiled_forward(mlp.untiled_forward)
