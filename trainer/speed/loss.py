"""A memory-lean, sync-free causal-LM loss: cross-entropy through the LM head in chunks.

``model(labels=...)`` materialises the logits of the whole batch (batch x seq x vocab, in fp32
for the loss: 0.8 GB for GPT-2 at batch 8 x 512) and keeps them for backward. Here the hidden
states of the *labelled* positions only (prompt tokens cost nothing) go through the LM head a
chunk at a time; each chunk's gradient with respect to the hidden states is computed right
away, so at most one chunk of logits exists at any moment and nothing is recomputed. The LM
head's own weight is frozen under LoRA, so no gradient for it is needed.

Which positions carry a label is decided on the CPU, from the labels the collator built, before
the batch is copied to the device (:func:`to_device`). Choosing them on the GPU (a boolean mask,
``int(mask.sum())``) makes the host wait for the forward pass in the middle of every step, and
on a GPU where launching kernels costs about as long as running them the host then cannot queue
ahead. The copies go from pinned memory for the same reason: a ``non_blocking`` copy from
pageable memory waits too (on an H200 dropping the pinning took GPT-2-124M from 97,472 to
69,172 tokens/s, docs/benchmarks-history.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draslice.trainer.data.examples import IGNORE
from draslice.trainer.device import matmul_dtype

CHUNK_BYTES = 256 * 1024**2  # fp32 logits per chunk


def chunk_tokens(vocab_size: int) -> int:
    return max(128, CHUNK_BYTES // (4 * vocab_size))


@dataclass
class LossBatch:
    """One batch on its device, with its labelled positions already chosen on the host."""

    input_ids: torch.Tensor
    """batch x seq token ids."""
    attention_mask: torch.Tensor | None
    """None unless a row has padding before a real token (see :func:`needs_mask`): the model
    then takes its causal fast path."""
    positions: torch.Tensor
    """Flat indices into the batch x seq hidden states whose *next* token is a label."""
    targets: torch.Tensor
    """The label predicted at each of ``positions``."""
    count: int
    """Labelled tokens (len of ``positions``): the loss is their mean."""
    tokens: int
    """Real (unpadded) tokens: what tokens/s counts."""


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> LossBatch:
    """A collated CPU batch (``input_ids``, ``labels``, optional ``attention_mask``) on ``device``.

    Everything that needs a value (counts, which positions are labelled, whether there is
    padding) is read here on the host, so the training step itself never waits for the GPU.
    """
    ids, labels = batch["input_ids"], batch["labels"]
    mask = batch.get("attention_mask")
    width = ids.shape[1]
    b, s = (labels[:, 1:] != IGNORE).nonzero(as_tuple=True)
    positions = b * width + s
    targets = labels[b, s + 1]
    tokens = int(mask.sum()) if mask is not None else ids.numel()

    def move(t: torch.Tensor) -> torch.Tensor:
        if device.type == "cuda":
            return t.pin_memory().to(device, non_blocking=True)
        return t.to(device)

    return LossBatch(
        input_ids=move(ids), attention_mask=move(mask) if needs_mask(mask) else None,
        positions=move(positions), targets=move(targets), count=int(positions.numel()),
        tokens=tokens,
    )


def needs_mask(mask: torch.Tensor | None) -> bool:
    """Whether a batch's attention mask changes what the labelled tokens see.

    Not for right padding, what ``collate`` makes: under causal attention a real token never
    sees the pads after it, and its position (counted from the row's start) is the same, so
    the mask would only cost speed. Without it the model takes its causal fast path (SDPA's
    flash kernel instead of a materialised mask) and a fixed-width step stays in the body's
    CUDA graph (a packed run's last row is padded). Padding before a real token (left
    padding) does need it.
    """
    return mask is not None and not bool((mask[:, 1:] <= mask[:, :-1]).all())


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Sum of token cross-entropies of ``hidden @ weight.T (+ bias)``; grad to ``hidden`` only.

    The matmuls run in the autocast dtype when autocast is on (as ``F.linear`` would), with the
    head cast once per call rather than once per chunk. A vocabulary that is not a multiple of
    ``VOCAB_ALIGN`` (GPT-2's 50,257) is padded with zero rows whose logits are set to -inf:
    an odd row stride keeps cuBLAS off its fast tensor-core kernels (on an H200 the two head
    matmuls of GPT-2 ran at ~115 TFLOP/s unpadded).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk):  # noqa: D102
        device_type = hidden.device.type
        dtype = matmul_dtype(device_type, weight.dtype)
        vocab = weight.shape[0]
        w, b = _aligned_head(weight, bias, dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        with torch.autocast(device_type, enabled=False):
            for start in range(0, hidden.shape[0], chunk):
                logits = F.linear(hidden[start:start + chunk].to(dtype), w, b)
                loss, grad = chunk_loss_and_grad(logits, targets[start:start + chunk], vocab)
                total += loss
                grad_hidden[start:start + chunk] = grad @ w
        ctx.save_for_backward(grad_hidden)
        return total

    @staticmethod
    def backward(ctx, grad_total):  # noqa: D102
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_total.to(grad_hidden.dtype), None, None, None, None


VOCAB_ALIGN = 64


def _loss_and_grad(logits: torch.Tensor, targets: torch.Tensor, vocab: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A chunk's summed cross-entropy (fp32) and its gradient with respect to the logits:
    softmax minus one-hot, computed in fp32 and rounded once to the logits' dtype. In place
    on one fp32 copy of the chunk, so that the eager form holds no more than that copy."""
    x = logits.float()
    if x.shape[1] != vocab:
        x[:, vocab:] = float("-inf")  # the head's padding rows: probability 0
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    loss = (lse - x.gather(1, targets[:, None])).sum()
    probs = x.sub_(lse).exp_()
    probs[torch.arange(targets.shape[0], device=targets.device), targets] -= 1.0
    return loss, probs.to(logits.dtype)


_fused: Callable | None = None
FUSED_DEVICES: tuple[str, ...] = ("cuda",)
"""Where the chunk is compiled: inductor's CPU code is no faster than eager here, and compiling
it needs a C++ compiler at run time. Empty after a compiler failure, or to measure the eager
form (benchmarks/loss_chunk.py)."""


def chunk_loss_and_grad(logits: torch.Tensor, targets: torch.Tensor, vocab: int
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_loss_and_grad`, on CUDA compiled by inductor into one row reduction and one
    elementwise pass over the chunk's logits; eager it reads and writes a chunk of fp32
    logits (a quarter GiB) about six times, which at a 152k vocabulary is a few percent of a
    step. Sizes are dynamic: the number of labelled tokens, and so the last chunk, changes
    from batch to batch. Where compiling fails (Triton needs a C compiler at run time, which
    a slim image may lack) the first call says so on stderr and every chunk runs eager."""
    global _fused, FUSED_DEVICES
    if logits.device.type not in FUSED_DEVICES:
        return _loss_and_grad(logits, targets, vocab)
    if _fused is None:
        _fused = torch.compile(_loss_and_grad, dynamic=True)
    try:
        return _fused(logits, targets, vocab)
    except Exception as exc:  # noqa: BLE001 -- any compiler failure: the eager form is exact
        FUSED_DEVICES = ()
        print(f"draslice: cross-entropy runs eager ({type(exc).__name__}: "
              f"{str(exc).splitlines()[0][:200] if str(exc) else ''})", file=sys.stderr)
        return _loss_and_grad(logits, targets, vocab)


def _aligned_head(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The head in ``dtype`` with its rows padded to a multiple of ``VOCAB_ALIGN``."""
    w = weight.detach().to(dtype)
    b = bias.detach().to(dtype) if bias is not None else None
    pad = -weight.shape[0] % VOCAB_ALIGN
    if pad:
        w = torch.cat([w, w.new_zeros(pad, w.shape[1])])
        b = torch.cat([b, b.new_zeros(pad)]) if b is not None else None
    return w, b


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
    if getattr(head, LIGER_HEAD, False) and hidden.is_cuda:
        return _liger_sum(hidden, weight, bias, targets)
    return _ChunkedCrossEntropy.apply(hidden, weight, bias, targets, chunk)


LIGER_HEAD = "_draslice_liger_cross_entropy"
"""Set on a head by ``speed.apply_liger``: its loss goes through Liger's fused linear
cross-entropy, in chunks :func:`liger_chunk_mem` sizes (on an H100 at 16,384 tokens and Qwen's
151,936-word vocabulary it needs 0.17-0.19 GiB beside its inputs where the chunks here need
0.65-0.67, and runs in 0.63x their time at hidden 896, 0.73x at 1,536:
``benchmarks/loss_chunk.py``, docs/benchmarks.md)."""


LIGER_CHUNK_MEM: int | None = None
"""A fixed ``chunk_mem_const`` for Liger's loss, or None to size it by :func:`liger_chunk_mem`
(benchmarks set 1, Liger's own default, as the peer ``ours-offload-liger1``)."""


def liger_chunk_mem(rows: int, hidden_size: int, vocab_size: int) -> int:
    """Liger's ``chunk_mem_const`` that makes its chunks about :func:`chunk_tokens` long.

    Liger cuts ``rows`` tokens into chunks of ``next_power_of_2(ceil(rows / ceil(vocab /
    (C * hidden))))``: at its default C=1 a chunk's logits are no larger than the hidden
    states, which under a large vocabulary and a small hidden size (Qwen2.5-0.5B: 151,936
    against 896) is 128 tokens, so its 128 chunks read the 272 MB head twice each. C chosen
    here makes a chunk at most twice ``chunk_tokens`` after that rounding (or Liger's default
    size where that is already larger): its bf16 logits stay within ``CHUNK_BYTES``, the budget
    of this module's own fp32 chunks. On an H100 at 16,384 tokens that took the loss from 36.9
    to 19.9 ms at hidden 896 (C=4; peak +0.17 GiB beside the inputs, the chunks here +0.65) and
    the whole 0.5B step in a 5.75 GiB slice 1.27x faster at the same peak; at hidden 1,536 from
    32.8 to 29.5 ms (C=2); Llama's 32,000 words under hidden 4,096 keep C=1
    (``benchmarks/loss_chunk.py``, docs/benchmarks.md).
    """
    if LIGER_CHUNK_MEM is not None:
        return LIGER_CHUNK_MEM
    return max(1, chunk_tokens(vocab_size) * vocab_size // (max(rows, 1) * hidden_size))


def _liger_sum(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               targets: torch.Tensor) -> torch.Tensor:
    """Liger's fused linear cross-entropy, summed, in the autocast dtype as the chunks run."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    device_type = hidden.device.type
    dtype = matmul_dtype(device_type, weight.dtype)
    with torch.autocast(device_type, enabled=False):
        return liger_fused_linear_cross_entropy(
            hidden.to(dtype), weight.detach().to(dtype),
            targets, bias=None if bias is None else bias.detach().to(dtype), reduction="sum",
            chunk_mem_const=liger_chunk_mem(*hidden.shape, weight.shape[0]))


def split_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(backbone, LM head) of a causal LM, through a peft wrapper if there is one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix), base.get_output_embeddings()


def causal_lm_loss(model: torch.nn.Module, batch: LossBatch) -> torch.Tensor:
    """Mean next-token cross-entropy over the batch's ``count`` labelled tokens."""
    backbone, head = split_head(model)
    # No KV cache: transformers builds one by default even in training (every layer's keys
    # and values copied into it by a concatenation, each forward), and under gradient
    # checkpointing it turns it off itself with a logged warning, which torch.compile cannot
    # trace (the body then falls back to many small compiled frames).
    hidden = backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      use_cache=False).last_hidden_state
    if batch.count == 0:
        return hidden.sum() * 0.0
    flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.positions)
    total = chunked_cross_entropy(flat, head, batch.targets, chunk_tokens(head.weight.shape[0]))
    return total / batch.count
