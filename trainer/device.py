"""What the pod sees: the device, its memory, whether it is a MIG slice, and the slice cap.

Inside a DRA-allocated pod the claim decides what CUDA shows: a MIG slice appears as one
device whose total memory is the slice's own (``1g.6gb`` reports ~5.75 GiB); a time-sliced or
MPS-shared GPU appears whole. On a big local GPU, :func:`apply_slice_cap` emulates a slice by
capping this process's CUDA allocator, so the same budget checks run before any cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from draslice.errors import InvalidParameter, SliceOutOfMemory
from draslice.trainer import budget
from draslice.trainer.config import DEVICE_CHOICES, PRECISIONS
from draslice.trainer.loglines import GIB, gib


@dataclass(frozen=True)
class DeviceInfo:
    """Facts about the device one task runs on; serialisable for reports and metrics."""

    cuda_available: bool
    device: str
    name: str
    total_mem_gib: float
    """Memory this process may use: the slice cap if one is set, else the device's total."""
    physical_mem_gib: float
    is_mig: bool
    slice_cap_gib: float | None
    nvidia_smi: str | None
    multiprocessors: int | None = None
    """Streaming multiprocessors the process can use (a MIG device has its share), so
    ``draslice advise`` can scale a measured step to a slice with fewer."""

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_device(spec: str) -> torch.device:
    """Turn ``auto``/``cpu``/``cuda``/``cuda:N`` into a device that exists, or fail clearly."""
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise InvalidParameter(
                "device", spec, "no CUDA device is visible here; use 'cpu' or 'auto'"
            )
        index = 0
        if spec != "cuda":
            try:
                index = int(spec.split(":", 1)[1])
            except ValueError as err:
                raise InvalidParameter("device", spec, f"must be {DEVICE_CHOICES}") from err
        count = torch.cuda.device_count()
        if not 0 <= index < count:
            raise InvalidParameter("device", spec, f"CUDA device index must be 0..{count - 1}")
        return torch.device(f"cuda:{index}")
    raise InvalidParameter("device", spec, f"must be {DEVICE_CHOICES}")


def matmul_dtype(device_type: str, default: torch.dtype) -> torch.dtype:
    """The dtype a matmul runs in on ``device_type``: autocast's where it is on, else
    ``default`` (the operands' own). For code that leaves autocast to cast once itself."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return default


def resolve_precision(spec: str, device: torch.device) -> str:
    """``auto`` is bf16 on a CUDA device that supports it and fp32 everywhere else."""
    spec = (spec or "auto").strip().lower()
    if spec not in PRECISIONS:
        raise InvalidParameter("precision", spec, f"must be one of {', '.join(PRECISIONS)}")
    if spec == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return "bf16"
        return "fp32"
    if spec == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise InvalidParameter("precision", spec, "this CUDA device has no bf16; use fp32 or auto")
    return spec


def nvidia_smi_list() -> str | None:
    """``nvidia-smi -L`` output, or None where the binary is absent (CPU nodes, CI)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"nvidia-smi -L failed: {err}"
    return (done.stdout or done.stderr).strip()


def _looks_like_mig(name: str, smi: str | None) -> bool:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") + os.environ.get(
        "NVIDIA_VISIBLE_DEVICES", ""
    )
    return " MIG " in f" {name} " or "MIG-" in visible or bool(smi and "MIG " in smi)


def apply_slice_cap(device: torch.device, slice_memory_gib: float) -> float | None:
    """Cap this process's CUDA memory to ``slice_memory_gib`` GiB (0 = no cap).

    Uses ``torch.cuda.set_per_process_memory_fraction``: the caching allocator then raises
    out-of-memory at the cap, as a MIG slice of that size would. The fraction is a setting of
    the whole process, so it is always set: a run without a cap that follows a capped one in
    the same process (``advise``'s trials, a notebook, a test session) gets the whole device
    back instead of the last run's slice. Cached blocks are released first: memory the
    allocator already holds is not checked against a new cap, so a run could otherwise
    train inside a smaller "slice" on an earlier run's cache.
    """
    capped = check_slice_cap(device, slice_memory_gib)
    if device.type != "cuda":
        return None
    if device.index is None:  # the fraction is per device: "cuda" means the current one
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = slice_memory_gib * GIB / total if capped else 1.0
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return float(slice_memory_gib) if capped else None


def check_slice_cap(device: torch.device, slice_memory_gib: float) -> bool:
    """Whether a cap is asked for; raise if it cannot be applied on ``device``."""
    if not slice_memory_gib:
        return False
    if slice_memory_gib < 0:
        raise InvalidParameter("slice_memory_gib", slice_memory_gib, "must be > 0, or 0 for no cap")
    if device.type != "cuda":
        raise InvalidParameter(
            "slice_memory_gib",
            slice_memory_gib,
            "emulating a slice caps CUDA memory and needs a CUDA device; this run is on the CPU",
        )
    total = torch.cuda.get_device_properties(device).total_memory
    if slice_memory_gib * GIB > total:
        raise InvalidParameter(
            "slice_memory_gib",
            slice_memory_gib,
            f"must be at most the device's memory, {gib(total)} GiB",
        )
    return True


# Where a container's memory limit is read: cgroup v2, then v1 (a huge number or "max" when
# there is none).
CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def host_memory_bytes() -> int:
    """The host memory this process may use: the machine's, or the container's limit where
    that is lower (a pod's memory limit, past which it is OOM-killed)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_MEMORY_LIMITS:
        try:
            with open(path) as handle:
                limit = handle.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            return min(physical, int(limit))
    return physical


def describe(device: torch.device, slice_cap_gib: float | None = None) -> DeviceInfo:
    """Describe ``device`` truthfully; on the CPU it says there is no CUDA device."""
    smi = nvidia_smi_list()
    if device.type != "cuda":
        host = gib(host_memory_bytes())
        return DeviceInfo(
            cuda_available=torch.cuda.is_available(),
            device="cpu",
            name="cpu (no CUDA device)" if not torch.cuda.is_available() else "cpu",
            total_mem_gib=host,
            physical_mem_gib=host,
            is_mig=False,
            slice_cap_gib=None,
            nvidia_smi=smi,
        )
    props = torch.cuda.get_device_properties(device)
    physical = gib(props.total_memory)
    return DeviceInfo(
        cuda_available=True,
        device=str(device),
        name=props.name,
        total_mem_gib=slice_cap_gib if slice_cap_gib else physical,
        physical_mem_gib=physical,
        is_mig=_looks_like_mig(props.name, smi),
        slice_cap_gib=slice_cap_gib,
        nvidia_smi=smi,
        multiprocessors=props.multi_processor_count,
    )


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory this process held on ``device``.

    CUDA: the caching allocator's peak *reserved* bytes, which is what counts against a slice
    (and what the emulated cap limits). CPU: the process's peak resident set size.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device)
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@contextmanager
def out_of_memory_explained(device: torch.device, slice_mem_gib: float,
                            knobs: list[budget.Lever]) -> Iterator[None]:
    """Turn an allocation that failed inside the slice into :class:`SliceOutOfMemory`: how
    much the slice has, how far the job got, which levers are not in use yet."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        reached = gib(peak_memory_bytes(device))
        raise SliceOutOfMemory(budget.oom_advice(slice_mem_gib, reached, knobs)) from err


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
