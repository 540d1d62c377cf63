"""The output folder: its layout, checked before work starts, written as one atomic set, read
back whole. Every name in it is declared here, once.

``output_dir/``
    ``adapter/`` (peft ``save_pretrained``), ``reference_logits.pt``, ``merged/`` (with
    ``merge``), ``draslice_sft.json`` (the run's record); ``checkpoints/`` unless
    ``checkpoint_dir`` says otherwise (each checkpoint holds an ``adapter/`` too: ``checkpoint``).

A run's result is a *set*: ``adapter/``, ``reference_logits.pt``, ``merged/`` (with ``merge``)
and ``draslice_sft.json``. Each member is written under a ``.tmp-`` name, fsynced and renamed
into place, but renames of several members are not atomic together, so the set has a commit
record: ``draslice_sft.json`` is written last and lists every file of the set with its size
(``files``), and a run deletes the previous one before it changes anything in the folder
(:func:`uncommit`). After a full disk or a kill at any moment the folder holds either a set
whose record matches every file, or no record at all, which :func:`verify_set` (and so the
validate step) reports as an incomplete set. Never the new adapter beside the old record.

Sizes, not hashes: what a crash leaves is a missing or truncated file, which its size shows;
a file changed on purpose is the validate step's reload check's to catch (it compares logits).

Writing into a folder that fills up, or that cannot be written, ends in one line naming the
folder and the reason (:func:`write_errors`, :func:`clear_write_errors`), not in the writer's
traceback (``SafetensorError``, torch's ``inline_container.cc`` ``RuntimeError``, ``OSError``).
"""

from __future__ import annotations

import errno
import functools
import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from draslice.errors import InvalidParameter, OutputWriteError

RUN_FILE = "draslice_sft.json"
REFERENCE_FILE = "reference_logits.pt"
ADAPTER_DIR = "adapter"
MERGED_DIR = "merged"
CHECKPOINT_DIR = "checkpoints"  # under the output folder, unless a checkpoint folder is given
TMP_PREFIX = ".tmp-"
FILES_KEY = "files"
# The writers' words for a failed write: torch.save (caffe2's inline_container.cc), safetensors
# (a Rust io::Error), and the errno strings a Python write raises.
_WRITE_FAILURES = ("inline_container", "file write failed", "IoError", "No space left",
                   "StorageFull", "Disk quota", "File too large", "Read-only file system")
# Permission errors are not among them: the folder was checked before work started, and a
# permission error during training is more likely a read, which this wording would misname.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)


# -- before work starts -----------------------------------------------------------------------

def check_writable_dir(value: str | Path, name: str, created: list[Path]) -> Path:
    """``value`` as a folder this process can write, created if missing; else InvalidParameter.

    An empty value is refused: ``Path("")`` is the current directory, where a run would
    scatter its files. The check writes and deletes one probe file, so a read-only mount, a
    folder without write permission or a full disk is found before any model is loaded.
    The folders it made are appended to ``created`` (outermost first), for
    :func:`remove_created` to take back when a later check refuses the run.
    """
    if not str(value).strip():
        raise InvalidParameter(name, str(value), "must name a folder (empty would write into "
                                                 "the current directory)")
    path = Path(value).expanduser()
    try:
        if path.exists() and not path.is_dir():
            raise InvalidParameter(name, str(value), "is a file; give a folder")
        created.extend(reversed([p for p in (path, *path.parents) if not p.exists()]))
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=f"{TMP_PREFIX}probe-") as probe:
            probe.write(b"draslice")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as err:
        raise InvalidParameter(
            name, str(value), f"cannot write there ({err.strerror or err}); give a folder "
            "this user can write, on a volume with free space"
        ) from None
    return path


def checkpoint_root(checkpoint_dir: str, output_dir: Path) -> Path:
    """Where a run's checkpoints go: ``checkpoint_dir``, or ``checkpoints/`` in the output."""
    return Path(checkpoint_dir) if checkpoint_dir else output_dir / CHECKPOINT_DIR


def remove_created(created: list[Path]) -> None:
    """Remove the folders :func:`check_writable_dir` made, innermost first, if still empty."""
    for path in reversed(created):
        with suppress(OSError):
            path.rmdir()


def uncommit(output_dir: Path) -> None:
    """Withdraw the previous run's record before anything in the folder changes, and delete
    what a killed writer left (``.tmp-*``)."""
    record = output_dir / RUN_FILE
    if record.exists():
        record.unlink()
        fsync_dir(output_dir)
    remove_leftovers(output_dir)


# -- writing ----------------------------------------------------------------------------------

def keep_metrics_until(path: Path, step: int) -> None:
    """Drop metric lines after ``step`` (a killed run wrote some past its last checkpoint), and
    a last line cut short by a full disk: the rerun must not stop on what the failure left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if step == 0 or not path.exists():
        path.write_text("")
        return
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("step", 0) <= step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable (a no-op where directories cannot be
    opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file under ``path`` (or ``path`` itself) and every directory, deepest first."""
    if path.is_file():
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
        return
    for root, _dirs, files in os.walk(path, topdown=False):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(Path(root))


def replace_path(tmp: Path, final: Path) -> None:
    """Move the finished ``tmp`` (file or folder) to ``final``, replacing an older one, by
    renames only, after fsyncing it: a crash leaves the old or the new, never a mix."""
    fsync_tree(tmp)
    old = final.with_name(f"{TMP_PREFIX}old-{final.name}")
    _remove(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def is_write_failure(err: BaseException) -> bool:
    """Whether ``err`` is a writer saying the disk or folder refused the bytes."""
    if isinstance(err, OSError) and err.errno in _WRITE_ERRNOS:
        return True
    if isinstance(err, OSError | RuntimeError) or type(err).__name__ == "SafetensorError":
        return any(word in str(err) for word in _WRITE_FAILURES)
    return False


def describe_failure(err: BaseException, folder: Path) -> str:
    """The reason in a few words, with the free space where it was written."""
    text = str(err)
    if isinstance(err, OSError) and err.strerror:
        reason = err.strerror
    elif "No space left" in text or "StorageFull" in text:
        reason = "No space left on device"
    elif "File too large" in text:
        reason = "File too large"
    elif "inline_container" in text or "file write failed" in text:  # torch.save
        reason = f"the file could not be written whole, a full disk? ({text.splitlines()[0]})"
    else:
        reason = text.splitlines()[0][:200] if text else type(err).__name__
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    with suppress(OSError):
        reason += f"; {shutil.disk_usage(probe).free / 2**20:.1f} MiB free there"
    return reason


@contextmanager
def write_errors(what: str, folder: Path, tmp: Path | None = None) -> Iterator[None]:
    """Turn a failed write of ``what`` into OutputWriteError, removing the partial ``tmp``."""
    try:
        yield
    except Exception as err:
        message = None
        if is_write_failure(err):  # worded first: the free space at the moment it failed
            message = (f"cannot write {what} in {folder}: {describe_failure(err, folder)}. "
                       "Free space (or give a folder on a bigger volume) and rerun; with "
                       "checkpoints it resumes from the last whole one")
        if tmp is not None:
            with suppress(OSError):  # else the next run's clean-up deletes .tmp- leftovers
                _remove(tmp)
        if message is None:
            raise
        raise OutputWriteError(message) from err


def remove_leftovers(folder: Path) -> None:
    """Delete the ``.tmp-*`` entries a failed or killed writer left in ``folder``."""
    for leftover in folder.glob(f"{TMP_PREFIX}*"):
        with suppress(OSError):
            _remove(leftover)


def clear_write_errors(fn: Callable) -> Callable:
    """Decorate a function with an ``output_dir`` argument: any failed write inside it (the
    metrics file, a merged export) ends in one line naming that folder, and the partial
    ``.tmp-*`` entries in it are removed."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        folder = Path(str(signature.bind(*args, **kwargs).arguments.get("output_dir", ".")))
        try:
            with write_errors("the run's output", folder):
                return fn(*args, **kwargs)
        except OutputWriteError:
            if folder.is_dir():
                remove_leftovers(folder)
            raise

    return wrapper


def save_final(model, batch, output_dir: Path, device) -> None:
    """The adapter and the reference logits, each swapped in whole; uncommitted until
    :func:`commit` writes the record."""
    import torch

    output_dir.mkdir(parents=True, exist_ok=True)
    uncommit(output_dir)
    tmp = output_dir / f"{TMP_PREFIX}{ADAPTER_DIR}"
    with write_errors(f"the adapter ({ADAPTER_DIR}/)", output_dir, tmp):
        model.save_pretrained(tmp)
        replace_path(tmp, output_dir / ADAPTER_DIR)
    logits = reference_logits(model, batch.to(device))
    tmp = output_dir / f"{TMP_PREFIX}{REFERENCE_FILE}"
    with write_errors(REFERENCE_FILE, output_dir, tmp):
        torch.save({"input_ids": batch.cpu(), "logits": logits}, tmp)
        replace_path(tmp, output_dir / REFERENCE_FILE)


def reference_logits(model, batch):
    """fp32 logits on a fixed batch: what a reloaded adapter must reproduce."""
    import torch

    model.eval()
    with torch.no_grad():
        return model(input_ids=batch).logits.float().cpu()


def commit(output_dir: Path, record: dict) -> None:
    """Write the run's record last, listing the set's files: the set is now whole.

    ``merged/`` belongs to the set when the run's config asked for it; one left by an earlier
    run is removed, so the folder holds exactly one run's set.
    """
    members = [ADAPTER_DIR, REFERENCE_FILE]
    if record.get("config", {}).get("merge"):
        members.append(MERGED_DIR)
    else:
        _remove(output_dir / MERGED_DIR)
    record = {**record, FILES_KEY: sizes(output_dir, members)}
    tmp = output_dir / f"{TMP_PREFIX}{RUN_FILE}"
    with write_errors(RUN_FILE, output_dir, tmp):
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        replace_path(tmp, output_dir / RUN_FILE)


def sizes(root: Path, members: list[str]) -> dict[str, int]:
    """{path relative to ``root``: bytes} for every file of ``members`` (files or folders)."""
    found: dict[str, int] = {}
    for member in members:
        path = root / member
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            found[file.relative_to(root).as_posix()] = file.stat().st_size
    return found


# -- reading ----------------------------------------------------------------------------------

def size_problem(root: Path, expected: dict) -> str | None:
    """The first file of ``expected`` ({relative path: bytes}) missing or of another size."""
    for rel, size in expected.items():
        path = root / rel
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} has {path.stat().st_size} bytes, {size} when it was written " \
                   "(truncated or replaced)"
    return None


def read_record(output_dir: Path) -> tuple[dict | None, str | None]:
    """(the run's record, None) for a whole set, or (None, what is wrong with it)."""
    record_path = output_dir / RUN_FILE
    if not record_path.is_file():
        present = [n for n in (ADAPTER_DIR, REFERENCE_FILE) if (output_dir / n).exists()]
        if present:
            return None, (f"{record_path} is missing beside {', '.join(present)}: the output "
                          "set is incomplete (the run stopped while saving); rerun the training")
        return None, f"{record_path} is missing (no finished training run there)"
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        files, config = record[FILES_KEY], record["config"]
        if not isinstance(files, dict) or not isinstance(config, dict):
            raise TypeError("'files' and 'config' must be objects")
    except (ValueError, KeyError, TypeError) as err:
        return None, f"{record_path} is not a whole run record ({err}); rerun the training"
    problem = size_problem(output_dir, files)
    if problem:
        return None, f"the output set is incomplete: {problem}; rerun the training"
    if not any(rel.startswith(f"{ADAPTER_DIR}/") for rel in files) or REFERENCE_FILE not in files:
        return None, f"{record_path} lists no {ADAPTER_DIR}/ or {REFERENCE_FILE}"
    return record, None
