"""Fine-tune: LoRA/QLoRA on a model (PVC or Model artifact) and data from a PVC, inside the
claimed slice."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Model, Output

from draslice.components.image import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def finetune(
    adapter: Output[Model],
    train_log: Output[Artifact],
    metrics: Output[Metrics],
    data: str,
    model_dir: str = "",
    base_model: Input[Model] = None,
    mount_path: str = "/data",
    checkpoint_root: str = "checkpoints",
    run_id: str = "local",
    data_format: str = "auto",
    max_length: int = 512,
    pack: bool = False,
    eval_fraction: float = 0.0,
    gradient_checkpointing: bool = False,
    bf16_weights: bool = False,
    load_in_4bit: bool = False,
    lora_r: int = 8,
    lora_alpha: int = 16,
    lora_targets: str = "auto",
    batch_size: int = 8,
    steps: int = 100,
    learning_rate: float = 2e-4,
    lr_schedule: str = "cosine",
    warmup_steps: int = 0,
    checkpoint_every: int = 50,
    merge: bool = False,
    log_every: int = 10,
    seed: int = 0,
    device: str = "auto",
    precision: str = "auto",
    slice_memory_gib: float = 0.0,
    compile_mode: str = "off",
) -> NamedTuple(
    "FinetuneOutputs",
    peak_mem_gib=float,
    slice_total_mem_gib=float,
    loss_drop=float,
    device_json=str,
):
    """Fine-tunes a LoRA adapter on a Hugging Face model and a dataset read from a volume.

    The base model is a directory on the volume (``model_dir``) or a Model artifact
    (``base_model``: imported from object storage or an OCI model image, or the output of
    another pipeline), never both. Relative paths are taken under ``mount_path`` (where the
    pipeline mounts the PVC).
    Checkpoints go to the volume too (``checkpoint_root/run_id``), so a retried or preempted
    task resumes from the last one instead of starting over.

    Args:
        adapter: The adapter (``adapter/``), run facts, reference logits, and ``merged/`` when
            ``merge`` is set.
        train_log: Per-step metrics as JSON lines (loss, eval loss, tokens/s, memory).
        metrics: Scalars for the KFP UI.
        data: JSONL (prompt/completion or chat messages) or a saved ``datasets`` directory.
        model_dir: Base model directory in Hugging Face format (with its tokenizer), on the
            volume; empty when ``base_model`` is given.
        base_model: The base model as a Model artifact (a Hugging Face directory with its
            tokenizer); the alternative to ``model_dir``.
        mount_path: Where the model/data volume is mounted.
        checkpoint_root: Checkpoint folder (relative: under ``mount_path``).
        run_id: Sub-folder per run; the pipeline passes its run id.
        data_format: ``auto``, ``prompt-completion``, ``chat`` or ``datasets``.
        max_length: Tokens per example (or packed row).
        pack: Pack examples into full rows.
        eval_fraction: Fraction held out for the eval loss.
        gradient_checkpointing: Recompute activations in backward (less memory).
        bf16_weights: Keep the frozen base in bf16.
        load_in_4bit: QLoRA: a 4-bit NF4 base through bitsandbytes (in the trainer image).
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator.
        lora_targets: ``auto`` (per architecture) or comma-separated module names.
        batch_size: Examples per step.
        steps: Optimizer steps.
        learning_rate: AdamW learning rate.
        lr_schedule: ``constant`` or ``cosine``.
        warmup_steps: Linear warmup steps.
        checkpoint_every: Checkpoint every N steps (0: none).
        merge: Also save the merged model (with the tokenizer).
        log_every: Log the loss (and eval loss) every N steps.
        seed: Seed of LoRA's init, the split and the batch order.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        precision: ``auto``, ``bf16`` or ``fp32``.
        slice_memory_gib: Emulate a slice of this many GiB on a bigger GPU (0: no cap).
        compile_mode: torch.compile of the transformer body: ``off``, ``default`` or
            ``reduce-overhead`` (CUDA graphs; for packed, fixed-width batches). A one-off
            compile of tens of seconds that long runs win back (docs/benchmarks.md).

    Returns:
        peak_mem_gib: Peak memory the training held.
        slice_total_mem_gib: Memory of the slice it ran in (or the emulated cap).
        loss_drop: Fraction by which the training loss fell.
        device_json: The device facts as JSON, for the report.
    """
    import json
    import os
    from collections import namedtuple

    from draslice.errors import InvalidParameter
    from draslice.trainer.sft import SFTConfig, train

    def under_mount(path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(mount_path, path)

    if (base_model is None) == (not model_dir):
        raise InvalidParameter(
            "model_dir", model_dir,
            "give the base model once: a directory on the volume (model_dir) or a Model "
            "artifact (base_model), not " + ("both" if model_dir else "neither"))
    base_dir = base_model.path if base_model is not None else under_mount(model_dir)
    cfg = SFTConfig(
        model_dir=base_dir, data=under_mount(data), data_format=data_format,
        max_length=max_length, pack=pack, eval_fraction=eval_fraction,
        gradient_checkpointing=gradient_checkpointing, bf16_weights=bf16_weights,
        load_in_4bit=load_in_4bit, lora_r=lora_r, lora_alpha=lora_alpha,
        lora_targets=lora_targets, batch_size=batch_size, steps=steps,
        learning_rate=learning_rate, lr_schedule=lr_schedule, warmup_steps=warmup_steps,
        checkpoint_every=checkpoint_every,
        checkpoint_dir=os.path.join(under_mount(checkpoint_root), run_id),
        merge=merge, log_every=log_every, seed=seed, device=device, precision=precision,
        slice_memory_gib=slice_memory_gib, compile=compile_mode,
    )
    os.makedirs(adapter.path, exist_ok=True)
    result = train(cfg, output_dir=adapter.path, metrics_path=train_log.path)
    adapter.metadata.update({"framework": "peft",
                             "base_model": base_model.uri if base_model else cfg.model_dir,
                             "lora_r": lora_r, "lora_targets": result.lora_targets,
                             "merged": bool(result.merged_dir)})
    for name in ("peak_mem_gib", "slice_total_mem_gib", "loss_drop", "initial_loss",
                 "final_loss", "tokens_per_s", "train_seconds", "trainable_params"):
        metrics.log_metric(name, round(float(getattr(result, name)), 4))
    if result.eval_loss is not None:
        metrics.log_metric("eval_loss", round(float(result.eval_loss), 4))
    outputs = namedtuple(
        "FinetuneOutputs", ["peak_mem_gib", "slice_total_mem_gib", "loss_drop", "device_json"]
    )
    return outputs(
        result.peak_mem_gib, result.slice_total_mem_gib, result.loss_drop,
        json.dumps(result.device),
    )
