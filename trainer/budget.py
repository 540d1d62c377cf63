"""The slice-memory budget: the one rule for "does this job fit its slice".

A job fits when its peak stays below the slice's memory minus a headroom fraction. The headroom
covers what the allocator's peak does not count (the CUDA context, cuBLAS workspaces, NCCL),
which on a real MIG slice comes out of the same few GiB.
"""

from __future__ import annotations

from draslice.trainer.errors import InvalidParameter

DEFAULT_HEADROOM = 0.10


def check_headroom(headroom: float) -> float:
    if not 0.0 <= headroom < 1.0:
        raise InvalidParameter("memory_headroom", headroom, "must be a fraction in [0, 1)")
    return headroom


def budget_gib(slice_mem_gib: float, headroom: float = DEFAULT_HEADROOM) -> float:
    """Usable memory of a slice: its total less the headroom fraction."""
    return slice_mem_gib * (1.0 - check_headroom(headroom))


def fits(peak_gib: float, slice_mem_gib: float, headroom: float = DEFAULT_HEADROOM) -> bool:
    return slice_mem_gib > 0 and peak_gib <= budget_gib(slice_mem_gib, headroom)


def knobs_to_try(cfg) -> list[str]:
    """Memory levers a fine-tune config does not use yet, the cheapest in speed first.

    ``cfg`` is an ``SFTConfig`` (duck-typed: this module stays free of the trainer).
    """
    knobs = []
    if not getattr(cfg, "gradient_checkpointing", True):
        knobs.append("gradient checkpointing (--gradient-checkpointing): activations are "
                     "recomputed in backward instead of kept, ~30% slower")
    if not getattr(cfg, "bf16_weights", True) and not getattr(cfg, "load_in_4bit", True):
        knobs.append("bf16 weights (--bf16-weights): halves the frozen base")
    if cfg.batch_size > 1:
        knobs.append(f"a smaller batch (--batch-size {max(1, cfg.batch_size // 2)})")
    length = cfg.max_length if getattr(cfg, "model_dir", "") else cfg.shape.seq_len
    if length > 64:
        flag = "--max-length" if getattr(cfg, "model_dir", "") else "--seq-len"
        knobs.append(f"shorter sequences ({flag} {length // 2})")
    if getattr(cfg, "model_dir", "") and not getattr(cfg, "load_in_4bit", True):
        knobs.append("QLoRA (--load-in-4bit, needs bitsandbytes): a 4-bit base, about a "
                     "quarter of bf16")
    return knobs


def oom_advice(slice_mem_gib: float, reached_gib: float, knobs: list[str] | None = None) -> str:
    """What to tell a user whose job ran out of memory inside a slice."""
    advice = (
        f"out of memory inside the slice: the slice has {slice_mem_gib:.2f} GiB and the job "
        f"had reached {reached_gib:.2f} GiB when an allocation failed. Choose a bigger profile "
        "(for example 2g.12gb instead of 1g.6gb), or lower batch_size / seq_len."
    )
    if knobs:
        advice += " Levers not in use yet: " + "; ".join(knobs) + "."
    return advice
