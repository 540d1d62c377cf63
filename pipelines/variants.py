"""The compiled pipelines committed under ``compiled/``: what users upload to the KFP UI.

``draslice compile`` writes exactly these; a test recompiles them and fails when a committed
file is stale.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kfp import compiler

from draslice.cluster.names import (
    validate_dns_label,
    validate_dns_subdomain,
    validate_mount_path,
    validate_template_name,
)
from draslice.components.image import TRAINER_IMAGE
from draslice.pipelines import canary, demo, finetune, finetune_artifact
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.steps import DEFAULT_MOUNT, DEFAULT_PVC
from draslice.trainer.presets import DEMO, FINETUNE, Preset

TEMPLATES = ("mig-1g-6gb", "shared-gpu-timeslice")
# Each pipeline's module (pipelines/<name>/pipeline.py) by its kind: the compiled file's stem.
PIPELINES = {m.KIND: m for m in (demo.pipeline, canary.pipeline, finetune.pipeline,
                                 finetune_artifact.pipeline)}
VOLUME_KINDS = (finetune.pipeline.KIND, finetune_artifact.pipeline.KIND)  # mount a PVC
KINDS = tuple(PIPELINES)
GPU_EXECUTORS = {
    demo.pipeline.KIND: ("exec-smoke", "exec-finetune"),
    canary.pipeline.KIND: ("exec-smoke",),
    finetune.pipeline.KIND: ("exec-smoke", "exec-finetune"),
    finetune_artifact.pipeline.KIND: ("exec-smoke", "exec-finetune"),
}
# The preset each fine-tuning pipeline's parameters come from (the canary has none).
PRESETS: dict[str, Preset] = {demo.pipeline.KIND: DEMO, finetune.pipeline.KIND: FINETUNE,
                              finetune_artifact.pipeline.KIND: FINETUNE}


def preset_of(pipeline_name: str) -> Preset | None:
    """The preset of a compiled pipeline, by its name (``draslice-<kind>-<template>``)."""
    for kind in sorted(PRESETS, key=len, reverse=True):
        if pipeline_name.startswith(f"draslice-{kind}-"):
            return PRESETS[kind]
    return None


@dataclass(frozen=True)
class Variant:
    kind: str  # one of KINDS
    template: str
    mode: ClaimMode
    pvc_name: str = DEFAULT_PVC  # VOLUME_KINDS only: the data volume, fixed at compile time
    mount_path: str = DEFAULT_MOUNT
    kueue_queue: str | None = None  # never set for the committed compiled/ files

    def __post_init__(self) -> None:
        """Refuse names Kubernetes would refuse only when the run starts, before any file."""
        validate_template_name(self.template)
        validate_dns_subdomain(self.pvc_name, "pvc")
        validate_mount_path(self.mount_path, "mount_path")
        if self.kueue_queue is not None:
            validate_dns_label(self.kueue_queue, "kueue_queue")

    @property
    def filename(self) -> str:
        return f"{self.kind}.{self.mode.value}.{self.template}.yaml"

    def build(self) -> Callable:
        module = PIPELINES[self.kind]
        if self.kind in VOLUME_KINDS:
            return module.build(self.template, self.mode, self.kueue_queue, self.pvc_name,
                                self.mount_path)
        return module.build(self.template, self.mode, self.kueue_queue)


VARIANTS = (
    *(Variant(demo.pipeline.KIND, t, m) for m in ClaimMode for t in TEMPLATES),
    *(Variant(canary.pipeline.KIND, t, ClaimMode.POLICY) for t in TEMPLATES),
    *(Variant(k, t, m) for k in VOLUME_KINDS for m in ClaimMode for t in TEMPLATES),
)


def set_image(pipeline, image: str) -> None:
    """Point every task of a freshly built ``pipeline`` that runs the trainer image at
    ``image`` instead. The components name the image when they are defined (at import,
    from components/image.py), so a compile-time choice is made on the built spec."""
    executors = pipeline.pipeline_spec.deployment_spec.fields["executors"].struct_value.fields
    for executor in executors.values():
        fields = executor.struct_value.fields
        if "container" in fields:
            container = fields["container"].struct_value.fields
            if container["image"].string_value == TRAINER_IMAGE:
                container["image"].string_value = image


def compile_variant(variant: Variant, out_dir: str | Path, image: str | None = None) -> Path:
    """Compile ``variant`` into ``out_dir`` (with ``image``: on that trainer image). The file
    is written under a temporary name and renamed, so a failed write leaves nothing behind."""
    path = Path(out_dir) / variant.filename
    path.parent.mkdir(parents=True, exist_ok=True)
    pipeline = variant.build()
    if image is not None and image != TRAINER_IMAGE:
        set_image(pipeline, image)
    tmp = path.with_name(f".tmp-{path.name}")
    try:
        compiler.Compiler().compile(pipeline, package_path=str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def compile_all(out_dir: str | Path, kueue_queue: str | None = None,
                image: str | None = None) -> list[Path]:
    """Every committed variant; with ``kueue_queue`` its GPU tasks join that Kueue queue,
    with ``image`` they run on that trainer image."""
    return [compile_variant(replace(v, kueue_queue=kueue_queue), out_dir, image)
            for v in VARIANTS]
