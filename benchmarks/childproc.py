"""Run one benchmark piece in a fresh Python process, with a hard timeout, and read its result.

Why a process per piece: peak GPU memory is per process (a trainer measured after another one
would see the first one's cached blocks), the emulated slice cap is per process, and a piece
that hangs or crashes must not take the others with it. Each child writes its result as JSON
to a file it is given (atomically, so a half-written file never reads as a result) and its
output is streamed, line by line, to our stdout and an optional log file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

KILL_GRACE_S = 5.0
_LIVE: set[int] = set()  # process groups of the children running now


def kill_children_on_term() -> None:
    """For a script that runs children: when it is terminated (its own timeout, one level up),
    kill its children's process groups too. Each child leads its own group, so killing this
    script's group alone would leave them running on the GPU into the next step."""

    def handler(signum, _frame) -> None:
        for pgid in list(_LIVE):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


@dataclass
class ChildOutcome:
    returncode: int | None
    timed_out: bool
    seconds: float
    result: dict | None
    tail: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.result is not None


def write_json(path: str | Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _pump(stream, prefix: str, sinks: list[TextIO], tail: deque) -> None:
    for line in iter(stream.readline, ""):
        tail.append(line)
        for sink in sinks:
            sink.write(prefix + line)
            sink.flush()


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's whole process group, then SIGKILL what is left after a grace."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(
    argv: list[str],
    result_path: Path,
    timeout_s: float,
    log: TextIO | None = None,
    prefix: str = "",
    env: dict[str, str] | None = None,
) -> ChildOutcome:
    """Run ``argv`` (a Python child) until it exits or ``timeout_s`` passes; read its JSON."""
    result_path.unlink(missing_ok=True)
    sinks: list[TextIO] = [sys.stdout] + ([log] if log else [])
    tail: deque[str] = deque(maxlen=40)
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,  # its own process group, so a timeout kills grandchildren too
    )
    _LIVE.add(proc.pid)
    pump = threading.Thread(target=_pump, args=(proc.stdout, prefix, sinks, tail), daemon=True)
    pump.start()
    timed_out = False
    try:
        proc.wait(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
    finally:
        _LIVE.discard(proc.pid)
    pump.join(timeout=KILL_GRACE_S)
    seconds = time.perf_counter() - start
    return ChildOutcome(
        returncode=proc.returncode,
        timed_out=timed_out,
        seconds=seconds,
        result=read_json(result_path),
        tail="".join(tail),
    )
