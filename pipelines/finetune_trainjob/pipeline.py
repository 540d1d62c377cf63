"""The finetune-trainjob pipeline: the finetune pipeline's model and data (PVC ``pvc_name``),
fine-tuned by a Kubeflow Trainer v2 TrainJob over ``num_nodes`` pods, each claiming its own
slice of ``template`` (or, with a ``gpus-K`` template, K whole GPUs), torchrun in each pod.

Preflight checks the template as for one pod (``draslice preflight --pods N`` checks N before
submitting); the fine-tune step claims nothing itself: it creates the TrainJob through the
Kubernetes API, waits for it and copies its outputs from the volume into the ``adapter``
Model (components/trainjob). The volume must be ReadWriteMany when the pods land on several
nodes. Install the template's TrainingRuntime (`draslice manifests workloads --kind trainjob
--template T`) and the step's Role (`draslice manifests rbac --trainjobs`) first.

No ``from __future__ import annotations``: kfp reads the pipeline signature's types.
"""

from collections.abc import Callable

from kfp import dsl, kubernetes

from draslice.cluster.names import validate_template_name
from draslice.components.trainjob import trainjob
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.steps import (
    DEFAULT_MOUNT,
    DEFAULT_PVC,
    DEFAULT_TEMPLATE,
    READY,
    checks,
    pipeline_name,
)

KIND = "finetune-trainjob"


def build(template: str = DEFAULT_TEMPLATE, mode: str | ClaimMode = ClaimMode.POLICY,
          kueue_queue: str | None = None, pvc_name: str = DEFAULT_PVC,
          mount_path: str = DEFAULT_MOUNT) -> Callable:
    """``mode`` is accepted for the common variant signature and changes nothing: the
    TrainJob's pods get their claims from the TrainingRuntime, not from KFP."""
    validate_template_name(template)
    ClaimMode.parse(mode)

    @dsl.pipeline(
        name=pipeline_name(KIND, template, ClaimMode.POLICY),
        description=(
            f"LoRA/QLoRA fine-tune of a model on PVC {pvc_name} (mounted at {mount_path}) as a "
            f"Kubeflow Trainer v2 TrainJob of num_nodes pods, each claiming {template}: "
            "preflight, then the TrainJob."
        ),
    )
    def finetune_trainjob(
        num_nodes: int = 2,
        num_proc_per_node: int = 0,
        timeout_minutes: int = 1440,
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
        compile: str = "auto",
    ):
        pre = checks(template, on_missing_dra, preflight_source)
        with dsl.If(pre.outputs["decision"] == READY, name="slice-available"):
            train = trainjob(
                claim_template=template,
                num_nodes=num_nodes,
                num_proc_per_node=num_proc_per_node,
                pvc_name=pvc_name,
                mount_path=mount_path,
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                kueue_queue=kueue_queue or "",
                timeout_minutes=timeout_minutes,
                model_dir=model_dir,
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
            )
            train.set_display_name("fine-tune (TrainJob)")
            train.set_caching_options(False)  # data on a PVC can change under one name
            kubernetes.mount_pvc(train, pvc_name=pvc_name, mount_path=mount_path)

    return finetune_trainjob
