"""A run's result: its measured figures (``SFTResult``) and the models it leaves, made at the
end of the loop: the adapter, the reference logits validate compares, the merged model on
request. :func:`save_outputs` writes them all in one call, through ``outputs`` (the folder's
layout, and the atomic set with the run file written last as its record).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from draslice.trainer import loglines, outputs
from draslice.trainer.config import SFTConfig
from draslice.trainer.data.examples import TokenRows
from draslice.trainer.model import build_base, load_pretrained, wrap_lora
from draslice.trainer.outputs import ADAPTER_DIR, MERGED_DIR

LOSS_TAIL = 5  # the final loss is the mean of the last steps: one batch is noisy
REFERENCE_ROWS, REFERENCE_TOKENS = 2, 16  # a real vocabulary makes full logits big


@dataclass
class SFTResult:
    """A run's measured figures, as the run file records them."""

    device: dict
    precision: str
    trainable_params: int
    total_params: int
    initial_loss: float
    final_loss: float
    loss_drop: float
    peak_mem_gib: float
    slice_total_mem_gib: float
    tokens_per_s: float
    """The steady rate: tokens trained in this process after its warm-up steps over the
    seconds those steps took (measured per step; evaluation and checkpoints not included;
    ``measure.Speed``)."""
    train_seconds: float
    """Every step's seconds, warm-up included."""
    steps: int
    lora_targets: str = ""
    train_tokens: int = 0
    eval_loss: float | None = None
    resumed_from_step: int = 0
    train_examples: int = 0
    eval_examples: int = 0
    merged_dir: str | None = None
    steady_from_step: int | None = None
    """The first step the steady rate counts (None: no step after the warm-up)."""
    warmup_seconds: float = 0.0
    """The warm-up steps' seconds: compilation, graph capture and first calls."""
    wall_seconds: float = 0.0
    """The run's wall time to its last step: checks, load, warm-up, steps, evaluation and
    checkpoints."""

    def to_dict(self) -> dict:
        return asdict(self)


def loss_drop(losses: list[float]) -> tuple[float, float, float]:
    """(initial, final, fraction fallen): first step against the mean of the last steps."""
    initial = losses[0]
    tail = losses[-LOSS_TAIL:]
    final = sum(tail) / len(tail)
    return initial, final, (1.0 - final / initial) if initial > 0 else 0.0


def save_outputs(model: torch.nn.Module, cfg: SFTConfig, rows: TokenRows, tokenizer,
                 result: SFTResult, output_dir: Path, device: torch.device,
                 log: Callable[[str], None]) -> SFTResult:
    """Everything a run leaves, as one set (``outputs``): the adapter and the reference logits,
    each swapped in whole, the merged model with ``merge``, then the run file, written last
    and listing every file of the set, whose presence says the rest is there and whole."""
    outputs.save_final(model, reference_batch(cfg, rows), output_dir, device)
    if cfg.merge:
        result.merged_dir = str(export_merged(cfg, output_dir, tokenizer, log))
    outputs.commit(output_dir, {"config": cfg.to_dict(), "result": result.to_dict()})
    return result


def reference_batch(cfg: SFTConfig, rows: TokenRows) -> torch.Tensor:
    """The fixed batch whose logits validate compares: the seed's batch, or a small slice."""
    if cfg.synthetic:
        return rows.collate(range(cfg.batch_size))["input_ids"]
    n = min(REFERENCE_ROWS, len(rows))
    width = min(REFERENCE_TOKENS, min(len(rows.input_ids[i]) for i in range(n)))
    return torch.tensor([rows.input_ids[i][:width] for i in range(n)])


def export_merged(cfg: SFTConfig, output_dir: Path, tokenizer, log) -> Path:
    """The base with the adapter merged in, saved (with the tokenizer) as a plain HF model.

    The base is reloaded unquantised on the CPU (a 4-bit base cannot take merged weights).
    """
    from peft import PeftModel

    merged = PeftModel.from_pretrained(cpu_base(cfg),
                                       output_dir / ADAPTER_DIR).merge_and_unload()
    final = output_dir / MERGED_DIR
    tmp = output_dir / f"{outputs.TMP_PREFIX}{MERGED_DIR}"
    merged.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    outputs.replace_path(tmp, final)
    log(loglines.merged(final))
    return final


def cpu_base(cfg: SFTConfig) -> torch.nn.Module:
    """The base loaded whole and unquantised on the CPU (a 4-bit base cannot take merged
    weights; a base sharded by FSDP2 fits no one device)."""
    if cfg.synthetic:
        return build_base(cfg.shape, cfg.seed)
    dtype = torch.bfloat16 if (cfg.bf16_weights or cfg.load_in_4bit) else torch.float32
    return load_pretrained(cfg.model_dir, dtype=dtype)


def whole_on_cpu(cfg: SFTConfig, adapter: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The trained model rebuilt on the CPU from the LoRA weights gathered whole
    (``distributed.full_trainable``): what rank 0 saves the outputs from when FSDP2 left each
    process a shard."""
    model = wrap_lora(cpu_base(cfg), cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout,
                      cfg.lora_targets)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # as trained (build.assemble)
    unexpected = model.load_state_dict(adapter, strict=False).unexpected_keys
    if unexpected:
        raise RuntimeError(f"gathered LoRA weights {unexpected[:3]} fit no parameter")
    return model
