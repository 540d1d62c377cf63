"""Fine-tune: LoRA/QLoRA inside the claimed slice, on the built-in model and data (the demo
run) or on a model from a volume or a Model artifact and data from a volume."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Model, Output

from draslice.components.image import TRAINER_IMAGE
from draslice.components.knob_docs import with_input_docs

# The inputs that are not fine-tune knobs (trainer/config.py declares those).
NOT_KNOBS = {
    "adapter": "The adapter (``adapter/``), run facts, reference logits, and ``merged/`` when "
               "``merge`` is set.",
    "train_log": "Per-step metrics as JSON lines (loss, eval loss, step seconds, tokens/s, "
                 "memory).",
    "metrics": "Scalars for the KFP UI.",
    "base_model": "The base model as a Model artifact (a Hugging Face directory with its "
                  "tokenizer); the alternative to model_dir.",
    "mount_path": "Where the model/data volume is mounted: relative model_dir, data and "
                  "checkpoint_dir are taken under it.",
    "run_id": "Sub-folder of checkpoint_dir for this run (the pipeline passes its run id), so "
              "a retried task resumes its own run.",
}


def finetune(
    adapter: Output[Model],
    train_log: Output[Artifact],
    metrics: Output[Metrics],
    base_model: Input[Model] = None,
    mount_path: str = "/data",
    run_id: str = "",
    model_dir: str = "",
    data: str = "",
    data_format: str = "auto",
    max_length: int = 512,
    pack: bool = False,
    eval_fraction: float = 0.0,
    lora_r: int = 8,
    lora_alpha: int = 16,
    lora_dropout: float = 0.0,
    lora_targets: str = "auto",
    batch_size: int = 8,
    steps: int = 30,
    learning_rate: float = 3e-3,
    weight_decay: float = 0.0,
    lr_schedule: str = "constant",
    warmup_steps: int = 0,
    log_every: int = 10,
    seed: int = 0,
    dataset_size: int = 256,
    alphabet: int = 64,
    device: str = "auto",
    precision: str = "auto",
    slice_memory_gib: float = 0.0,
    gradient_checkpointing: bool = False,
    offload_activations: bool = False,
    tile_mlp: bool = False,
    bf16_weights: bool = False,
    load_in_4bit: bool = False,
    checkpoint_every: int = 0,
    checkpoint_dir: str = "",
    merge: bool = False,
    compile: str = "auto",
    fsdp: bool = False,
    vocab_size: int = 512,
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 4,
    seq_len: int = 64,
) -> NamedTuple(
    "FinetuneOutputs",
    peak_mem_gib=float,
    slice_total_mem_gib=float,
    loss_drop=float,
    device_json=str,
):
    """Fine-tunes a LoRA adapter and saves it as the ``adapter`` Model.

    Without model_dir, base_model and data it is the demo run: a small GPT-2 built from the
    shape knobs, trained on learnable synthetic data. With them it fine-tunes a Hugging Face
    model, from a directory on the volume (model_dir) or a Model artifact (base_model:
    imported from object storage or an OCI model image, or another pipeline's output), never
    both, on data from the volume. Checkpoints go to the volume under the run id, so a
    retried or preempted task resumes from the last one instead of starting over.

    Returns:
        peak_mem_gib: Peak memory the training held.
        slice_total_mem_gib: Memory of the slice it ran in (or the emulated cap).
        loss_drop: Fraction by which the training loss fell.
        device_json: The device facts as JSON, for the report.
    """
    inputs = dict(locals())  # first: every input by name, the knobs among them
    import json
    import os
    from collections import namedtuple

    from draslice.errors import InvalidParameter
    from draslice.trainer import libraries

    libraries.settle()  # before the trainer imports peft: library lines no one can act on
    from draslice.trainer.config import SFTConfig
    from draslice.trainer.sft import train

    if base_model is not None and model_dir:
        raise InvalidParameter(
            "model_dir", model_dir, "give the base model once: a directory on the volume "
            "(model_dir) or a Model artifact (base_model), not both")

    def under_mount(path: str) -> str:
        return path if not path or os.path.isabs(path) else os.path.join(mount_path, path)

    knobs = {k: v for k, v in inputs.items()
             if k not in ("adapter", "train_log", "metrics", "base_model", "mount_path",
                          "run_id")}
    knobs.update(
        model_dir=base_model.path if base_model is not None else under_mount(model_dir),
        data=under_mount(data),
        checkpoint_dir=(os.path.join(under_mount(checkpoint_dir), run_id) if checkpoint_dir
                        else ""),
    )
    cfg = SFTConfig.from_params(knobs)
    os.makedirs(adapter.path, exist_ok=True)
    result = train(cfg, output_dir=adapter.path, metrics_path=train_log.path)
    adapter.metadata.update({
        "framework": "peft", "lora_r": cfg.lora_r, "lora_targets": result.lora_targets,
        "base_model": base_model.uri if base_model is not None else cfg.model_dir or "demo",
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


finetune = dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)(
    with_input_docs(finetune, NOT_KNOBS))
