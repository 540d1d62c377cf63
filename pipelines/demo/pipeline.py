"""The demo pipeline (compiled as ``sft.<mode>.<template>.yaml``): preflight, smoke matmul,
the fine-tune on the built-in model and data, validate, gate. What ``draslice run`` runs locally.

Its parameters are the demo preset's knobs (``trainer/presets.py``) with the preset's values;
a test checks them against the config and the fine-tune component's inputs.

No ``from __future__ import annotations``: kfp reads the pipeline signature's types.
"""

from collections.abc import Callable

from kfp import dsl

from draslice.cluster.names import validate_template_name
from draslice.components.finetune import finetune
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.steps import (
    DEFAULT_TEMPLATE,
    READY,
    checks,
    on_the_slice,
    pipeline_name,
    smoke_test,
    verdict,
)

KIND = "sft"  # the compiled file's stem and the pipeline's name (draslice-sft-<template>)


def build(template: str = DEFAULT_TEMPLATE, mode: str | ClaimMode = ClaimMode.POLICY,
          kueue_queue: str | None = None) -> Callable:
    """The GPU-slicing guide's flow as a KFP pipeline whose GPU tasks claim ``template``.

    With ``kueue_queue`` the GPU tasks' pods join that Kueue LocalQueue.
    """
    validate_template_name(template)
    mode = ClaimMode.parse(mode)

    @dsl.pipeline(
        name=pipeline_name(KIND, template, mode),
        description=(
            f"LoRA SFT on a DRA GPU slice (claim template {template}, claim mode {mode.value}): "
            "preflight, smoke matmul, fine-tune, validate, gate."
        ),
    )
    def demo(
        on_missing_dra: str = "skip",
        preflight_source: str = "auto",
        device: str = "auto",
        precision: str = "auto",
        slice_memory_gib: float = 0.0,
        steps: int = 30,
        batch_size: int = 8,
        seq_len: int = 64,
        learning_rate: float = 3e-3,
        lora_r: int = 8,
        lora_alpha: int = 16,
        lora_targets: str = "auto",
        seed: int = 0,
        memory_headroom: float = 0.1,
        min_loss_drop: float = 0.3,
    ):
        pre = checks(template, on_missing_dra, preflight_source)
        with dsl.If(pre.outputs["decision"] == READY, name="slice-available"):
            smoke_task = smoke_test(template, mode, device, slice_memory_gib, kueue_queue)
            train = finetune(
                device=device,
                precision=precision,
                slice_memory_gib=slice_memory_gib,
                steps=steps,
                batch_size=batch_size,
                seq_len=seq_len,
                learning_rate=learning_rate,
                lora_r=lora_r,
                lora_alpha=lora_alpha,
                lora_targets=lora_targets,
                seed=seed,
            ).after(smoke_task)
            on_the_slice(train, "LoRA SFT", template, mode, kueue_queue)
            verdict(train, template, mode, memory_headroom, min_loss_drop, smoke=smoke_task)

    return demo
