"""The first process of every task ``draslice run`` starts: the task dies with the runner.

kfp.local starts a task as ``sh -ec '...; python -m kfp.dsl.executor_main ...'``, and dash
forks that python rather than exec it. A runner killed with SIGKILL runs no cleanup, so the
task kept running until it next wrote to the closed pipe (seconds of a fine-tune on the
device). A signal the kernel sends when a parent dies (``PR_SET_PDEATHSIG``) reaches only the
direct child, the shell, and the shell's death does not reach its python. So the runner starts
each task through this guard (``local.kfp_fixes``):

- the kernel sends the guard SIGTERM when the runner dies (Linux); elsewhere, and as a second
  line, the guard sees its parent change;
- the guard is a child subreaper (Linux): a process of the task whose parent died comes back
  to it rather than to init, so none slips out of the tree below the guard;
- when the runner goes, on SIGTERM, SIGINT or SIGHUP, and when the task ends, the guard
  SIGKILLs every process below it, then exits with the task's code;
- the task's first process gets PR_SET_PDEATHSIG SIGKILL, in case the guard itself is
  SIGKILLed.

The task stays in the runner's process group, so whatever ends that group (Ctrl-C in a
terminal, a CI job's kill of its group) still reaches the task directly.

Usage: ``python -m draslice.local.task_guard PARENT_PID -- COMMAND...``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PARENT_POLL_S = 0.2  # how often the guard checks its parent where the kernel cannot tell it
KILL_ROUNDS, KILL_ROUND_S = 50, 0.01
ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# The C library's symbols, resolved once here: the task's setup runs between fork and exec,
# where nothing may be looked up.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def command(full_command: list[str]) -> list[str]:
    """``full_command`` run under a guard that dies with this process."""
    return [sys.executable, "-m", __name__, str(os.getpid()), "--", *full_command]


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; False elsewhere."""
    return _LIBC is not None and _LIBC.prctl(option, value, 0, 0, 0) == 0


def _task_setup() -> None:
    """In the task's process, between fork and exec: SIGKILL when the guard dies, and the
    signals the guard ignored while starting it back to their defaults (an ignored signal
    stays ignored across exec)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for signum in ENDING:
        signal.signal(signum, signal.SIG_DFL)


def _live(pid: int) -> bool:
    """Whether ``pid`` runs (not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> list[int]:
    """The running processes below ``pid``: from /proc where it lists children (Linux), else
    from ``ps``."""
    if Path(f"/proc/{pid}/task").is_dir():
        found, todo = [], [pid]
        while todo:
            for children in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
                with contextlib.suppress(OSError, ValueError):
                    kids = [int(c) for c in children.read_text().split()]
                    found += kids
                    todo += kids
        return [p for p in found if _live(p)]
    listed = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid=", "-o", "stat="],
                            capture_output=True, text=True, check=False).stdout
    parents: dict[int, list[int]] = {}
    for row in listed.splitlines():
        fields = row.split()
        if len(fields) == 3 and not fields[2].startswith("Z"):
            parents.setdefault(int(fields[1]), []).append(int(fields[0]))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


class Guard:
    def __init__(self, argv: list[str], parent: int) -> None:
        self.parent = parent
        self.proc = subprocess.Popen(argv, preexec_fn=_task_setup)
        self._lock = threading.Lock()

    def kill_task(self) -> None:
        """SIGKILL every process below the guard, round after round (a process may fork while
        its siblings die), reaping what came back to the guard."""
        with self._lock:
            for _ in range(KILL_ROUNDS):
                below = descendants(os.getpid())
                if not below:
                    return
                for pid in below:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(KILL_ROUND_S)
                with contextlib.suppress(ChildProcessError):
                    while os.waitpid(-1, os.WNOHANG)[0]:  # orphans the guard adopted
                        pass

    def on_signal(self, signum: int, _frame) -> None:
        self.kill_task()
        os._exit(128 + signum)

    def watch_parent(self) -> None:
        """Where no signal tells of the runner's death: its pid stops being our parent."""
        while self.proc.poll() is None:
            if os.getppid() != self.parent:
                self.kill_task()
                os._exit(128 + signal.SIGTERM)
            time.sleep(PARENT_POLL_S)

    def wait(self) -> int:
        code = self.proc.wait()
        self.kill_task()  # what the task left running: a worker pool, a forked reader
        return code if code >= 0 else 128 - code


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -m draslice.local.task_guard PARENT_PID -- COMMAND...",
              file=sys.stderr)
        return 2
    parent = int(args[0])
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the runner died before the line above took effect
        return 128 + signal.SIGTERM
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    for signum in ENDING:  # before the task starts: no window where a signal leaves it behind
        signal.signal(signum, signal.SIG_IGN)
    guard = Guard(args[2:], parent)
    for signum in ENDING:
        signal.signal(signum, guard.on_signal)
    threading.Thread(target=guard.watch_parent, daemon=True).start()
    return guard.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
