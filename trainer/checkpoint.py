"""Checkpoints that survive a killed pod: written atomically, resumed by rerunning the task.

A checkpoint is a directory ``step-00000050`` holding the adapter (``save_pretrained``),
``state.pt`` (optimizer, LR scheduler, RNG states, the batch sampler's position, the losses so
far, the step, the inputs' content fingerprint) and ``files.json`` (every file's size, written
last). It is written under a temporary name, fsynced and renamed into place, so a reader sees
either a whole checkpoint or none — a SIGKILL mid-write leaves only a ``.tmp-*`` directory,
which the next run deletes, and a full disk ends in one line (``outputs.write_errors``) with
the partial directory removed. Only the newest ``KEEP`` checkpoints are kept.

A checkpoint damaged after it was written (a missing or truncated file: a copy that stopped,
a volume that lost unsynced data) is found by :func:`whole_problem`; :func:`tidy` deletes it,
naming it, and the run resumes from the previous whole one.

Resuming is refused, with the reason, when the checkpoint belongs to another run: another
config (``IDENTITY``), other model or data *content* (``fingerprint``), or more steps
than this run asks for.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

from draslice.errors import DrasliceError, InvalidParameter
from draslice.trainer import fingerprint, outputs

PREFIX = "step-"
TMP_PREFIX = outputs.TMP_PREFIX
STATE_FILE = "state.pt"
WEIGHTS = f"{outputs.ADAPTER_DIR}/adapter_model.safetensors"
FILES = "files.json"
KEEP = 2
# Config fields that must match for a checkpoint to belong to this run. The model and data are
# compared by content (``fingerprint``), not by path; ``steps`` too with a cosine
# schedule, whose rate at every step depends on the run's length.
IDENTITY = ("shape", "data_format", "max_length", "pack", "eval_fraction",
            "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "batch_size",
            "learning_rate", "weight_decay", "lr_schedule", "warmup_steps", "seed",
            "load_in_4bit", "bf16_weights", "dataset_size", "alphabet")
INPUT_PATHS = ("model_dir", "data")  # compared only for checkpoints without a fingerprint


# torch is imported in the functions that save and load: checking whether a folder's
# checkpoint belongs to this run (before any work) reads files.json, not a tensor.


def rng_state() -> dict:
    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(root: Path, step: int, model, state: dict, adapter: dict | None = None) -> Path:
    """Write checkpoint ``step`` atomically and prune older ones. ``adapter``: the LoRA
    weights gathered whole (``distributed.full_trainable``), when ``model``'s are sharded."""
    import torch

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    config = state.get("config", {})
    hashes = fingerprint.content_hashes(config)
    with outputs.write_errors(f"checkpoint {final.name}", root, tmp):
        model.save_pretrained(tmp / outputs.ADAPTER_DIR, state_dict=adapter)
        torch.save({**state, "step": step, "rng": rng_state(), "inputs": hashes},
                   tmp / STATE_FILE)
        about = {"step": step, "config": config, "inputs": hashes,
                 "files": outputs.sizes(tmp, [outputs.ADAPTER_DIR, STATE_FILE])}
        (tmp / FILES).write_text(json.dumps(about, indent=2) + "\n")
        outputs.replace_path(tmp, final)
    for stale in completed(root)[:-KEEP]:
        shutil.rmtree(stale)
    return final


def completed(root: Path) -> list[Path]:
    """Whole checkpoints, oldest first (temporary directories are never listed)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def latest(root: Path) -> Path | None:
    found = completed(root)
    return found[-1] if found else None


def whole_problem(path: Path) -> str | None:
    """What is wrong with checkpoint ``path`` (a missing, truncated or unreadable file), or
    None when it is whole: sizes against ``files.json`` (written last; checkpoints of older
    versions have none), the adapter's safetensors header, and the CRC of every record in
    ``state.pt`` (a zip archive)."""
    from safetensors import SafetensorError, safe_open

    for needed in (WEIGHTS, STATE_FILE):
        if not (path / needed).is_file():
            return f"{path / needed} is missing"
    if (path / FILES).exists():
        try:
            problem = outputs.size_problem(path, json.loads((path / FILES).read_text())["files"])
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            return f"{path / FILES} is not a checkpoint's file list ({err})"
        if problem:
            return problem
    try:
        with safe_open(str(path / WEIGHTS), "pt"):
            pass
    except (SafetensorError, OSError) as err:
        return f"{path / WEIGHTS}: {err}"
    try:
        with zipfile.ZipFile(path / STATE_FILE) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"{path / STATE_FILE}: {err}"
    return f"{path / STATE_FILE}: record {bad} is corrupt" if bad else None


def tidy(root: Path, log: Callable[[str], None] = print) -> None:
    """Remove what a killed or failed run left under ``root``, so that :func:`latest` is the
    checkpoint to resume: the ``.tmp-*`` directories of a writer that stopped, and damaged
    checkpoints, named in the log (they would otherwise stay the newest by name, and a later
    save would prune the good ones). One process does it (rank 0), before any reads it."""
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)
    for path in reversed(completed(root)):
        problem = whole_problem(path)
        if problem is None:
            return
        log(f"[checkpoint] {path.name} is damaged ({problem}); deleted it, resuming from the "
            "one before")
        shutil.rmtree(path, ignore_errors=True)


def _about(path: Path) -> dict:
    """The step, config and input fingerprint a whole checkpoint was written with."""
    if (path / FILES).is_file():
        return json.loads((path / FILES).read_text())
    import torch

    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)


def check_resumable(root: Path, config: dict) -> None:
    """Refuse, before any work, to resume a checkpoint under ``root`` that belongs to another
    run (config, model or data content) or lies past ``config["steps"]``; damaged ones are left
    for :func:`tidy` to delete."""
    for path in reversed(completed(root)):
        if whole_problem(path) is None:
            check_same_run(path, _about(path), config)
            return


def check_same_run(path: Path, about: dict, config: dict) -> None:
    saved = about.get("config", {})
    keys = [*IDENTITY, *(() if "inputs" in about else INPUT_PATHS)]
    if saved.get("lr_schedule") == "cosine":
        keys.append("steps")
    differs = [f"{k}: {saved[k]!r} there, {config.get(k)!r} now"
               for k in keys if k in saved and saved[k] != config.get(k)]
    differs += [f"the {name}'s content changed (sha256 of {config.get(key)!r} differs)"
                for name, key in (("model", "model_dir"), ("data", "data"))
                if name in fingerprint.changed(about.get("inputs", {}), config)]
    if differs:
        raise DrasliceError(
            f"{path} is a checkpoint of a different run ({'; '.join(differs)}); use another "
            "output (or checkpoint) directory, or delete it to start over"
        )
    step, steps = about["step"], config.get("steps", about["step"])
    if step > steps:
        raise InvalidParameter(
            "steps", steps,
            f"must be at least {step}: {path} is a checkpoint of this run at step {step}; "
            f"give steps >= {step} to continue it, or another output (or checkpoint) "
            f"directory, or delete {path.parent} to train {steps} steps from scratch",
        )


def load(path: Path, step, config: dict) -> dict:
    """Load checkpoint ``path``'s adapter into ``step`` (``distributed.StepLoss``, sharded or
    not) and return its state.

    Refuses a checkpoint of a different run: resuming it would silently train something else.
    """
    import torch
    from safetensors.torch import load_file

    from draslice.trainer.distributed import load_trainable

    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    check_same_run(path, state, config)
    load_trainable(step, load_file(str(path / WEIGHTS)))
    return state
