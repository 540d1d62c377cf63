"""Which slice a fine-tune needs: measure its peak memory, pick the smallest profile that
holds it with headroom (``profiles.recommend``, ``budget``'s rule), and find the levers that
would fit the next smaller profile.

The measurement is real: a few optimizer steps of the user's own config (model, data, LoRA,
batch) with every batch padded to ``max_length``, so the peak is the worst case a full-length
batch reaches. On a GPU each lever is measured the same way; on the CPU a process's peak
resident memory only grows, so levers are listed without a measurement (and the peak is host
memory, which the output says).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from draslice.errors import MissingDependency, SliceOutOfMemory
from draslice.sizing.profiles import Recommendation, SliceProfile, recommend
from draslice.trainer import budget
from draslice.trainer.config import SFTConfig

if TYPE_CHECKING:  # torch and the trainer load only to measure: --peak-gib is a table lookup
    from draslice.trainer.artifacts import SFTResult

MEASURE_STEPS = 3


@dataclass
class KnobTrial:
    knobs: list[str]
    peak_gib: float | None  # None: not measured (CPU) or out of memory
    fits: bool | None  # None: not measured
    note: str = ""


@dataclass
class Advice:
    peak_gib: float
    device: str
    on_cuda: bool
    recommendation: Recommendation
    measured: bool = True
    trials: list[KnobTrial] = field(default_factory=list)
    untested_knobs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "peak_gib": self.peak_gib,
            "device": self.device,
            "measured": self.measured,
            "peak_is_gpu_memory": self.on_cuda and self.measured,
            **self.recommendation.to_dict(),
            "knob_trials": [t.__dict__ for t in self.trials],
            "untested_knobs": self.untested_knobs,
        }


def measure(cfg: SFTConfig, steps: int = MEASURE_STEPS) -> SFTResult:
    """A short run of ``cfg`` at full sequence length; its result carries the peak."""
    import torch

    from draslice.trainer.sft import train

    probe = replace(cfg, steps=steps, log_every=steps, checkpoint_every=0, checkpoint_dir="",
                    merge=False, eval_fraction=0.0, pad_to_max_length=True,
                    slice_memory_gib=0.0, warmup_steps=0)
    with tempfile.TemporaryDirectory(prefix="draslice-advise-") as tmp:
        result = train(probe, tmp, f"{tmp}/metrics.jsonl", log=lambda _line: None)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def advise(cfg: SFTConfig, candidates: list[SliceProfile],
           headroom: float = budget.DEFAULT_HEADROOM, steps: int = MEASURE_STEPS,
           peak_gib: float | None = None, try_knobs: bool = True) -> Advice:
    """Measure (unless ``peak_gib`` is given), recommend, and try levers for the next size."""
    if peak_gib is None:
        from draslice.trainer.inputs import check_model_and_data

        check_model_and_data(cfg)  # a bad model or data file is named as `train` names it
        result = measure(cfg, steps)
        peak, device = result.peak_mem_gib, result.device["name"]
        on_cuda = result.device["device"].startswith("cuda")
    else:
        peak, device, on_cuda = peak_gib, "", True
    rec = recommend(peak, candidates, headroom)
    advice = Advice(peak, device, on_cuda, rec, measured=peak_gib is None)
    target = rec.next_smaller
    if target is None:
        return advice
    knobs = budget.knobs_to_try(cfg)
    if not (try_knobs and on_cuda and peak_gib is None):
        advice.untested_knobs = [k.describe() for k in knobs]
        return advice
    # Add levers one at a time, cheapest first, until the next smaller profile holds the peak.
    trial_cfg, applied = cfg, []
    for knob in knobs:
        candidate = replace(trial_cfg, **knob.changes)
        try:
            trial_peak = measure(candidate, steps).peak_mem_gib
        except MissingDependency as err:  # e.g. --load-in-4bit without bitsandbytes
            advice.trials.append(KnobTrial([*applied, knob.flag], None, None, str(err)))
            continue
        except SliceOutOfMemory:
            trial_peak = None
        trial_cfg = candidate
        applied.append(knob.flag)
        if trial_peak is None:
            advice.trials.append(KnobTrial(list(applied), None, False, "out of memory"))
            continue
        fits = budget.fits(trial_peak, target.memory_gib, headroom)
        advice.trials.append(KnobTrial(list(applied), trial_peak, fits))
        if fits:
            break
    return advice
