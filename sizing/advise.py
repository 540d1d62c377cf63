"""Which slice a fine-tune needs: measure its peak memory, pick the smallest profile that
holds it with headroom (``profiles.recommend``, ``budget``'s rule), and find the levers that
would fit the next smaller profile.

The measurement is real: a few optimizer steps of the user's own config (model, data, LoRA,
batch) with every batch padded to ``max_length``, so the peak is the worst case a full-length
batch reaches. On a GPU each lever is measured the same way; on the CPU a process's peak
resident memory only grows, so levers are listed without a measurement (and the peak is host
memory, which the output says).

On a GPU the same probe's steps give the time: ``timing`` scales the steady step to each
profile's share of the SMs, so the advice says how long the run would take on the slice it
recommends (an estimate, with what it rests on).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from draslice.errors import MissingDependency, SliceOutOfMemory
from draslice.sizing.profiles import Recommendation, SliceProfile, recommend
from draslice.sizing.timing import MeasuredStep, Pace, pace
from draslice.trainer import budget
from draslice.trainer.config import SFTConfig

if TYPE_CHECKING:  # torch and the trainer load only to measure: --peak-gib is a table lookup
    from draslice.trainer.result import SFTResult

MEASURE_STEPS = 3


@dataclass
class KnobTrial:
    knobs: list[str]
    peak_gib: float | None  # None: not measured (CPU) or out of memory
    fits: bool | None  # None: not measured
    note: str = ""
    step: MeasuredStep | None = None  # its steps' time, on a GPU

    def pace(self, target: SliceProfile, run_steps: int) -> Pace | str | None:
        """Its time on ``target`` (or why none); None when its steps were not measured."""
        return None if self.step is None else pace(target, self.step, run_steps)

    def to_dict(self, target: SliceProfile | None, run_steps: int) -> dict:
        found = {"knobs": self.knobs, "peak_gib": self.peak_gib, "fits": self.fits,
                 "note": self.note}
        if self.step is not None and target is not None:
            found["time_on_target"] = _time_dict(self.pace(target, run_steps))
        return found


@dataclass
class Advice:
    peak_gib: float
    device: str
    on_cuda: bool
    recommendation: Recommendation
    measured: bool = True
    trials: list[KnobTrial] = field(default_factory=list)
    untested_knobs: list[str] = field(default_factory=list)
    step: MeasuredStep | None = None  # the probe's steps, on a GPU: the basis of every time
    run_steps: int = 0  # the config's steps, for the run time

    def pace(self, profile: SliceProfile) -> Pace | str:
        """The run's time on ``profile``, or why it is not predicted."""
        if self.step is None:
            return ("not predicted: given with --peak-gib" if not self.measured else
                    "not predicted: measured on the CPU" if not self.on_cuda else
                    "not predicted: --measure-steps 2 or more gives a steady step")
        return pace(profile, self.step, self.run_steps)

    def to_dict(self) -> dict:
        found = {
            "peak_gib": self.peak_gib,
            "device": self.device,
            "measured": self.measured,
            "peak_is_gpu_memory": self.on_cuda and self.measured,
            **self.recommendation.to_dict(),
            "measured_step": self.step.__dict__ if self.step else None,
            "run_steps": self.run_steps,
            "knob_trials": [t.to_dict(self.recommendation.next_smaller, self.run_steps)
                            for t in self.trials],
            "untested_knobs": self.untested_knobs,
        }
        for row, (profile, _fits) in zip(found["candidates"], self.recommendation.ranked,
                                         strict=True):
            row["time"] = _time_dict(self.pace(profile))
        return found


def _time_dict(found: Pace | str) -> dict:
    return found.to_dict() if isinstance(found, Pace) else {"none": found}


def measure(cfg: SFTConfig, steps: int = MEASURE_STEPS) -> tuple[SFTResult, MeasuredStep | None]:
    """A short run of ``cfg`` at full sequence length: its result carries the peak, its
    steps the time (None from one step)."""
    import torch

    from draslice.trainer import speed

    # Padding makes every batch one width, which would let compile=auto capture a CUDA graph
    # (its own memory pool, a faster step) where the real run, of varying widths, runs eager:
    # the probe runs the mode the real run gets, so its peak and its step are that run's.
    mode = "off" if cfg.compile == "auto" and not speed.fixed_width(cfg) else cfg.compile
    probe = replace(cfg, steps=steps, log_every=steps, checkpoint_every=0, checkpoint_dir="",
                    merge=False, eval_fraction=0.0, pad_to_max_length=True,
                    slice_memory_gib=0.0, warmup_steps=0, compile=mode)
    result, records = trained(probe)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result, MeasuredStep.from_run(records, result.device)


def trained(cfg: SFTConfig) -> tuple[SFTResult, list[dict]]:
    """``cfg`` trained in a scratch folder, quietly: its result and its metrics lines (one a
    step, ``step_seconds`` and ``tokens`` among them)."""
    from draslice.trainer.sft import train

    with tempfile.TemporaryDirectory(prefix="draslice-advise-") as tmp:
        metrics = Path(tmp, "metrics.jsonl")
        result = train(cfg, tmp, str(metrics), log=lambda _line: None)
        return result, [json.loads(line) for line in metrics.read_text().splitlines() if line]


def advise(cfg: SFTConfig, candidates: list[SliceProfile],
           headroom: float = budget.DEFAULT_HEADROOM, steps: int = MEASURE_STEPS,
           peak_gib: float | None = None, try_knobs: bool = True) -> Advice:
    """Measure (unless ``peak_gib`` is given), recommend, and try levers for the next size."""
    if peak_gib is None:
        from draslice.trainer.input_checks import check_model_and_data

        check_model_and_data(cfg)  # a bad model or data file is named as `train` names it
        result, step = measure(cfg, steps)
        peak, device = result.peak_mem_gib, result.device["name"]
        on_cuda = result.device["device"].startswith("cuda")
        step = step if on_cuda else None  # a CPU's step says nothing of a GPU slice's
    else:
        peak, device, on_cuda, step = peak_gib, "", True, None
    rec = recommend(peak, candidates, headroom)
    advice = Advice(peak, device, on_cuda, rec, measured=peak_gib is None, step=step,
                    run_steps=cfg.steps)
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
        trial_step = None
        try:
            trial, trial_step = measure(candidate, steps)
            trial_peak = trial.peak_mem_gib
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
        advice.trials.append(KnobTrial(list(applied), trial_peak, fits, step=trial_step))
        if fits:
            break
    return advice
