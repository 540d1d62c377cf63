"""MIG slice profiles per GPU model, and the smallest one a measured job fits.

The built-in table lists, per GPU, the MIG GPU-instance profiles of NVIDIA's MIG user guide
("Supported MIG Profiles": names, memory fractions, instance counts) and the memory a CUDA
process sees in each, in GiB. Where that memory figure was read from a real capture it is
marked confirmed and the source is named; every other figure is *estimated* as the profile's
memory fraction of the GPU's usable memory, following the pattern of the confirmed H100
figures, and ``draslice advise`` says so next to it. Media-extension profiles (``+me``) have
the memory of their base profile and are left out.

:func:`recommend` takes candidates from anywhere: this table, or the profiles a cluster
publishes (``SliceProfile`` with a ``free`` count) through the preflight code.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from draslice.cluster.names import is_mig_profile, mig_compute_slices
from draslice.errors import InvalidParameter
from draslice.trainer import budget

H100_LGIP = "nvidia-smi mig -lgip on an H100 80GB (jbarrow.ai/field_notes/nvidia-mig)"
A100_SLICE = "ResourceSlice capacity memory: 9728Mi (fixtures a100-80gb-mig-1g10gb)"
SEED_RULE = "the seed guide's budgets (1g.6gb: 5.75 GiB, 2g.12gb: 11.5 GiB)"


@dataclass(frozen=True)
class SliceProfile:
    """One slice a job can get: a MIG profile (or a shared GPU) and its memory."""

    name: str
    memory_gib: float
    gpu: str = ""
    estimated: bool = False
    source: str = ""
    free: int | None = None  # devices free now, when the candidates come from a cluster
    multiprocessors: int | None = None  # SMs, when the cluster publishes them (MIG devices)

    @property
    def label(self) -> str:
        return f"{self.gpu} {self.name}".strip()

    def to_dict(self) -> dict:
        return asdict(self)


def _gpu(gpu: str, rows: list[tuple[str, float, bool, str]]) -> list[SliceProfile]:
    return [SliceProfile(name, mem, gpu, est, src) for name, mem, est, src in rows]


# (profile, GiB a process sees, estimated?, where the GiB figure comes from)
TABLE: dict[str, list[SliceProfile]] = {
    "A30-24GB": _gpu("A30-24GB", [
        ("1g.6gb", 5.75, True, SEED_RULE),
        ("2g.12gb", 11.5, True, SEED_RULE),
        ("4g.24gb", 23.5, True, "estimated: full memory of the A30"),
    ]),
    "A100-40GB": _gpu("A100-40GB", [
        ("1g.5gb", 4.75, True, "estimated: 1/8 of the memory"),
        ("1g.10gb", 9.75, True, "estimated: 2/8"),
        ("2g.10gb", 9.75, True, "estimated: 2/8"),
        ("3g.20gb", 19.62, True, "estimated: 4/8"),
        ("4g.20gb", 19.62, True, "estimated: 4/8"),
        ("7g.40gb", 39.25, True, "estimated: full"),
    ]),
    "A100-80GB": _gpu("A100-80GB", [
        ("1g.10gb", 9.5, False, A100_SLICE),
        ("1g.20gb", 19.5, True, "estimated: 2/8"),
        ("2g.20gb", 19.5, True, "estimated: 2/8"),
        ("3g.40gb", 39.25, True, "estimated: 4/8"),
        ("4g.40gb", 39.25, True, "estimated: 4/8"),
        ("7g.80gb", 78.75, True, "estimated: full"),
    ]),
    "H100-80GB": _gpu("H100-80GB", [
        ("1g.10gb", 9.75, False, H100_LGIP),
        ("1g.20gb", 19.62, False, H100_LGIP),
        ("2g.20gb", 19.62, False, H100_LGIP),
        ("3g.40gb", 39.5, False, H100_LGIP),
        ("4g.40gb", 39.5, False, H100_LGIP),
        ("7g.80gb", 79.25, False, H100_LGIP),
    ]),
    "H200-141GB": _gpu("H200-141GB", [
        ("1g.18gb", 16.75, True, "estimated: 1/8 of 140.4 GiB usable"),
        ("1g.35gb", 34.25, True, "estimated: 2/8"),
        ("2g.35gb", 34.25, True, "estimated: 2/8"),
        ("3g.71gb", 69.75, True, "estimated: 4/8"),
        ("4g.71gb", 69.75, True, "estimated: 4/8"),
        ("7g.141gb", 139.5, True, "estimated: full"),
    ]),
    "B200-180GB": _gpu("B200-180GB", [
        ("1g.23gb", 21.75, True, "estimated: 1/8 of ~178 GiB usable"),
        ("1g.45gb", 44.25, True, "estimated: 2/8"),
        ("2g.45gb", 44.25, True, "estimated: 2/8"),
        ("3g.90gb", 88.75, True, "estimated: 4/8"),
        ("4g.90gb", 88.75, True, "estimated: 4/8"),
        ("7g.180gb", 177.5, True, "estimated: full"),
    ]),
}


def candidates(gpu: str = "all") -> list[SliceProfile]:
    """The table's profiles for one GPU model, or for all of them."""
    if gpu == "all":
        return [p for rows in TABLE.values() for p in rows]
    for name, rows in TABLE.items():
        if name.lower() == gpu.lower():
            return list(rows)
    raise InvalidParameter("gpu", gpu, f"must be 'all' or one of {', '.join(TABLE)}")


def from_published(published) -> list[SliceProfile]:
    """Candidates from what a cluster publishes (``cluster.analysis.published_slices``:
    profile, product, memory_gib, free), so advice fits the slices that really exist."""
    return [SliceProfile(p.profile, p.memory_gib, p.product, False,
                         "published by the cluster (ResourceSlice capacity memory)", p.free,
                         p.multiprocessors)
            for p in published]


@dataclass
class Recommendation:
    peak_gib: float
    headroom: float
    chosen: SliceProfile | None
    next_smaller: SliceProfile | None
    ranked: list[tuple[SliceProfile, bool]]  # every candidate, smallest first, and if it fits

    def to_dict(self) -> dict:
        return {
            "peak_gib": self.peak_gib,
            "headroom": self.headroom,
            "chosen": self.chosen.to_dict() if self.chosen else None,
            "next_smaller": self.next_smaller.to_dict() if self.next_smaller else None,
            "candidates": [{**p.to_dict(), "fits": fits,
                            "budget_gib": round(budget.budget_gib(p.memory_gib, self.headroom), 2)}
                           for p, fits in self.ranked],
        }


def compute_slices(profile: SliceProfile) -> int | None:
    """The compute slices a MIG profile names (``2g.20gb``: 2); None for ``full`` and names
    that are not a MIG profile."""
    return mig_compute_slices(profile.name) if is_mig_profile(profile.name) else None


def _compute_size(profile: SliceProfile) -> int:
    slices = compute_slices(profile)
    return 99 if slices is None else slices


def check_peak(peak_gib: float) -> float:
    """A peak to size for: a finite number of GiB above zero (never NaN into the advice)."""
    if not (math.isfinite(peak_gib) and peak_gib > 0):
        raise InvalidParameter("peak_gib", peak_gib,
                               "must be a finite number of GiB > 0, e.g. --peak-gib 5.1")
    return peak_gib


def recommend(peak_gib: float, candidates: list[SliceProfile],
              headroom: float = budget.DEFAULT_HEADROOM) -> Recommendation:
    """The smallest candidate whose budget (memory less headroom) holds ``peak_gib``.

    Smallest means least memory, then fewest compute slices (``1g.20gb`` before ``2g.20gb``).
    A cluster candidate with ``free == 0`` is ranked but never chosen. ``next_smaller`` is
    the largest candidate below the chosen one: the one the knobs would have to fit.
    """
    check_peak(peak_gib)
    budget.check_headroom(headroom)
    if not candidates:
        raise InvalidParameter("candidates", [], "need at least one slice profile")
    ranked = sorted(candidates, key=lambda p: (p.memory_gib, _compute_size(p), p.gpu, p.name))
    marked = [(p, budget.fits(peak_gib, p.memory_gib, headroom)) for p in ranked]
    chosen = next((p for p, fits in marked if fits and p.free != 0), None)
    limit = chosen.memory_gib if chosen else float("inf")
    smaller = [p for p, fits in marked if p.memory_gib < limit and not fits]
    return Recommendation(peak_gib, headroom, chosen, smaller[-1] if smaller else None, marked)
