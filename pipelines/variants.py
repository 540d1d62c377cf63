"""The compiled pipelines committed under ``compiled/``: what users upload to the KFP UI.

``draslice compile`` writes exactly these; a test recompiles them and fails when a committed
file is stale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kfp import compiler

from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.slice_sft import (
    DEFAULT_MOUNT,
    DEFAULT_PVC,
    build_canary_pipeline,
    build_finetune_pipeline,
    build_sft_pipeline,
)

TEMPLATES = ("mig-1g-6gb", "shared-gpu-timeslice")
GPU_EXECUTORS = {
    "sft": ("exec-smoke", "exec-sft"),
    "canary": ("exec-smoke",),
    "finetune": ("exec-smoke", "exec-finetune"),
}
BUILDERS = {
    "sft": build_sft_pipeline,
    "canary": build_canary_pipeline,
    "finetune": build_finetune_pipeline,
}


@dataclass(frozen=True)
class Variant:
    kind: str  # "sft", "canary" or "finetune"
    template: str
    mode: ClaimMode
    pvc_name: str = DEFAULT_PVC  # finetune only: the model/data volume, fixed at compile time
    mount_path: str = DEFAULT_MOUNT

    @property
    def filename(self) -> str:
        return f"{self.kind}.{self.mode.value}.{self.template}.yaml"

    def build(self) -> Callable:
        if self.kind == "finetune":
            return build_finetune_pipeline(self.template, self.mode, self.pvc_name,
                                           self.mount_path)
        return BUILDERS[self.kind](self.template, self.mode)


VARIANTS = (
    *(Variant("sft", t, m) for m in ClaimMode for t in TEMPLATES),
    *(Variant("canary", t, ClaimMode.POLICY) for t in TEMPLATES),
    *(Variant("finetune", t, m) for m in ClaimMode for t in TEMPLATES),
)


def compile_variant(variant: Variant, out_dir: str | Path) -> Path:
    path = Path(out_dir) / variant.filename
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(variant.build(), package_path=str(path))
    return path


def compile_all(out_dir: str | Path) -> list[Path]:
    return [compile_variant(v, out_dir) for v in VARIANTS]
