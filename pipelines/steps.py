"""The steps every draslice pipeline shares: preflight, the smoke matmul, how a fine-tune task
claims its slice, and the verdict (validate, then the gate).

Only the smoke and fine-tune tasks claim the slice: preflight must answer without one, and
validate/gate work on files. The claim template and claim mode are fixed when compiling (pod
labels and platform specs are static in KFP), so each pipeline module's ``build`` returns a
pipeline for one template and mode.
"""

from __future__ import annotations

from kfp import kubernetes
from kfp.dsl import PipelineTask

from draslice.components.gate import gate
from draslice.components.preflight import preflight
from draslice.components.smoke import smoke
from draslice.components.validate import validate
from draslice.pipelines.claim import ClaimMode, bind_claim

DEFAULT_TEMPLATE = "mig-1g-6gb"
DEFAULT_PVC = "draslice-data"
DEFAULT_MOUNT = "/data"
READY = "ready"


def pipeline_name(kind: str, template: str, mode: ClaimMode) -> str:
    suffix = "" if mode is ClaimMode.POLICY else f"-{mode.value}"
    return f"draslice-{kind}-{template}{suffix}"


def checks(claim_template: str, on_missing_dra: str, source: str) -> PipelineTask:
    """Preflight: its ``decision`` output is ``ready`` when the GPU steps may run."""
    pre = preflight(claim_template=claim_template, on_missing_dra=on_missing_dra, source=source)
    pre.set_caching_options(False)  # it reports on the cluster as it is now
    pre.set_display_name("preflight")
    return pre


def smoke_test(template: str, mode: ClaimMode, device: str, slice_memory_gib: float,
               kueue_queue: str | None) -> PipelineTask:
    task = smoke(device=device, slice_memory_gib=slice_memory_gib)
    task.set_caching_options(False)  # a cached smoke proves nothing about today's slice
    task.set_display_name("smoke matmul")
    return bind_claim(task, template, mode, kueue_queue=kueue_queue)


def on_the_slice(train: PipelineTask, name: str, template: str, mode: ClaimMode,
                 kueue_queue: str | None, pvc_name: str | None = None,
                 mount_path: str = DEFAULT_MOUNT) -> PipelineTask:
    """A fine-tune task's settings: its name, the volume (data on a PVC can change under one
    name, so no caching then), and last the claim (see ``bind_claim``)."""
    train.set_display_name(name)
    if pvc_name is not None:
        train.set_caching_options(False)
        kubernetes.mount_pvc(train, pvc_name=pvc_name, mount_path=mount_path)
    return bind_claim(train, template, mode, kueue_queue=kueue_queue)


def validate_step(train: PipelineTask, template: str, mode: ClaimMode, *, base_model=None,
                  smoke: PipelineTask | None = None, **verdict_knobs) -> PipelineTask:
    """validate on the fine-tune ``train``'s outputs, with validate's own knobs
    (``memory_headroom``, ``min_loss_drop``); ``smoke``'s TFLOP/s go into the report."""
    return validate(
        adapter=train.outputs["adapter"],
        train_log=train.outputs["train_log"],
        slice_total_mem_gib=train.outputs["slice_total_mem_gib"],
        peak_mem_gib=train.outputs["peak_mem_gib"],
        device_json=train.outputs["device_json"],
        claim_template=template,
        claim_mode=mode.value,
        **verdict_knobs,
        **({"base_model": base_model} if base_model is not None else {}),
        **({"smoke_tflops": smoke.outputs["tflops"]} if smoke is not None else {}),
    )


def verdict(train: PipelineTask, template: str, mode: ClaimMode, memory_headroom: float,
            min_loss_drop: float, base_model=None, pvc_name: str | None = None,
            mount_path: str = DEFAULT_MOUNT, smoke: PipelineTask | None = None) -> PipelineTask:
    """validate the fine-tune's outputs, then the gate that fails the run on a FAIL. With
    ``pvc_name`` validate mounts the volume too: it reloads the base from there."""
    check = validate_step(train, template, mode, base_model=base_model, smoke=smoke,
                          memory_headroom=memory_headroom, min_loss_drop=min_loss_drop)
    if pvc_name is not None:
        kubernetes.mount_pvc(check, pvc_name=pvc_name, mount_path=mount_path)
    return gate(verdict=check.outputs["verdict"], passed=check.outputs["passed"])
