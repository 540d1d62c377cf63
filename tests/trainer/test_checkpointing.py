"""grad_checkpointing: either kind of checkpoint changes no LoRA gradient; the non-reentrant one
leaves the embeddings' output as it is (transformers' hook that makes it require grad is for the
reentrant kind: a backward through frozen weights and a torch.compile break); which kind a model
gets (``choose``)."""

from __future__ import annotations

import torch

from draslice.tests.trainer.grads import param_grads, qwen2_lora
from draslice.trainer.config import ModelShape
from draslice.trainer.model import build_base, wrap_lora
from draslice.trainer.speed import grad_checkpointing


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


def test_the_reentrant_kind_keeps_every_lora_gradient_with_the_grouped_forward():
    """Either kind of checkpoint (grad_checkpointing.choose's, the A/B of benchmarks'
    ours-offload-reentrant and -hooks): a Qwen2
    with lora_fused's groups, checkpointed either way, gets the unchecked model's gradients,
    the first layer's included (the embeddings' output requires grad for the reentrant kind)."""
    from draslice.trainer.speed import lora_fused

    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))

    def grads(kind: bool | None) -> dict[str, torch.Tensor]:
        model = qwen2_lora(layers=2)
        if kind is not None:
            grad_checkpointing.enable(model.get_base_model(), kind)
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


def test_choose_takes_the_reentrant_kind_only_for_a_small_eager_single_process_model(
        monkeypatch):
    """Reentrant up to LAUNCH_BOUND_WIDTH (measured faster only where launch-bound), never
    under inductor or DDP, and REENTRANT overrides the choice either way."""
    small = qwen2_lora(layers=1).get_base_model()
    wide = torch.nn.Linear(1, 1)
    wide.config = type("Config", (), {"hidden_size": grad_checkpointing.LAUNCH_BOUND_WIDTH + 1})()
    assert grad_checkpointing.choose(small, eager=True) is True
    assert grad_checkpointing.choose(small, eager=False) is False
    assert grad_checkpointing.choose(wide, eager=True) is False
    assert grad_checkpointing.choose(torch.nn.Linear(1, 1), eager=True) is False  # no config
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    assert grad_checkpointing.choose(small, eager=True) is False
    monkeypatch.setattr(grad_checkpointing, "REENTRANT", True)
    assert grad_checkpointing.choose(wide, eager=False) is True
    monkeypatch.setattr(grad_checkpointing, "REENTRANT", False)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    assert grad_checkpointing.choose(small, eager=True) is False


def test_offload_keeps_the_kind_enable_gave_each_layer():
    """offload.enable wraps each layer's checkpoint function in its own and keeps the kind
    transformers' partial carried (so the offloaded step is the chosen kind too)."""
    from draslice.trainer.speed import offload

    for kind in (False, True):
        base = qwen2_lora(layers=2).get_base_model()
        grad_checkpointing.enable(base, kind)
        assert offload.enable(base) == 2
        for module in grad_checkpointing.flagged(base):
            func = module._gradient_checkpointing_func
            assert func.func is offload.offloaded_checkpoint
            assert func.keywords["inner"].keywords == {"use_reentrant": kind}
