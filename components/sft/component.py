"""SFT: LoRA fine-tune inside the claimed slice."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Metrics, Model, Output

from draslice.components.image import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def sft(
    adapter: Output[Model],
    train_log: Output[Artifact],
    metrics: Output[Metrics],
    vocab_size: int = 512,
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 4,
    seq_len: int = 64,
    lora_r: int = 8,
    lora_alpha: int = 16,
    lora_dropout: float = 0.0,
    lora_targets: str = "c_attn,c_proj,c_fc",
    batch_size: int = 8,
    steps: int = 30,
    learning_rate: float = 3e-3,
    log_every: int = 10,
    dataset_size: int = 256,
    seed: int = 0,
    device: str = "auto",
    precision: str = "auto",
    slice_memory_gib: float = 0.0,
) -> NamedTuple(
    "SFTOutputs",
    peak_mem_gib=float,
    slice_total_mem_gib=float,
    loss_drop=float,
    device_json=str,
):
    """Trains a LoRA adapter on a small causal LM and saves it as the ``adapter`` Model.

    Defaults are the seed guide's example: GPT-2 shape (vocab 512, 4 layers, width 256,
    4 heads, sequence 64), LoRA r=8 alpha 16, batch 8, 30 steps, on learnable synthetic data.

    Args:
        adapter: The LoRA adapter (``save_pretrained`` layout) plus what validate needs.
        train_log: Per-step metrics as JSON lines (step, loss, tokens_per_s, memory).
        metrics: Scalars for the KFP UI.
        vocab_size: Vocabulary size of the base model.
        n_layer: Transformer layers.
        n_embd: Hidden width.
        n_head: Attention heads (must divide n_embd).
        seq_len: Tokens per training sequence.
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator.
        lora_dropout: Dropout on the LoRA path.
        lora_targets: Comma-separated module names; the seed's choice is ``c_attn`` alone.
        batch_size: Sequences per step (at most dataset_size).
        steps: Optimizer steps (>= 1).
        learning_rate: AdamW learning rate.
        log_every: Print the loss every N steps.
        dataset_size: Synthetic sequences in the training set.
        seed: Seed of the base model, the data and the batch order.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        precision: ``auto`` (bf16 where supported, else fp32), ``bf16`` or ``fp32``.
        slice_memory_gib: Emulate a slice of this many GiB on a bigger GPU (0: no cap).

    Returns:
        peak_mem_gib: Peak memory the training held.
        slice_total_mem_gib: Memory of the slice it ran in (or the emulated cap).
        loss_drop: Fraction by which the loss fell.
        device_json: The device facts as JSON, for the report.
    """
    import json
    import os
    from collections import namedtuple

    from draslice.trainer.model import ModelShape
    from draslice.trainer.sft import SFTConfig, train

    cfg = SFTConfig(
        shape=ModelShape(vocab_size, n_layer, n_embd, n_head, seq_len),
        lora_r=lora_r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        lora_targets=lora_targets,
        batch_size=batch_size,
        steps=steps,
        learning_rate=learning_rate,
        log_every=log_every,
        dataset_size=dataset_size,
        seed=seed,
        device=device,
        precision=precision,
        slice_memory_gib=slice_memory_gib,
    )
    os.makedirs(adapter.path, exist_ok=True)
    result = train(cfg, output_dir=adapter.path, metrics_path=train_log.path)
    adapter.metadata.update({"framework": "peft", "lora_r": lora_r, "lora_targets": lora_targets})
    for name in ("peak_mem_gib", "slice_total_mem_gib", "loss_drop", "initial_loss",
                 "final_loss", "tokens_per_s", "train_seconds", "trainable_params"):
        metrics.log_metric(name, round(float(getattr(result, name)), 4))
    outputs = namedtuple(
        "SFTOutputs", ["peak_mem_gib", "slice_total_mem_gib", "loss_drop", "device_json"]
    )
    return outputs(
        result.peak_mem_gib, result.slice_total_mem_gib, result.loss_drop,
        json.dumps(result.device),
    )
