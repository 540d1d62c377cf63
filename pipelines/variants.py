"""The compiled pipelines committed under ``compiled/``: what users upload to the KFP UI.

``draslice compile`` writes exactly these; a test recompiles them and fails when a committed
file is stale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kfp import compiler

from draslice.pipelines import canary, demo, finetune, finetune_artifact, finetune_trainjob
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.steps import DEFAULT_MOUNT, DEFAULT_PVC

TEMPLATES = ("mig-1g-6gb", "shared-gpu-timeslice")
# Each pipeline's module (pipelines/<name>/pipeline.py) by its kind: the compiled file's stem.
PIPELINES = {m.KIND: m for m in (demo.pipeline, canary.pipeline, finetune.pipeline,
                                 finetune_artifact.pipeline, finetune_trainjob.pipeline)}
VOLUME_KINDS = (finetune.pipeline.KIND, finetune_artifact.pipeline.KIND,
                finetune_trainjob.pipeline.KIND)  # mount a PVC
# Kinds whose GPU pods are a TrainJob's (claims from its runtime): no claim mode in the name.
TRAINJOB_KINDS = (finetune_trainjob.pipeline.KIND,)
TRAINJOB_TEMPLATES = ("mig-1g-6gb", "gpus-2")
KINDS = tuple(PIPELINES)
GPU_EXECUTORS = {
    demo.pipeline.KIND: ("exec-smoke", "exec-finetune"),
    canary.pipeline.KIND: ("exec-smoke",),
    finetune.pipeline.KIND: ("exec-smoke", "exec-finetune"),
    finetune_artifact.pipeline.KIND: ("exec-smoke", "exec-finetune"),
    finetune_trainjob.pipeline.KIND: (),  # the TrainJob's pods claim, not the KFP step
}


@dataclass(frozen=True)
class Variant:
    kind: str  # one of KINDS
    template: str
    mode: ClaimMode
    pvc_name: str = DEFAULT_PVC  # VOLUME_KINDS only: the data volume, fixed at compile time
    mount_path: str = DEFAULT_MOUNT
    kueue_queue: str | None = None  # never set for the committed compiled/ files

    @property
    def filename(self) -> str:
        if self.kind in TRAINJOB_KINDS:
            return f"{self.kind}.{self.template}.yaml"
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
    *(Variant(k, t, m) for k in VOLUME_KINDS if k not in TRAINJOB_KINDS for m in ClaimMode
      for t in TEMPLATES),
    *(Variant(k, t, ClaimMode.POLICY) for k in TRAINJOB_KINDS for t in TRAINJOB_TEMPLATES),
)


def compile_variant(variant: Variant, out_dir: str | Path) -> Path:
    path = Path(out_dir) / variant.filename
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(variant.build(), package_path=str(path))
    return path


def compile_all(out_dir: str | Path, kueue_queue: str | None = None) -> list[Path]:
    """Every committed variant; with ``kueue_queue`` its GPU tasks join that Kueue queue."""
    return [compile_variant(replace(v, kueue_queue=kueue_queue), out_dir) for v in VARIANTS]
