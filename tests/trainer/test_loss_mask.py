"""Right-padded batches reach the model without an attention mask (trainer/loss.needs_mask):
the loss is the mask's, on each architecture the trainer takes."""

from __future__ import annotations

import pytest
import torch

from draslice.trainer.data.examples import IGNORE, TokenRows
from draslice.trainer.speed.loss import LossBatch, causal_lm_loss, needs_mask, to_device


@pytest.mark.parametrize(("mask", "needed"), [
    (None, False),
    ([[1, 1, 1, 1], [1, 1, 1, 1]], False),
    ([[1, 1, 1, 1], [1, 1, 0, 0]], False),  # right padding: what collate makes
    ([[1, 1, 1, 1], [0, 0, 1, 1]], True),  # left padding
    ([[1, 0, 1, 1], [1, 1, 1, 1]], True),  # a hole
])
def test_only_padding_before_a_real_token_needs_the_mask(mask, needed):
    assert needs_mask(None if mask is None else torch.tensor(mask)) is needed


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_a_right_padded_batch_has_the_masked_loss_and_gradients(tmp_path, arch):
    from transformers import AutoModelForCausalLM

    from draslice.tests.scratch import save_scratch_model

    path = save_scratch_model(tmp_path / arch, arch, hidden_size=32, num_layers=2, num_heads=4,
                              num_kv_heads=2, intermediate_size=64, vocab_size=300,
                              max_positions=64, dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (24, 11, 17)]
    labels = [[IGNORE] * 4 + r[4:] for r in rows]
    collated = TokenRows(rows, labels, pad_id=0).collate([0, 1, 2])
    assert collated["attention_mask"].sum() < collated["attention_mask"].numel()

    unmasked = to_device(collated, torch.device("cpu"))
    assert unmasked.attention_mask is None
    masked = LossBatch(**{**vars(unmasked), "attention_mask": collated["attention_mask"]})

    def loss_and_grads(batch: LossBatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        loss = causal_lm_loss(model, batch)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    loss, grads = loss_and_grads(unmasked)
    want, want_grads = loss_and_grads(masked)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    assert len(grads) == len(want_grads) > 0
    for got, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
