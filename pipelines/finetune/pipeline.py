"""The finetune pipeline: a user's model and data from the PVC ``pvc_name``, fine-tuned in a
slice of ``template``: preflight, smoke matmul, fine-tune, validate.

The PVC (model, data, checkpoints) is mounted at ``mount_path`` on the fine-tune task and on
validate, which reloads the base to check the adapter. Checkpoints live on the PVC under the
run id, so a retried task resumes. Its parameters are the finetune preset's knobs
(``trainer/presets.py``) with the preset's values; a test checks them against the config and
the fine-tune component's inputs.

No ``from __future__ import annotations``: kfp reads the pipeline signature's types.
"""

from collections.abc import Callable

from kfp import dsl

from draslice.cluster.names import validate_template_name
from draslice.components.finetune import finetune
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.steps import (
    DEFAULT_MOUNT,
    DEFAULT_PVC,
    DEFAULT_TEMPLATE,
    READY,
    checks,
    on_the_slice,
    pipeline_name,
    smoke_test,
    verdict,
)

KIND = "finetune"


def build(template: str = DEFAULT_TEMPLATE, mode: str | ClaimMode = ClaimMode.POLICY,
          kueue_queue: str | None = None, pvc_name: str = DEFAULT_PVC,
          mount_path: str = DEFAULT_MOUNT) -> Callable:
    validate_template_name(template)
    mode = ClaimMode.parse(mode)

    @dsl.pipeline(
        name=pipeline_name(KIND, template, mode),
        description=(
            f"LoRA/QLoRA fine-tune of a model on PVC {pvc_name} (mounted at {mount_path}) on a "
            f"DRA GPU slice (claim template {template}, claim mode {mode.value}): preflight, "
            "smoke matmul, fine-tune, validate, gate."
        ),
    )
    def finetune_pvc(
        model_dir: str = "models/base",
        data: str = "data/train.jsonl",
        data_format: str = "auto",
        max_length: int = 512,
        pack: bool = False,
        eval_fraction: float = 0.05,
        gradient_checkpointing: bool = False,
        offload_activations: bool = False,
        tile_mlp: bool = False,
        bf16_weights: bool = True,
        load_in_4bit: bool = False,
        lora_r: int = 16,
        lora_alpha: int = 32,
        lora_targets: str = "auto",
        batch_size: int = 8,
        steps: int = 200,
        learning_rate: float = 2e-4,
        lr_schedule: str = "cosine",
        warmup_steps: int = 10,
        checkpoint_every: int = 50,
        checkpoint_dir: str = "checkpoints",
        merge: bool = False,
        seed: int = 0,
        on_missing_dra: str = "skip",
        preflight_source: str = "auto",
        device: str = "auto",
        precision: str = "auto",
        slice_memory_gib: float = 0.0,
        memory_headroom: float = 0.1,
        min_loss_drop: float = 0.05,
        compile: str = "auto",
    ):
        pre = checks(template, on_missing_dra, preflight_source)
        with dsl.If(pre.outputs["decision"] == READY, name="slice-available"):
            smoke_task = smoke_test(template, mode, device, slice_memory_gib, kueue_queue)
            train = finetune(
                model_dir=model_dir,
                mount_path=mount_path,
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                data=data,
                data_format=data_format,
                max_length=max_length,
                pack=pack,
                eval_fraction=eval_fraction,
                gradient_checkpointing=gradient_checkpointing,
                offload_activations=offload_activations,
                tile_mlp=tile_mlp,
                bf16_weights=bf16_weights,
                load_in_4bit=load_in_4bit,
                lora_r=lora_r,
                lora_alpha=lora_alpha,
                lora_targets=lora_targets,
                batch_size=batch_size,
                steps=steps,
                learning_rate=learning_rate,
                lr_schedule=lr_schedule,
                warmup_steps=warmup_steps,
                checkpoint_every=checkpoint_every,
                checkpoint_dir=checkpoint_dir,
                merge=merge,
                seed=seed,
                device=device,
                precision=precision,
                slice_memory_gib=slice_memory_gib,
                compile=compile,
            ).after(smoke_task)
            on_the_slice(train, "fine-tune", template, mode, kueue_queue, pvc_name, mount_path)
            verdict(train, template, mode, memory_headroom, min_loss_drop,
                    pvc_name=pvc_name, mount_path=mount_path, smoke=smoke_task)

    return finetune_pvc
