"""The upstream CRDs our Kueue, Kyverno and Trainer objects are written against, taken from
each project's Go module at a pinned release through the Go module proxy (the modules carry
their CRD YAML), so the real API server validates our objects with the projects' own schemas.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

# module, version, CRD files in the module (the newest release each proxy served on 2026-12-04)
CRD_SOURCES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("sigs.k8s.io/kueue", "v0.17.0", (
        "config/components/crd/bases/kueue.x-k8s.io_resourceflavors.yaml",
        "config/components/crd/bases/kueue.x-k8s.io_clusterqueues.yaml",
        "config/components/crd/bases/kueue.x-k8s.io_localqueues.yaml",
    )),
    ("github.com/kyverno/kyverno", "v1.19.1", (
        "config/crds/policies.kyverno.io/policies.kyverno.io_mutatingpolicies.yaml",
        "config/crds/kyverno/kyverno.io_clusterpolicies.yaml",
    )),
    ("github.com/kubeflow/trainer/v2", "v2.0.0", (
        "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml",
        "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
    )),
)


class ModuleUnavailable(RuntimeError):
    """The Go module proxy did not give the module (the message is go's own)."""


def module_dir(module: str, version: str) -> Path:
    """The module's files (downloaded into the Go module cache once per machine)."""
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"}
    out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"],
                         capture_output=True, text=True, env=env, cwd="/", timeout=300,
                         check=False)
    try:
        info = json.loads(out.stdout)
    except ValueError:
        raise ModuleUnavailable(f"{module}@{version}: {out.stderr.strip()}") from None
    if info.get("Error") or not info.get("Dir"):
        raise ModuleUnavailable(f"{module}@{version}: {info.get('Error') or out.stderr.strip()}")
    return Path(info["Dir"])


def crd_files() -> list[Path]:
    return [module_dir(module, version) / f
            for module, version, files in CRD_SOURCES for f in files]
