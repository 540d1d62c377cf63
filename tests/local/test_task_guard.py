"""A task of ``draslice run`` dies with the runner: real processes, a real SIGKILL.

The runner is a Python process that starts a task under the guard, as kfp.local does through
``local.kfp_fixes``: ``sh``, which forks its commands, and below it a process in the task's
group and one that left it (``setsid``). Killing the runner with SIGKILL must leave none.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from draslice.local import task_guard

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc and relies on PR_SET_PDEATHSIG")


def _gone(pids: list[int], within_s: float) -> list[int]:
    """The pids still alive after ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(task_guard._live(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if task_guard._live(p)]


def _read_pids(path: Path, count: int, within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists() and len(lines := path.read_text().split()) >= count:
            return [int(p) for p in lines]
        time.sleep(0.02)
    raise AssertionError(f"the task did not write {count} pids to {path}")


# The task: sh forks a sleep in its group and one in a session of its own, writes their pids
# and its own, then waits.
TASK = "sleep 60 & echo $! >> {f}; setsid sleep 60 & echo $! >> {f}; echo $$ >> {f}; wait"


@linux_only
def test_a_sigkilled_runner_takes_the_whole_task_with_it(tmp_path):
    pids_file = tmp_path / "pids"
    runner = textwrap.dedent(f"""
        import subprocess, sys
        from draslice.local import task_guard
        cmd = task_guard.command(["sh", "-c", {TASK.format(f=pids_file)!r}])
        print(subprocess.Popen(cmd).pid, flush=True)
        subprocess.Popen(["sleep", "60"]).wait()  # stands for kfp.local's wait
    """)
    proc = subprocess.Popen([sys.executable, "-c", runner], stdout=subprocess.PIPE, text=True)
    guard = int(proc.stdout.readline())
    task = [guard, *_read_pids(pids_file, 3)]
    assert all(task_guard._live(p) for p in task)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _gone(task, within_s=2.0) == []


@linux_only
def test_the_task_dies_even_when_the_guard_is_sigkilled(tmp_path):
    pids_file = tmp_path / "pids"
    guard = subprocess.Popen(task_guard.command(["sh", "-c", TASK.format(f=pids_file)]))
    in_group, other_session, shell = _read_pids(pids_file, 3)
    guard.send_signal(signal.SIGKILL)
    guard.wait()
    try:
        # The shell dies by its PR_SET_PDEATHSIG. What the shell started is orphaned then, and
        # only the guard's own kill would reach it: the kernel's promise is the shell.
        assert _gone([shell], within_s=2.0) == []
    finally:
        for pid in (in_group, other_session):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@linux_only
def test_the_guard_exits_with_the_tasks_code_and_leaves_nothing_behind(tmp_path):
    pids_file = tmp_path / "pids"
    code = subprocess.call(task_guard.command(
        ["sh", "-c", f"sleep 60 & echo $! >> {pids_file}; exit 3"]))
    assert code == 3
    assert _gone(_read_pids(pids_file, 1), within_s=2.0) == []


def test_a_task_killed_by_a_signal_exits_128_plus_it():
    code = subprocess.call(task_guard.command(["sh", "-c", "kill -TERM $$"]))
    assert code == 128 + signal.SIGTERM


def test_the_guard_refuses_a_call_without_the_runners_pid(capfd):
    assert task_guard.main(["--", "true"]) == 2
    assert "usage: python -m draslice.local.task_guard PARENT_PID" in capfd.readouterr().err


@pytest.mark.slow
@linux_only
def test_a_sigkilled_draslice_run_leaves_no_task_running(tmp_path):
    """The whole `draslice run`, killed while its finetune task trains."""
    draslice = Path(sys.executable).with_name("draslice")
    proc = subprocess.Popen([str(draslice), "run", "--device", "cpu", "--steps", "2000",
                             "--runs-dir", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("[slice] device="):  # the finetune task is in its loop
            break
    else:
        pytest.fail(f"draslice run ended (exit {proc.wait()}) before its finetune task started")
    below = task_guard.descendants(proc.pid)
    assert len(below) >= 3, below  # guard, sh, the task's python
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _gone(below, within_s=1.0) == []
