"""One run at a time in a folder: an exclusive lock on the output folder, and on the checkpoint
folder, for the run's whole life.

Two runs into one folder both resume from the same checkpoint, interleave their lines in
``metrics.jsonl``, overwrite each other's adapter and both exit 0. So a run holds ``flock`` on
a file in each folder it writes (:data:`LOCK_FILE`, which names the holder: pid, host, start
time) and a second run is refused, naming the holder. The kernel drops a ``flock`` when its
holder exits, however it exits, so a run killed with SIGKILL (or a node that lost its pod)
leaves no lock, only the file naming it: the next run takes the lock and says whose it was.
NFS (v4, and v3 through the client's lock manager) carries ``flock`` between hosts.

A run releases its locks when it ends (:func:`held_until_done`), deleting the file while it
still holds it; a run that opened the file just before finds, once it has the lock, that the
file it locked is no longer the one at the path, and starts over on the new one.

Re-entrant within a process: the ``draslice train`` command takes the locks in its early
checks and the training loop asks again (the same run); ``flock`` would refuse a second
descriptor of the same process.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from draslice.errors import InvalidParameter
from draslice.trainer import loglines, outputs

LOCK_FILE = ".draslice.lock"
# real path of a folder -> (the descriptor holding its lock, the folders the run made for it)
_held: dict[str, tuple[int, list[Path]]] = {}


def holder_text(holder: dict) -> str:
    """``pid 1234 on host node-7, started 2025-01-02 03:04:05 UTC`` (what a lock file says)."""
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started "
            f"{holder.get('started', '?')}")


def acquire(folder: str | Path, name: str, log: Callable[[str], None] = print,
            created: list[Path] = ()) -> bool:
    """Lock ``folder`` (the knob ``name`` gave it) for this process; whether this call took
    it (False: this process held it already). Another live holder: InvalidParameter naming it;
    a file left by a holder that is gone: taken over, and the line says whose it was.
    ``created``: the folders the run made for this one (``outputs.check_writable_dir``),
    taken back at :func:`release` if the run left nothing in them."""
    key = os.path.realpath(folder)
    if key in _held:
        return False
    path = Path(key) / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise InvalidParameter(
                name, str(folder), f"another run is writing there ({holder_text(holder)}; "
                f"{path}); wait for it to end, or give this run another folder") from None
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            log(loglines.lock_unsupported(folder, err.strerror or str(err)))
            return False
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder released it and deleted the file meanwhile: the new one
    previous = _read(fd)
    mine = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
    os.fsync(fd)
    _held[key] = (fd, list(created))
    if previous:
        log(loglines.lock_taken_over(folder, holder_text(previous)))
    return True


def release(folder: str | Path) -> None:
    """Give ``folder``'s lock up, deleting its file first (while still held)."""
    found = _held.pop(os.path.realpath(folder), None)
    if found is None:
        return
    fd, created = found
    path = Path(os.path.realpath(folder)) / LOCK_FILE
    try:
        if _same_file(fd, path):
            os.unlink(path)
    except OSError:
        pass  # the folder went away or turned read-only: the lock still ends with the fd
    finally:
        os.close(fd)
    outputs.remove_created(created)  # a run that wrote nothing leaves no folder


@contextmanager
def held_until_done(*folders: str | Path) -> Iterator[None]:
    """Whatever locks this process holds on ``folders`` (empty ones skipped) are released
    when the block ends, however it ends: a run's life."""
    try:
        yield
    finally:
        for folder in folders:
            if str(folder).strip():
                release(folder)


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def _read(fd: int) -> dict:
    """The holder a lock file names; {} for an empty or unreadable one."""
    try:
        found = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
