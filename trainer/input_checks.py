"""What a fine-tune is given, checked before any model is loaded.

:func:`check_before_work` runs right after the config's own range checks and before the first
byte of a model is read, so a bad folder, model or data file costs a second, not a model load
(minutes for a 7B base): every error is one line naming the parameter, file or line and what
would be valid (exit code 2). Only then does it withdraw the previous run's record from the
output folder (``outputs.uncommit``), so a refused run leaves a finished one untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from draslice.trainer import checkpoint, fingerprint, folder_lock, model, outputs
from draslice.trainer.data.examples import (
    check_batch_size,
    check_tokenizer,
    read_records,
    train_count,
)
from draslice.trainer.model import match as model_match
from draslice.trainer.torchrun_env import launched


def check_before_work(cfg, output_dir: str | Path, log: Callable[[str], None] = print) -> None:
    """Every input of ``cfg`` (an ``SFTConfig``) that can be checked without loading the
    model: the output and checkpoint folders, each then locked for this run
    (``folder_lock``: a second run into them is refused), the model folder (config against
    weight headers, tokenizer files, positions against ``max_length``, LoRA against the
    model's shapes), every data record, and whether a checkpoint there belongs to this run
    (``checkpoint.check_resumable``). The locks stay held when it returns; the training
    loop releases them when the run ends."""
    created: list[Path] = []
    locked: list[Path] = []
    refused = True
    try:
        out = outputs.check_writable_dir(output_dir, "output_dir", created)
        if folder_lock.acquire(out, "output_dir", log, created):
            locked.append(out)
        if cfg.checkpoint_dir:
            made = len(created)
            ckpt = outputs.check_writable_dir(cfg.checkpoint_dir, "checkpoint_dir", created)
            if folder_lock.acquire(ckpt, "checkpoint_dir", log, created[made:]):
                locked.append(ckpt)
        check_model_and_data(cfg)
        root = outputs.checkpoint_root(cfg.checkpoint_dir, out)
        config = cfg.to_dict()
        if cfg.lora_targets.strip() == model.AUTO_TARGETS:  # as the checkpoint recorded it
            config["lora_targets"] = model.auto_targets_of(cfg.model_dir) or cfg.lora_targets
        checkpoint.check_resumable(root, config)
        refused = False
    finally:
        # A refused run leaves no trace: no lock, not even a folder. One that goes on keeps
        # its folders for the lock's file; the lock's release takes back the ones it made
        # if the run fails before its first write (a model that does not load).
        if refused:
            for folder in locked:
                folder_lock.release(folder)
            outputs.remove_created(created)
    outputs.uncommit(out)


def check_early(cfg, output_dir: str | Path, log: Callable[[str], None] = print) -> None:
    """What ``draslice train`` checks before it imports torch (seconds of CPU), so that a bad
    folder or file answers at once. Under torchrun every process runs the command at the same
    time, so there only the read-only checks run here; the folder checks run in rank 0 when
    the loop starts (``sft.train`` runs :func:`check_before_work` in every case)."""
    if launched()[1] == 1:
        check_before_work(cfg, output_dir, log)
    else:
        check_model_and_data(cfg)


# The model and data inputs already checked in this process: `train` and `advise` check them
# before importing torch, and the loop checks them again as part of check_before_work.
_checked: set[tuple] = set()


def check_model_and_data(cfg) -> None:
    """The model folder (config, tokenizer files, weight headers, positions against
    ``max_length``) and every data record of a real run; nothing for the synthetic one.
    ``advise`` runs this before it measures, so it words a bad input as ``train`` does."""
    if cfg.synthetic:
        check_lora(cfg)
        return
    key = (cfg.model_dir, cfg.max_length, str(cfg.data), cfg.data_format, cfg.pack,
           cfg.batch_size, cfg.eval_fraction, cfg.lora_r, cfg.lora_targets,
           _stamps(cfg.model_dir), _stamps(cfg.data))
    if key in _checked:
        return
    model.check_tokenizer_files(cfg.model_dir)
    model.check_weights(cfg.model_dir)
    model.check_max_length(cfg.model_dir, cfg.max_length)
    fmt, records = read_records(cfg.data, cfg.data_format)
    if not cfg.pack:  # each record is at most one row (packing makes rows of the tokens)
        check_batch_size(cfg.batch_size, train_count(len(records), cfg.eval_fraction))
    check_lora(cfg)  # the first check that imports torch and transformers (seconds)
    # The tokenizer (seconds at most, unlike the weights): one that cannot be loaded, or chat
    # data for a tokenizer without a chat template, is found before the folder is touched.
    check_tokenizer(model.load_tokenizer(cfg.model_dir), fmt, str(cfg.data))
    _checked.add(key)


def check_lora(cfg) -> None:
    """The LoRA targets exist and ``lora_r`` fits the smallest of them, on the model built
    on the meta device: the synthetic GPT-2 of the config's shape, or the folder's model from
    its config and weight headers, which are checked against each other first
    (``model.match``: a config that does not describe its weights is refused)."""
    import torch

    if cfg.synthetic:
        with torch.device("meta"):
            meta = model.build_base(cfg.shape, cfg.seed)
    else:
        meta = model_match.check_matches(cfg.model_dir)
    if meta is not None:  # None: the headers cannot say; wrap_lora checks the loaded model
        model.check_lora_fits(meta, cfg.lora_r, cfg.lora_targets)


def _stamps(path: str | Path) -> tuple:
    """Names, sizes and times of a file or of a folder's files (not recursive): an input
    rewritten between two checks in one process (a notebook, a test session) is checked again."""
    path = Path(path).expanduser()
    try:
        files = sorted(path.iterdir()) if path.is_dir() else [path]
        return tuple((f.name, *fingerprint.stamp(f)[:2]) for f in files if f.exists())
    except OSError:
        return ()
