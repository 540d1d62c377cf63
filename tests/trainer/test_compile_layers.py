"""torch.compile under gradient checkpointing (speed.compile_layers): each layer compiled
inside its checkpoint, where compiling the body ran the layers eager."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from draslice.tests.trainer.grads import checkpointed_qwen2, lm_grads
from draslice.trainer import speed
from draslice.trainer.speed import offload, tiled_mlp

LAYERS = 4


def _model(offloaded: bool, tiled: bool) -> torch.nn.Module:
    model = checkpointed_qwen2(LAYERS)
    if offloaded:  # on a CPU the hooks leave tensors in place, but they run
        offload.enable(model.base_model.model)
    if tiled:
        tiled_mlp.enable(model.base_model.model)
    return model


@pytest.mark.parametrize(("offloaded", "tiled"), [(False, False), (True, False), (True, True)],
                         ids=["checkpointed", "offloaded", "offloaded-tiled"])
@pytest.mark.slow
def test_each_layer_compiles_inside_its_checkpoint_in_two_graphs_with_eager_gradients(
        monkeypatch, offloaded, tiled):
    """Compiling the body broke its graph at each layer (offload's saved-tensor hooks, which
    dynamo does not trace; transformers 5.25's context variable inside dynamo's checkpoint) and
    ran the layers eager. Layer by layer: no break, two graphs for any number of layers (the
    first layer's input, the frozen embeddings' output, needs no gradient; the others' do),
    offload's hooks still see each layer's input, and the gradients are the eager ones. A
    tiled MLP's nested checkpoint is traced inside the layer's graph, not broken at."""
    # 32 tokens a batch in tiles of 16 (intermediate / hidden = 2 tiles)
    monkeypatch.setattr(tiled_mlp, "MIN_TILE_TOKENS", 16)
    assert tiled_mlp.tile_count(32, 32, 64) == 2
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    plain = lm_grads(_model(offloaded, tiled), ids)

    packed = []
    real_pack = offload._pack
    monkeypatch.setattr(offload, "_pack", lambda t: packed.append(t.shape) or real_pack(t))
    torch._dynamo.reset()
    counters.clear()
    model = _model(offloaded, tiled)
    lines: list[str] = []
    plan = speed.prepare(model, "default", False, lines.append)
    assert plan.layerwise and lines == ["speed: default, each layer compiled"]
    for _ in range(2):
        packed.clear()
        compiled = lm_grads(model, ids)
        # each layer's hidden states (2 x 16 x 32) once a step, when offloaded
        assert sum(1 for s in packed if s == (2, 16, 32)) == (LAYERS if offloaded else 0)
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert not counters["graph_break"], list(counters["graph_break"])
    assert plain.keys() == compiled.keys() and len(plain) == LAYERS * 7 * 2
    for name, grad in plain.items():
        torch.testing.assert_close(compiled[name], grad, msg=name, rtol=1e-4, atol=1e-6)


def test_an_unrecomputed_body_is_compiled_whole():
    model = checkpointed_qwen2(2)
    model.base_model.model.gradient_checkpointing_disable()
    lines: list[str] = []
    plan = speed.prepare(model, "default", False, lines.append)
    assert not plan.layerwise and lines == ["speed: default"]
    assert model.base_model.model.model._compiled_call_impl is not None
