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
from draslice.pipelines.slice_sft import build_canary_pipeline, build_sft_pipeline

TEMPLATES = ("mig-1g-6gb", "shared-gpu-timeslice")
GPU_EXECUTORS = {"sft": ("exec-smoke", "exec-sft"), "canary": ("exec-smoke",)}


@dataclass(frozen=True)
class Variant:
    kind: str  # "sft" or "canary"
    template: str
    mode: ClaimMode
    kueue_queue: str | None = None  # never set for the committed compiled/ files

    @property
    def filename(self) -> str:
        return f"{self.kind}.{self.mode.value}.{self.template}.yaml"

    def build(self) -> Callable:
        builder = build_sft_pipeline if self.kind == "sft" else build_canary_pipeline
        return builder(self.template, self.mode, self.kueue_queue)


VARIANTS = (
    *(Variant("sft", t, m) for m in ClaimMode for t in TEMPLATES),
    *(Variant("canary", t, ClaimMode.POLICY) for t in TEMPLATES),
)


def compile_variant(variant: Variant, out_dir: str | Path) -> Path:
    path = Path(out_dir) / variant.filename
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(variant.build(), package_path=str(path))
    return path


def compile_all(out_dir: str | Path, kueue_queue: str | None = None) -> list[Path]:
    """Every committed variant; with ``kueue_queue`` its GPU tasks join that Kueue queue."""
    return [compile_variant(replace(v, kueue_queue=kueue_queue), out_dir) for v in VARIANTS]
