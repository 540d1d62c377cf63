"""The facts a benchmark figure is meaningless without: GPU, driver, library versions.

    python benchmarks/envfacts.py [--json-out FILE]

Versions come from installed package metadata (nothing is imported to find them, so a broken
optional library cannot crash this); the GPU facts from torch and ``nvidia-smi``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

PACKAGES = (
    "torch", "transformers", "peft", "accelerate", "trl", "datasets", "bitsandbytes",
    "tokenizers", "safetensors", "huggingface-hub", "numpy", "pyarrow", "pandas", "kfp",
    "liger-kernel", "unsloth", "unsloth-zoo",
    "draslice",
)


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def nvidia_smi_query() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, "--query-gpu=name,driver_version,memory.total,mig.mode.current",
             "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"nvidia-smi failed: {err}"
    return (done.stdout or done.stderr).strip()


def gpu_facts() -> dict:
    import torch

    facts: dict = {
        "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda,
        "nvidia_smi": nvidia_smi_query(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            device_count=torch.cuda.device_count(),
            name=props.name,
            total_mem_gib=round(props.total_memory / 1024**3, 2),
            capability=f"{props.major}.{props.minor}",
            bf16=torch.cuda.is_bf16_supported(),
        )
    return facts


def collect() -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "packages": package_versions(),
        "gpu": gpu_facts(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out", help="also write the facts to this JSON file")
    args = parser.parse_args()
    facts = collect()
    for name, version in facts["packages"].items():
        print(f"{name}: {version or 'not installed'}")
    for key, value in facts["gpu"].items():
        print(f"gpu.{key}: {value}")
    if args.json_out:
        from draslice.benchmarks.childproc import write_json

        write_json(args.json_out, facts)


if __name__ == "__main__":
    main()
