"""The compiled pipelines committed under ``compiled/``: what users upload to the KFP UI.

``draslice compile`` writes exactly these; a test recompiles them and fails when a committed
file is stale.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from draslice.cluster.names import (
    validate_dns_label,
    validate_dns_subdomain,
    validate_mount_path,
    validate_template_name,
)
from draslice.cluster.preflight import ON_MISSING_DRA
from draslice.components.image import TRAINER_IMAGE
from draslice.pipelines.claim import ClaimMode
from draslice.trainer.presets import DEMO, FINETUNE, Preset
from draslice.trainer.presets import PRESETS as KNOB_PRESETS


class Builders(Mapping[str, Callable[..., Callable]]):
    """kind -> the ``build`` of its pipeline module with that kind's choices, imported on first
    use: the catalogue below (and the ``--help`` of compile, upload, submit and schedule, which
    list it) needs no kfp. A module builds one kind (``KIND``) or several (``KINDS``: each
    kind's keyword choices to ``build``); a kind its module does not build fails here, on
    first use."""

    def __init__(self, folders: dict[str, str]) -> None:
        self._folders = folders

    def __getitem__(self, kind: str) -> Callable[..., Callable]:
        module = importlib.import_module(f"draslice.pipelines.{self._folders[kind]}.pipeline")
        kinds = getattr(module, "KINDS", None) or {module.KIND: {}}
        if kind not in kinds:
            raise RuntimeError(f"{module.__name__} builds {', '.join(kinds)}, not {kind!r} as "
                               "listed in draslice.pipelines.variants.PIPELINES")
        return functools.partial(module.build, **kinds[kind])

    def __iter__(self) -> Iterator[str]:
        return iter(self._folders)

    def __len__(self) -> int:
        return len(self._folders)


TEMPLATES = ("mig-1g-6gb", "shared-gpu-timeslice")
# Each pipeline's builder (pipelines/<folder>/pipeline.py) by its kind: the compiled file's stem.
# One builder makes the three finetune kinds (model from the volume or an artifact, run as a
# task or as a TrainJob).
PIPELINES = Builders({"sft": "demo", "canary": "canary", "finetune": "finetune",
                       "finetune-artifact": "finetune", "sweep": "sweep",
                       "finetune-trainjob": "finetune"})
VOLUME_KINDS = ("finetune", "finetune-artifact", "sweep", "finetune-trainjob")  # mount a PVC
# Kinds whose GPU pods are a TrainJob's (claims from its runtime): no claim mode in the name.
TRAINJOB_KINDS = ("finetune-trainjob",)
TRAINJOB_TEMPLATES = ("mig-1g-6gb", "gpus-2")
KINDS = tuple(PIPELINES)
GPU_EXECUTORS = {
    "sft": ("exec-smoke", "exec-finetune"),
    "canary": ("exec-smoke",),
    "finetune": ("exec-smoke", "exec-finetune"),
    "finetune-artifact": ("exec-smoke", "exec-finetune"),
    "sweep": ("exec-smoke", "exec-finetune"),  # in every iteration
    "finetune-trainjob": (),  # the TrainJob's pods claim, not the KFP step
}
# The preset each fine-tuning pipeline's parameters come from (the canary has none).
PRESETS: dict[str, Preset] = {"sft": DEMO, "finetune": FINETUNE, "finetune-artifact": FINETUNE}
# The pipelines' own parameters that take one of a few words (the knobs' choices are declared
# with the knobs, trainer/config.py): submit and schedule refuse any other value before sending.
PARAMETER_CHOICES: dict[str, tuple[str, ...]] = {"on_missing_dra": ON_MISSING_DRA,
                                                 "preset": tuple(KNOB_PRESETS)}


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
    # VOLUME_KINDS only: the data volume, fixed at compile time (None: the pipeline's default)
    pvc_name: str | None = None
    mount_path: str | None = None
    kueue_queue: str | None = None  # never set for the committed compiled/ files

    def __post_init__(self) -> None:
        """Refuse names Kubernetes would refuse only when the run starts, before any file."""
        validate_template_name(self.template)
        if self.pvc_name is not None:
            validate_dns_subdomain(self.pvc_name, "pvc")
        if self.mount_path is not None:
            validate_mount_path(self.mount_path, "mount_path")
        if self.kueue_queue is not None:
            validate_dns_label(self.kueue_queue, "kueue_queue")

    @property
    def filename(self) -> str:
        if self.kind in TRAINJOB_KINDS:
            return f"{self.kind}.{self.template}.yaml"
        return f"{self.kind}.{self.mode.value}.{self.template}.yaml"

    def build(self) -> Callable:
        build = PIPELINES[self.kind]
        if self.kind in VOLUME_KINDS:
            volume = {k: v for k, v in (("pvc_name", self.pvc_name),
                                        ("mount_path", self.mount_path)) if v is not None}
            return build(self.template, self.mode, self.kueue_queue, **volume)
        return build(self.template, self.mode, self.kueue_queue)


VARIANTS = (
    *(Variant("sft", t, m) for m in ClaimMode for t in TEMPLATES),
    *(Variant("canary", t, ClaimMode.POLICY) for t in TEMPLATES),
    *(Variant(k, t, m) for k in VOLUME_KINDS if k not in TRAINJOB_KINDS for m in ClaimMode
      for t in TEMPLATES),
    *(Variant(k, t, ClaimMode.POLICY) for k in TRAINJOB_KINDS for t in TRAINJOB_TEMPLATES),
)


def select(kind: str | None = None, mode: ClaimMode | None = None) -> tuple[Variant, ...]:
    """The committed variants of ``kind`` and claim ``mode`` (None: any). A TrainJob kind has
    no claim mode, so naming a mode leaves it out."""
    return tuple(v for v in VARIANTS if (kind is None or v.kind == kind)
                 and (mode is None or (v.kind not in TRAINJOB_KINDS and v.mode == mode)))


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
    from kfp import compiler

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
