"""The validate step: one verdict, with a reason for every check.

Checks, each able to fail:
1. memory: the SFT's peak stayed inside the slice's budget (``budget.fits``);
2. learning: the loss, read back from the per-step metrics, fell by at least a fraction;
3. adapter: the output set is whole (``outputs.read_record``: a run that stopped while
   saving is a FAIL saying so), and the saved adapter, loaded onto a freshly built base,
   reproduces the trained model's logits on a fixed batch — and does change the base's logits
   (an all-zero adapter would "reproduce" nothing).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from peft import PeftModel
from safetensors import SafetensorError

from draslice.errors import DrasliceError, InvalidParameter, MissingDependency
from draslice.trainer import budget, loglines, outputs
from draslice.trainer.config import KNOBS, SFTConfig, VerdictConfig
from draslice.trainer.model import build_base, load_pretrained
from draslice.trainer.outputs import ADAPTER_DIR, REFERENCE_FILE, RUN_FILE
from draslice.trainer.result import loss_drop

LOGITS_ATOL = 1e-3
LOGITS_RTOL = 1e-3
LOGITS_ATOL_BF16 = 5e-2  # a bf16 base rounds differently on another device


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class Verdict:
    passed: bool
    checks: list[Check] = field(default_factory=list)
    figures: dict = field(default_factory=dict)

    @property
    def reasons(self) -> list[str]:
        return [f"{'ok' if c.passed else 'FAILED'} {c.name}: {c.detail}" for c in self.checks]

    def text(self) -> str:
        return loglines.verdict(self.passed, self.reasons)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "checks": [asdict(c) for c in self.checks],
                "figures": self.figures}


def read_records(metrics_path: str | Path) -> list[dict]:
    """The SFT's per-step JSON-lines metrics; a line without a numeric loss is named by
    number."""
    path = Path(metrics_path)
    if not path.is_file():
        raise DrasliceError(f"{path}: metrics file not found (the SFT step writes it)")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record["loss"] = float(record["loss"])
        except (ValueError, KeyError, TypeError) as err:
            raise DrasliceError(
                f"{path}:{number}: expected a JSON object with a numeric 'loss' ({err})"
            ) from err
        records.append(record)
    if not records:
        raise DrasliceError(f"{path}: no training steps recorded")
    return records


def read_losses(metrics_path: str | Path) -> list[float]:
    """Losses from the SFT's JSON-lines metrics."""
    return [r["loss"] for r in read_records(metrics_path)]


def memory_compared(device: dict | None, template: str = "") -> tuple[str, str]:
    """What the peak memory was compared with, and what was not applied, said plainly.

    ``device`` is the fine-tune's ``DeviceInfo.to_dict()``. On the CPU the peak is the
    process's resident memory against the host's RAM: no slice exists there, and no cap can
    be set (``device.check_slice_cap`` refuses one), so the template's size is not applied.
    On a whole GPU without ``slice_memory_gib`` nothing was emulated either.
    """
    named = f"the {template} template" if template else "the claim template"
    if not device:
        return "slice", ""
    if device.get("device") == "cpu":
        return "host RAM", f"no GPU here, so {named}'s memory was not applied"
    if device.get("slice_cap_gib"):
        return ("emulated slice", f"a CUDA memory cap on {device.get('name')} "
                                  f"({device.get('physical_mem_gib')} GiB)")
    if device.get("is_mig"):
        return "MIG slice", ""
    return (f"whole GPU ({device.get('name')})",
            f"no cap: {named}'s memory was not emulated (set slice_memory_gib)")


def check_memory(peak_gib: float, slice_gib: float, headroom: float,
                 compared: tuple[str, str] = ("slice", "")) -> Check:
    label, note = compared
    limit = budget.budget_gib(slice_gib, headroom)
    ok = budget.fits(peak_gib, slice_gib, headroom)
    return Check(
        "memory",
        ok,
        f"peak {peak_gib:.2f} GiB {'<=' if ok else '>'} {limit:.2f} GiB "
        f"({label} {slice_gib:.2f} GiB less {headroom:.0%} headroom"
        f"{'; ' + note if note else ''})",
    )


def check_learning(losses: list[float], min_loss_drop: float) -> tuple[Check, dict]:
    initial, final, drop = loss_drop(losses)
    ok = drop >= min_loss_drop
    detail = f"loss {initial:.3f} -> {final:.3f}, fell {drop:.1%} (need >= {min_loss_drop:.0%})"
    return Check("loss", ok, detail), {"initial_loss": initial, "final_loss": final,
                                       "loss_drop": drop}


def check_adapter(model_dir: str | Path,
                  base_model_dir: str | Path | None = None) -> tuple[Check, dict]:
    """Reload the adapter onto a fresh base and compare logits with the trained model's.

    ``base_model_dir`` replaces the base directory the run recorded (a Model artifact is
    found at another path in the validating pod than in the training one).
    """
    model_dir = Path(model_dir)
    record, problem = outputs.read_record(model_dir)
    if problem:  # a run that stopped while saving: a FAIL that says so, never a mix
        return Check("adapter", False, problem), {}
    try:
        cfg = SFTConfig.from_dict(record["config"])
    except (TypeError, ValueError) as err:  # a key unknown here, or a value out of range
        return Check("adapter", False, f"{model_dir / RUN_FILE}: its config is not one this "
                                       f"draslice reads ({err})"), {}
    if base_model_dir is not None:
        cfg = replace(cfg, model_dir=str(base_model_dir))
    try:
        ref = torch.load(model_dir / REFERENCE_FILE, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as err:
        return Check("adapter", False, f"{model_dir / REFERENCE_FILE} cannot be read "
                                       f"({str(err).splitlines()[0]})"), {}
    try:
        base = _rebuild_base(cfg).eval()
    except MissingDependency as err:  # a QLoRA base without bitsandbytes here
        return Check("adapter", False, f"cannot reload the base here: {err}"), {}
    device = next(base.parameters()).device
    ref = {k: v.to(device) for k, v in ref.items()}
    with torch.no_grad():
        base_logits = base(input_ids=ref["input_ids"]).logits.float()
    try:
        reloaded = PeftModel.from_pretrained(base, model_dir / ADAPTER_DIR).eval()
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        return Check("adapter", False, f"{model_dir / ADAPTER_DIR} cannot be loaded "
                                       f"({str(err).splitlines()[0]})"), {}
    with torch.no_grad():
        logits = reloaded(input_ids=ref["input_ids"]).logits.float()
    ref = {k: v.cpu() for k, v in ref.items()}
    base_logits, logits = base_logits.cpu(), logits.cpu()
    diff = float((logits - ref["logits"]).abs().max())
    effect = float((ref["logits"] - base_logits).abs().max())
    atol = LOGITS_ATOL
    if cfg.bf16_weights or cfg.load_in_4bit:
        # bf16 activations round differently on another device (trained on a GPU, checked
        # here on the CPU): ask that the reload lands ten times closer to the trained model
        # than the bare base is, which a missing or wrong adapter cannot do.
        atol = max(LOGITS_ATOL_BF16, 0.1 * effect)
    same = torch.allclose(logits, ref["logits"], atol=atol, rtol=LOGITS_RTOL)
    changes = effect > 10 * LOGITS_ATOL
    detail = (
        f"reloaded onto a fresh base: max |logit diff| {diff:.2e} (atol {atol:.0e}); "
        f"the adapter moves the base's logits by up to {effect:.3f}"
    )
    if not changes:
        detail += " — too little: the adapter has no effect"
    return Check("adapter", bool(same and changes), detail), {
        "adapter_max_logit_diff": diff,
        "adapter_effect": effect,
    }


def _rebuild_base(cfg: SFTConfig) -> torch.nn.Module:
    """The base the adapter was trained on: same synthetic shape and seed, or ``model_dir``."""
    if cfg.synthetic:
        return build_base(cfg.shape, cfg.seed)
    if cfg.load_in_4bit:
        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        return load_pretrained(cfg.model_dir, dtype=torch.bfloat16, load_in_4bit=True,
                               device=device)
    dtype = torch.bfloat16 if cfg.bf16_weights else torch.float32
    return load_pretrained(cfg.model_dir, dtype=dtype)


def validate(
    model_dir: str | Path,
    metrics_path: str | Path,
    slice_total_mem_gib: float,
    peak_mem_gib: float,
    memory_headroom: float = KNOBS["memory_headroom"].default,
    min_loss_drop: float = KNOBS["min_loss_drop"].default,
    base_model_dir: str | Path | None = None,
    device: dict | None = None,
    template: str = "",
) -> Verdict:
    """``device`` (the fine-tune's device facts) and ``template`` say what the peak memory
    was compared with (:func:`memory_compared`)."""
    VerdictConfig(memory_headroom=memory_headroom, min_loss_drop=min_loss_drop)
    if slice_total_mem_gib <= 0:
        raise InvalidParameter("slice_total_mem_gib", slice_total_mem_gib, "must be > 0")
    memory = check_memory(peak_mem_gib, slice_total_mem_gib, memory_headroom,
                          memory_compared(device, template))
    learning, learn_figures = check_learning(read_losses(metrics_path), min_loss_drop)
    adapter, adapter_figures = check_adapter(model_dir, base_model_dir)
    checks = [memory, learning, adapter]
    figures = {
        "peak_mem_gib": peak_mem_gib,
        "slice_total_mem_gib": slice_total_mem_gib,
        "memory_budget_gib": budget.budget_gib(slice_total_mem_gib, memory_headroom),
        **learn_figures,
        **adapter_figures,
    }
    return Verdict(passed=all(c.passed for c in checks), checks=checks, figures=figures)
