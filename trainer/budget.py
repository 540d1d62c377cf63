"""The slice-memory budget: the one rule for "does this job fit its slice".

A job fits when its peak stays below the slice's memory minus a headroom fraction. The headroom
covers what the allocator's peak does not count (the CUDA context, cuBLAS workspaces, NCCL),
which on a real MIG slice comes out of the same few GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from draslice.errors import InvalidParameter
from draslice.trainer.config import KNOBS

DEFAULT_HEADROOM = KNOBS["memory_headroom"].default
GIB = 1024**3
# What one training step of the synthetic GPT-2 holds, per token: each layer keeps 34 x hidden
# bytes of activations at 16-bit for backward (Korthikanti et al. 2022, "Reducing Activation
# Recomputation in Large Transformer Models", eq. 1, less its 5as/h of attention scores, which
# PyTorch's SDPA does not keep), twice that in fp32; the loss holds fp32 logits, their softmax
# and its gradient over the vocabulary. On the CPU (fp32) the estimate came to 80% of the peak
# measured at 1,024 to 4,096 tokens a row: an estimate that refuses only what cannot fit.
ACTIVATION_BYTES_PER_LAYER = 34
LOGIT_COPIES = 3


def check_headroom(headroom: float) -> float:
    KNOBS["memory_headroom"].check(headroom)
    return headroom


def budget_gib(slice_mem_gib: float, headroom: float = DEFAULT_HEADROOM) -> float:
    """Usable memory of a slice: its total less the headroom fraction."""
    return slice_mem_gib * (1.0 - check_headroom(headroom))


def fits(peak_gib: float, slice_mem_gib: float, headroom: float = DEFAULT_HEADROOM) -> bool:
    return slice_mem_gib > 0 and peak_gib <= budget_gib(slice_mem_gib, headroom)


@dataclass(frozen=True)
class Lever:
    """A memory lever: the knobs it changes and why that saves memory."""

    why: str
    changes: dict

    @property
    def flag(self) -> str:
        """What a user types for it: the knobs' ``draslice train`` flags."""
        return " ".join("--" + name.replace("_", "-") + ("" if value is True else f" {value}")
                        for name, value in self.changes.items())

    def describe(self) -> str:
        return f"{self.flag} ({self.why})"


def knobs_to_try(cfg) -> list[Lever]:
    """Memory levers a fine-tune config does not use yet, the cheapest in speed first.

    ``cfg`` is an ``SFTConfig`` (duck-typed, so this module stays free of the trainer).
    """
    real = bool(getattr(cfg, "model_dir", ""))
    knobs = []
    if not cfg.gradient_checkpointing:
        knobs.append(Lever("activations are recomputed in backward instead of kept; ~30% slower",
                           {"gradient_checkpointing": True}))
    if not getattr(cfg, "offload_activations", False):
        knobs.append(Lever("the checkpointed layer inputs wait in host memory; GPU only; "
                           "slower than checkpointing alone at the same batch",
                           {"gradient_checkpointing": True, "offload_activations": True}))
    if not getattr(cfg, "tile_mlp", False):
        knobs.append(Lever("each layer's MLP runs a tile of tokens at a time, so its "
                           "intermediate activations, a long sequence's largest, never exist "
                           "whole; one more MLP forward",
                           {"gradient_checkpointing": True, "tile_mlp": True}))
    if not cfg.bf16_weights and not cfg.load_in_4bit:
        knobs.append(Lever("halves the frozen base's weights", {"bf16_weights": True}))
    if cfg.batch_size > 1:
        half = max(1, cfg.batch_size // 2)
        knobs.append(Lever("half the activations per step", {"batch_size": half}))
    if real and not cfg.load_in_4bit:
        knobs.append(Lever("QLoRA: a 4-bit base, about a quarter of bf16; needs bitsandbytes",
                           {"load_in_4bit": True}))
    if real and cfg.max_length > 64:
        half = cfg.max_length // 2
        knobs.append(Lever("shorter sequences; cuts long examples", {"max_length": half}))
    return knobs


def oom_advice(slice_mem_gib: float, reached_gib: float, knobs: list[Lever] | None = None
               ) -> str:
    """What to tell a user whose job ran out of memory inside a slice."""
    advice = (
        f"out of memory inside the slice: the slice has {slice_mem_gib:.2f} GiB and the job "
        f"had reached {reached_gib:.2f} GiB when an allocation failed. Choose a bigger profile "
        "(for example 2g.12gb instead of 1g.6gb), or lower batch_size / seq_len."
    )
    if knobs:
        advice += " Levers not in use yet: " + "; ".join(k.describe() for k in knobs) + "."
    return advice


def synthetic_step_bytes(cfg, precision: str) -> tuple[float, float]:
    """(bytes per token of a row, bytes besides) that a step of the synthetic run holds,
    estimated from the shape of an ``SFTConfig``: activations and logits grow with the tokens
    of a batch, the learned position table with ``seq_len`` (counted per token of the first
    row), the rest of the weights stay."""
    s = cfg.shape
    scale = 1 if precision == "bf16" else 2  # the 34 bytes are at 16-bit
    per_token = (ACTIVATION_BYTES_PER_LAYER * s.n_embd * s.n_layer * scale
                 + LOGIT_COPIES * 4 * s.vocab_size)
    weight = 2 if cfg.bf16_weights else 4
    fixed = (12 * s.n_layer * s.n_embd**2 + s.vocab_size * s.n_embd) * weight
    return per_token * cfg.batch_size + s.n_embd * weight, fixed


def check_synthetic_fits(cfg, precision: str, device_gib: float, device: str) -> None:
    """Refuse a synthetic ``seq_len`` whose step cannot fit the device's memory (the slice
    cap, the GPU, or the host's memory on the CPU), naming the longest that could."""
    per_seq_token, fixed = synthetic_step_bytes(cfg, precision)
    need = per_seq_token * cfg.shape.seq_len + fixed
    if need <= device_gib * GIB:
        return
    longest = int((device_gib * GIB - fixed) // per_seq_token)
    raise InvalidParameter(
        "seq_len", cfg.shape.seq_len,
        f"a synthetic step of {cfg.batch_size} x {cfg.shape.seq_len} tokens needs about "
        f"{need / GIB:.1f} GiB (activations, logits and weights, estimated), more than the "
        f"{device_gib:.2f} GiB of {device}; at most about {max(longest, 0):,} tokens fit at "
        f"batch_size {cfg.batch_size}")
