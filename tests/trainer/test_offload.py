"""offload_activations: the checkpointed layer inputs in host memory (trainer/offload.py).

On a CPU the hooks leave tensors where they are, so these tests check the wiring with the
installed transformers (each layer calls the swapped function, gradients unchanged) and the
knob's rule; tests/trainer/test_gpu.py checks the copies and the memory saved on a GPU.
"""

from __future__ import annotations

import torch

from draslice.trainer import offload
from draslice.trainer.config import ModelShape
from tests.trainer.grads import checkpointed_base, lm_grads


def test_every_checkpointed_layer_takes_the_offloading_function_and_grads_stay(monkeypatch):
    shape = ModelShape(vocab_size=64, n_layer=3, n_embd=32, n_head=2, seq_len=16)
    model = checkpointed_base(shape)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    plain = lm_grads(model, ids)

    calls = []
    real = offload.offloaded_checkpoint
    monkeypatch.setattr(offload, "offloaded_checkpoint",
                        lambda fn, *a, **kw: calls.append(1) or real(fn, *a, **kw))
    assert offload.enable(model) == shape.n_layer
    moved = lm_grads(model, ids)
    assert len(calls) == shape.n_layer  # each layer's forward went through it
    assert plain.keys() == moved.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(moved[name], grad, msg=name)


def _tiny_qwen2(layers: int) -> torch.nn.Module:
    """A checkpointed Qwen2 (the architecture the slice benchmarks tune) with LoRA on every
    projection, B non-zero so every LoRA weight gets a gradient."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from draslice.trainer import build
    from draslice.trainer.model import wrap_lora

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        base = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
        model = wrap_lora(base, 4, 8, 0.0,
                          "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.1)
    base.train()
    build.checkpointing(base)
    return model


def test_compile_with_offload_compiles_each_layer_inside_its_hooks_in_one_graph(monkeypatch):
    """torch.compile of the body would break at each layer's saved-tensor hooks and run the
    layers eager; compiled layer by layer, the hooks still see each layer's input, the layers
    share two graphs with no break, and the gradients are the eager ones."""
    from torch._dynamo.utils import counters

    from draslice.trainer import speed

    layers = 4
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    eager = _tiny_qwen2(layers)
    offload.enable(eager.base_model.model)
    plain = lm_grads(eager, ids)

    packed = []
    real_pack = offload._pack
    monkeypatch.setattr(offload, "_pack", lambda t: packed.append(t.shape) or real_pack(t))
    torch._dynamo.reset()
    counters.clear()
    model = _tiny_qwen2(layers)
    offload.enable(model.base_model.model)
    lines = []
    plan = speed.prepare(model, "default", False, lines.append)
    assert plan.layerwise and lines == ["speed: default, each layer compiled"]
    for _ in range(2):
        packed.clear()
        compiled = lm_grads(model, ids)
        # the hidden states (2 x 16 x 32) of each layer, once a step
        assert sum(1 for s in packed if s == (2, 16, 32)) == layers
    # two graphs for any number of layers: the first layer's input (the frozen embeddings'
    # output) needs no gradient, the others' do
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert not counters["graph_break"], list(counters["graph_break"])
    assert plain.keys() == compiled.keys() and len(plain) == layers * 7 * 2
    for name, grad in plain.items():
        torch.testing.assert_close(compiled[name], grad, msg=name, rtol=1e-4, atol=1e-6)
