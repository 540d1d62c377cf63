"""How long a fine-tune's steps take on a slice, scaled from the steps ``advise`` measured.

A MIG slice has its own share of the GPU's streaming multiprocessors (SMs). A step that keeps
every SM busy, as LoRA training at long sequences does (52% MFU at Qwen2.5-1.5B, sequence
2,048, on an H200, docs/benchmarks.md), takes about the measured time divided by the slice's
share of the SMs measured on.
The share comes, best first, from:

- the SMs the cluster publishes for the slice (the NVIDIA DRA driver's ``multiprocessors``
  capacity, 14 on an A100 ``1g.10gb``) over the SMs of the device measured on;
- the ratio of compute slices, when the measurement ran on a MIG slice of the same GPU model
  (on an A100 every compute slice has 14 SMs);
- the profile's compute slices over the GPU's (NVIDIA's MIG guide, "Fraction of SMs": 1/7,
  1/4 on an A30), when it ran on a whole GPU of the same model. That fraction is of the SMs
  MIG mode uses, not of the whole GPU's: an A100's ``1g`` has 14 SMs where 1/7 of its 108 is
  15.4, so on an A100 this share is about 10% high and the time as much too short.

What the scaling leaves out, and ``advise`` says so: memory bandwidth and L2 shrink with the
slice's memory slices (1/8 each), which slows a memory-bound step more; a step that leaves
SMs idle on the whole GPU (a small model or batch) loses less than its share. The first
step's extra time (set-up, compilation, graph capture) is host work and is not scaled. No
prediction has been checked against a real slice: on the H200 measured, a process's SMs could
not be capped (CUDA green contexts fail there, docs/benchmarks.md). A time-sliced or
MPS-shared GPU gets no prediction: its speed depends on its neighbours.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from draslice.cluster.names import mig_compute_slices
from draslice.sizing.profiles import SliceProfile, compute_slices

# Compute slices of a whole GPU in MIG mode (NVIDIA's MIG guide, "Supported MIG Profiles"):
# 4 on an A30, 7 on the A100, H100, H200 and B200.
GPU_COMPUTE_SLICES = {"A30": 4}
DEFAULT_COMPUTE_SLICES = 7

_MODEL = re.compile(r"\b(A30|A100|H100|H200|B200)\b", re.IGNORECASE)
_MEMORY = re.compile(r"(\d+)\s*GB\b", re.IGNORECASE)


def gpu_model(name: str) -> tuple[str, int | None] | None:
    """(model, memory in GB when the name has it) of a GPU name: ``NVIDIA A100-SXM4-40GB``,
    a table key ``A100-40GB`` or a published ``productName``; None when not a MIG-capable
    model this module knows."""
    name = re.split(r"\bMIG\b", name, maxsplit=1)[0]  # "... MIG 1g.18gb": the slice's memory
    model = _MODEL.search(name)
    if model is None:
        return None
    memory = _MEMORY.search(name)
    return model.group(1).upper(), int(memory.group(1)) if memory else None


def same_model(a: str, b: str) -> bool:
    """Whether two GPU names are one model (memory compared only when both give it)."""
    ma, mb = gpu_model(a), gpu_model(b)
    if ma is None or mb is None or ma[0] != mb[0]:
        return False
    return ma[1] is None or mb[1] is None or ma[1] == mb[1]


@dataclass(frozen=True)
class MeasuredStep:
    """The probe's steps on one device: the first (with its set-up) and the steady ones."""

    first_s: float
    steady_s: float  # median of the steps after the first
    tokens: int  # tokens a steady step trains
    device: str  # the name CUDA reports, e.g. "NVIDIA H200" or "... MIG 1g.10gb"
    multiprocessors: int | None
    is_mig: bool

    @classmethod
    def from_run(cls, records: list[dict], device: dict) -> MeasuredStep | None:
        """From a run's metrics lines and its ``DeviceInfo``; None with fewer than two steps
        (no steady one)."""
        if len(records) < 2:
            return None
        steady = records[1:]
        return cls(first_s=float(records[0]["step_seconds"]),
                   steady_s=statistics.median(float(r["step_seconds"]) for r in steady),
                   tokens=round(statistics.median(int(r["tokens"]) for r in steady)),
                   device=str(device.get("name", "")),
                   multiprocessors=device.get("multiprocessors"),
                   is_mig=bool(device.get("is_mig")))

    def run_seconds(self, steps: int, share: float = 1.0) -> float:
        """``steps`` steps at ``share`` of the SMs measured on: the first step's set-up (host
        work: compilation, graph capture, allocation) once and unscaled, every step scaled."""
        return max(self.first_s - self.steady_s, 0.0) + steps * self.steady_s / share

    def compute_slices(self) -> int | None:
        """The compute slices of the MIG device measured on (None on a whole GPU)."""
        return mig_compute_slices(self.device) if self.is_mig else None


@dataclass(frozen=True)
class Pace:
    """A step's predicted time on one slice, and what the prediction rests on."""

    share: float  # the slice's SMs over the SMs measured on
    step_s: float
    tokens_per_s: float
    run_s: float  # the run's steps, the first step's set-up included
    basis: str

    def to_dict(self) -> dict:
        return {"share": round(self.share, 4), "step_s": round(self.step_s, 4),
                "tokens_per_s": round(self.tokens_per_s, 1), "run_s": round(self.run_s, 1),
                "basis": self.basis}


def share(profile: SliceProfile, measured: MeasuredStep) -> tuple[float | None, str]:
    """The profile's share of the SMs ``measured`` ran on, and its basis; (None, why not)."""
    gpu = profile.gpu or profile.name
    if not same_model(measured.device, gpu):
        return None, f"measured on {measured.device}, not on a {gpu}"
    here = measured.multiprocessors
    if profile.multiprocessors and here:
        return (profile.multiprocessors / here,
                f"{profile.multiprocessors} of its {here} SMs, as the cluster publishes")
    if profile.name == "full":
        if measured.is_mig:
            return None, "measured on a MIG slice; the whole GPU's SMs are not published"
        return 1.0, "all its SMs; shared by time-slicing or MPS, slower by the neighbours' use"
    wanted = compute_slices(profile)
    if wanted is None:
        return None, f"no compute share is known for profile {profile.name!r}"
    if measured.is_mig:
        have = measured.compute_slices()
        if have is None:
            return None, f"the MIG device {measured.device!r} does not name its profile"
        return wanted / have, f"{wanted} compute slices for its {have}"
    model, _memory = gpu_model(gpu)  # a model same_model knew
    total = GPU_COMPUTE_SLICES.get(model, DEFAULT_COMPUTE_SLICES)
    return (wanted / total,
            f"{wanted}/{total} of its SMs, by NVIDIA's MIG guide; approximate")


def pace(profile: SliceProfile, measured: MeasuredStep, steps: int) -> Pace | str:
    """The step time ``profile`` would take for ``measured``'s step, or why none is given."""
    fraction, basis = share(profile, measured)
    if fraction is None:
        return basis
    step_s = measured.steady_s / fraction
    return Pace(share=fraction, step_s=step_s, tokens_per_s=measured.tokens / step_s,
                run_s=measured.run_seconds(steps, fraction), basis=basis)


def duration(seconds: float) -> str:
    """``42 s``, ``7.5 min``, ``3.2 h``: a run time at the precision an estimate has."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
