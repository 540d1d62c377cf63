"""The compiled pipelines committed under ``compiled/``: what users upload to the KFP UI.

``draslice compile`` writes exactly these; a test recompiles them and fails when a committed
file is stale.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from draslice.cluster.names import validate_template_name
from draslice.pipelines.claim import ClaimMode


class _PipelineModules(Mapping[str, ModuleType]):
    """kind -> its pipeline module, imported on first use: the catalogue below (and the
    ``--help`` of compile, upload, submit and schedule, which list it) needs no kfp. A module
    whose ``KIND`` differs from its key fails here, on first use."""

    def __init__(self, folders: dict[str, str]) -> None:
        self._folders = folders

    def __getitem__(self, kind: str) -> ModuleType:
        module = importlib.import_module(f"draslice.pipelines.{self._folders[kind]}.pipeline")
        if kind != module.KIND:
            raise RuntimeError(f"{module.__name__}.KIND is {module.KIND!r}, listed as {kind!r} "
                               "in draslice.pipelines.variants.PIPELINES")
        return module

    def __iter__(self) -> Iterator[str]:
        return iter(self._folders)

    def __len__(self) -> int:
        return len(self._folders)


TEMPLATES = ("mig-1g-6gb", "shared-gpu-timeslice")
# Each pipeline's module (pipelines/<folder>/pipeline.py) by its kind: the compiled file's stem.
PIPELINES = _PipelineModules({"sft": "demo", "canary": "canary", "finetune": "finetune",
                              "finetune-artifact": "finetune_artifact"})
VOLUME_KINDS = ("finetune", "finetune-artifact")  # mount a PVC
KINDS = tuple(PIPELINES)
GPU_EXECUTORS = {
    "sft": ("exec-smoke", "exec-finetune"),
    "canary": ("exec-smoke",),
    "finetune": ("exec-smoke", "exec-finetune"),
    "finetune-artifact": ("exec-smoke", "exec-finetune"),
}


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
        validate_template_name(self.template)  # at once, before kfp loads to build it

    @property
    def filename(self) -> str:
        return f"{self.kind}.{self.mode.value}.{self.template}.yaml"

    def build(self) -> Callable:
        module = PIPELINES[self.kind]
        if self.kind in VOLUME_KINDS:
            volume = {k: v for k, v in (("pvc_name", self.pvc_name),
                                        ("mount_path", self.mount_path)) if v is not None}
            return module.build(self.template, self.mode, self.kueue_queue, **volume)
        return module.build(self.template, self.mode, self.kueue_queue)


VARIANTS = (
    *(Variant("sft", t, m) for m in ClaimMode for t in TEMPLATES),
    *(Variant("canary", t, ClaimMode.POLICY) for t in TEMPLATES),
    *(Variant(k, t, m) for k in VOLUME_KINDS for m in ClaimMode for t in TEMPLATES),
)


def compile_variant(variant: Variant, out_dir: str | Path) -> Path:
    from kfp import compiler

    path = Path(out_dir) / variant.filename
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(variant.build(), package_path=str(path))
    return path


def compile_all(out_dir: str | Path, kueue_queue: str | None = None) -> list[Path]:
    """Every committed variant; with ``kueue_queue`` its GPU tasks join that Kueue queue."""
    return [compile_variant(replace(v, kueue_queue=kueue_queue), out_dir) for v in VARIANTS]
