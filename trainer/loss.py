"""A memory-lean causal-LM loss: cross-entropy through the LM head in chunks.

``model(labels=...)`` materialises the logits of the whole batch (batch x seq x vocab, in fp32
for the loss: 0.8 GB for GPT-2 at batch 8 x 512) and keeps them for backward. Here the hidden
states of the *labelled* positions only (prompt tokens cost nothing) go through the LM head a
chunk at a time; each chunk's gradient with respect to the hidden states is computed right
away, so at most one chunk of logits exists at any moment and nothing is recomputed. The LM
head's own weight is frozen under LoRA, so no gradient for it is needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draslice.trainer.examples import IGNORE

CHUNK_BYTES = 256 * 1024**2  # fp32 logits per chunk


def chunk_tokens(vocab_size: int) -> int:
    return max(128, CHUNK_BYTES // (4 * vocab_size))


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Sum of token cross-entropies of ``hidden @ weight.T (+ bias)``; grad to ``hidden`` only."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk):  # noqa: D102
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        for start in range(0, hidden.shape[0], chunk):
            h = hidden[start:start + chunk]
            t = targets[start:start + chunk]
            logits = F.linear(h, weight, bias).float()
            lse = torch.logsumexp(logits, dim=-1)
            total += (lse - logits.gather(1, t[:, None]).squeeze(1)).sum()
            # d(sum CE)/d(logits) = softmax - one_hot, computed in place on the chunk.
            probs = logits.sub_(lse[:, None]).exp_()
            probs[torch.arange(t.shape[0], device=t.device), t] -= 1.0
            grad_hidden[start:start + chunk] = probs.to(weight.dtype) @ weight
        ctx.save_for_backward(grad_hidden)
        return total

    @staticmethod
    def backward(ctx, grad_total):  # noqa: D102
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_total.to(grad_hidden.dtype), None, None, None, None


def chunked_cross_entropy(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor,
                          chunk: int) -> torch.Tensor:
    """Sum of cross-entropies of ``head(hidden)`` against ``targets`` (rows of ``hidden``)."""
    weight, bias = head.weight, getattr(head, "bias", None)
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        # A trainable head (not our LoRA setup): plain autograd, still chunked.
        return sum(
            F.cross_entropy(F.linear(hidden[s:s + chunk], weight, bias).float(),
                            targets[s:s + chunk], reduction="sum")
            for s in range(0, hidden.shape[0], chunk)
        )
    if not (torch.is_grad_enabled() and hidden.requires_grad):
        with torch.no_grad():
            return sum(
                F.cross_entropy(F.linear(hidden[s:s + chunk], weight, bias).float(),
                                targets[s:s + chunk], reduction="sum")
                for s in range(0, hidden.shape[0], chunk)
            )
    return _ChunkedCrossEntropy.apply(hidden, weight, bias, targets, chunk)


def split_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(backbone, LM head) of a causal LM, through a peft wrapper if there is one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix), base.get_output_embeddings()


def causal_lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]
                   ) -> tuple[torch.Tensor, int]:
    """Mean next-token cross-entropy over labelled tokens, and how many there were."""
    backbone, head = split_head(model)
    hidden = backbone(input_ids=batch["input_ids"],
                      attention_mask=batch.get("attention_mask")).last_hidden_state
    targets = batch["labels"][:, 1:]
    keep = targets != IGNORE
    count = int(keep.sum())
    if count == 0:
        return hidden.sum() * 0.0, 0
    total = chunked_cross_entropy(hidden[:, :-1][keep], head, targets[keep],
                                  chunk_tokens(head.weight.shape[0]))
    return total / count, count
