"""Checkpoints that survive a killed pod: written atomically, resumed by rerunning the task.

A checkpoint is a directory ``step-00000050`` holding the adapter (``save_pretrained``) and
``state.pt`` (optimizer, LR scheduler, RNG states, the batch sampler's position, the losses so
far, the step). It is written under a temporary name and renamed into place, so a reader sees
either a whole checkpoint or none — a SIGKILL mid-write leaves only a ``.tmp-*`` directory,
which the next run deletes. Only the newest ``KEEP`` checkpoints are kept.

The same is true of the final adapter: :func:`replace_dir` swaps a finished directory in.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import torch

from draslice.errors import DrasliceError

PREFIX = "step-"
TMP_PREFIX = ".tmp-"
STATE_FILE = "state.pt"
ADAPTER = "adapter"
KEEP = 2
# Config fields that must match for a checkpoint to belong to this run.
IDENTITY = ("shape", "model_dir", "data", "data_format", "max_length", "pack", "eval_fraction",
            "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "batch_size",
            "learning_rate", "weight_decay", "lr_schedule", "warmup_steps", "seed",
            "load_in_4bit", "bf16_weights", "dataset_size", "alphabet")


def replace_dir(tmp: Path, final: Path) -> None:
    """Move the finished ``tmp`` to ``final`` (replacing an older one) by renames only."""
    old = final.with_name(f"{TMP_PREFIX}old-{final.name}")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(root: Path, step: int, model, state: dict) -> Path:
    """Write checkpoint ``step`` atomically and prune older ones."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp / ADAPTER)
    torch.save({**state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
    replace_dir(tmp, final)
    for stale in completed(root)[:-KEEP]:
        shutil.rmtree(stale)
    return final


def completed(root: Path) -> list[Path]:
    """Whole checkpoints, oldest first (temporary directories are never listed)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def clean_partial(root: Path) -> None:
    """Delete what a killed writer left behind."""
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)


def latest(root: Path) -> Path | None:
    found = completed(root)
    return found[-1] if found else None


def load(path: Path, model, config: dict) -> dict:
    """Load checkpoint ``path`` into ``model`` (adapter weights) and return its state.

    Refuses a checkpoint of a different run: resuming it would silently train something else.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    saved = state.get("config", {})
    differs = [k for k in IDENTITY if k in saved and saved[k] != config.get(k)]
    if differs:
        detail = ", ".join(f"{k}: {saved[k]!r} there, {config.get(k)!r} now" for k in differs)
        raise DrasliceError(
            f"{path} is a checkpoint of a different run ({detail}); use another output "
            "(or checkpoint) directory, or delete it to start over"
        )
    weights = load_file(str(path / ADAPTER / "adapter_model.safetensors"))
    device = next(p.device for p in model.parameters() if p.requires_grad)
    set_peft_model_state_dict(model, {k: v.to(device) for k, v in weights.items()})
    return state
