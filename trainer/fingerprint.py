"""The content of a run's inputs, as hashes: what a checkpoint records and resuming compares.

A path can keep its name while what is behind it changes (new data written over the old file,
another model in the same mounted folder), and can change its name while the content stays (a
Model artifact mounted at another path in the next pod), so a checkpoint belongs to a run by
the content of its model folder and data (``checkpoint.check_same_run``), not by their paths.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

CHUNK = 1 << 20


def content_hashes(config: dict) -> dict[str, str]:
    """{"model": sha256, "data": sha256} of a real run's inputs (empty for the synthetic run,
    whose inputs are all in the config)."""
    found = {}
    for key in ("model_dir", "data"):
        value = config.get(key) or ""
        if value:
            found[key.removesuffix("_dir")] = tree_hash(Path(value).expanduser())
    return found


def tree_hash(path: Path) -> str:
    """sha256 over a file, or over a folder's files (relative names and contents, sorted);
    hidden files (``.cache/``, editor droppings) do not count."""
    digest = hashlib.sha256()
    if path.is_file():
        digest.update(_file_hash(str(path), *stamp(path)).encode())
        return digest.hexdigest()
    if not path.is_dir():
        return ""
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path)
        if any(part.startswith(".") for part in rel.parts):
            continue
        digest.update(rel.as_posix().encode() + b"\0")
        digest.update(_file_hash(str(file), *stamp(file)).encode())
    return digest.hexdigest()


def stamp(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


@lru_cache(maxsize=4096)
def _file_hash(path: str, size: int, mtime_ns: int, inode: int) -> str:  # noqa: ARG001
    """One file's sha256, read once per process while its size, time and inode stay (the
    arguments after ``path`` are the cache key): each checkpoint of a run reuses it."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def changed(saved: dict, config: dict) -> list[str]:
    """The inputs whose content differs from the fingerprint a checkpoint recorded."""
    if not saved:
        return []  # a checkpoint written before fingerprints: its paths were compared
    now = content_hashes(config)
    return [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
