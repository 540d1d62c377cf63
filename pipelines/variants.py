"""The compiled pipelines committed under ``compiled/``: what users upload to the KFP UI.

``draslice compile`` writes exactly these; a test recompiles them and fails when a committed
file is stale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kfp import compiler

from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.slice_sft import (
    DEFAULT_MOUNT,
    DEFAULT_PVC,
    MODEL_SOURCES,
    build_canary_pipeline,
    build_finetune_pipeline,
    build_sft_pipeline,
)

TEMPLATES = ("mig-1g-6gb", "shared-gpu-timeslice")
GPU_EXECUTORS = {
    "sft": ("exec-smoke", "exec-sft"),
    "canary": ("exec-smoke",),
    "finetune": ("exec-smoke", "exec-finetune"),
    "finetune-artifact": ("exec-smoke", "exec-finetune"),
}
BUILDERS = {
    "sft": build_sft_pipeline,
    "canary": build_canary_pipeline,
}
# The finetune kinds and where each takes its base model from (build_finetune_pipeline).
FINETUNE_KINDS = {kind: source for source, kind in MODEL_SOURCES.items()}
KINDS = (*BUILDERS, *FINETUNE_KINDS)


@dataclass(frozen=True)
class Variant:
    kind: str  # one of KINDS
    template: str
    mode: ClaimMode
    pvc_name: str = DEFAULT_PVC  # finetune kinds only: the data volume, fixed at compile time
    mount_path: str = DEFAULT_MOUNT
    kueue_queue: str | None = None  # never set for the committed compiled/ files

    @property
    def filename(self) -> str:
        return f"{self.kind}.{self.mode.value}.{self.template}.yaml"

    def build(self) -> Callable:
        if self.kind in FINETUNE_KINDS:
            return build_finetune_pipeline(self.template, self.mode, self.pvc_name,
                                           self.mount_path, self.kueue_queue,
                                           model_source=FINETUNE_KINDS[self.kind])
        return BUILDERS[self.kind](self.template, self.mode, self.kueue_queue)


VARIANTS = (
    *(Variant("sft", t, m) for m in ClaimMode for t in TEMPLATES),
    *(Variant("canary", t, ClaimMode.POLICY) for t in TEMPLATES),
    *(Variant(k, t, m) for k in FINETUNE_KINDS for m in ClaimMode for t in TEMPLATES),
)


def compile_variant(variant: Variant, out_dir: str | Path) -> Path:
    path = Path(out_dir) / variant.filename
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(variant.build(), package_path=str(path))
    return path


def compile_all(out_dir: str | Path, kueue_queue: str | None = None) -> list[Path]:
    """Every committed variant; with ``kueue_queue`` its GPU tasks join that Kueue queue."""
    return [compile_variant(replace(v, kueue_queue=kueue_queue), out_dir) for v in VARIANTS]
