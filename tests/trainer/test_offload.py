"""offload_activations: the checkpointed layer inputs in host memory (trainer/speed/offload.py).

On a CPU the hooks leave tensors where they are, so these tests check the wiring with the
installed transformers (each layer calls the swapped function, gradients unchanged) and the
knob's rule; tests/trainer/test_gpu.py checks the copies and the memory saved on a GPU.
"""

from __future__ import annotations

import torch

from draslice.tests.trainer.grads import checkpointed_base, lm_grads
from draslice.trainer.config import ModelShape
from draslice.trainer.speed import offload


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

