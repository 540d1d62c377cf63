"""grad_checkpointing.enable: the loop's gradient checkpointing (non-reentrant) changes no LoRA
gradient, and leaves the embeddings' output as it is (transformers' hook that makes it require
grad is for the reentrant kind: a backward through frozen weights and a torch.compile break)."""

from __future__ import annotations

import torch

from draslice.trainer import grad_checkpointing
from draslice.trainer.config import ModelShape
from draslice.trainer.model import build_base, wrap_lora
from tests.trainer.grads import param_grads, qwen2_lora


def _lora_grads(checkpointed: bool, ids: torch.Tensor) -> tuple[dict, torch.nn.Module]:
    base = build_base(ModelShape(vocab_size=64, n_layer=3, n_embd=32, n_head=2, seq_len=16),
                      seed=0)
    torch.manual_seed(1)  # LoRA's A is drawn from the global generator
    model = wrap_lora(base, 4, 8, 0.0, "c_attn,c_proj,c_fc")
    for name, param in model.named_parameters():  # B starts at zero: give A a gradient too
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1, generator=torch.Generator().manual_seed(1))
    if checkpointed:
        grad_checkpointing.enable(base)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    return param_grads(model), base


def test_checkpointing_keeps_every_lora_gradient_and_no_input_grad_hook():
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    plain, _ = _lora_grads(False, ids)
    recomputed, base = _lora_grads(True, ids)
    # A and B of c_attn, attn.c_proj, c_fc and mlp.c_proj in each of the 3 layers
    assert len(plain) == 3 * 4 * 2 and plain.keys() == recomputed.keys()
    for name, grad in plain.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(recomputed[name], grad, msg=name)
    embeddings = base.get_input_embeddings()
    assert not embeddings._forward_hooks  # nothing makes its output require grad
    assert not embeddings(ids).requires_grad


def test_the_reentrant_kind_keeps_every_lora_gradient_with_the_grouped_forward(monkeypatch):
    """grad_checkpointing.REENTRANT (the A/B of benchmarks' ours-offload-reentrant): a Qwen2
    with lora_fused's groups, checkpointed either way, gets the unchecked model's gradients,
    the first layer's included (the embeddings' output requires grad for the reentrant kind)."""
    from draslice.trainer import lora_fused

    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))

    def grads(kind: bool | None) -> dict[str, torch.Tensor]:
        model = qwen2_lora(layers=2)
        if kind is not None:
            monkeypatch.setattr(grad_checkpointing, "REENTRANT", kind)
            grad_checkpointing.enable(model.get_base_model())
        with lora_fused.fused(model):
            model(input_ids=ids, labels=ids).loss.backward()
        return param_grads(model)

    plain = grads(None)
    assert len(plain) == 2 * 7 * 2
    for kind in (False, True):
        recomputed = grads(kind)
        assert recomputed.keys() == plain.keys(), kind
        for name, grad in plain.items():
            torch.testing.assert_close(recomputed[name], grad, msg=f"{kind} {name}")
