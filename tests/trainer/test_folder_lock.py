"""Issue 37, 2: one run at a time in an output (or checkpoint) folder.

Real processes and the kernel's own ``flock``: a holder is another Python process (or a real
``draslice train``), killed with SIGKILL where the case is a run that died.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draslice.errors import InvalidParameter
from draslice.tests.trainer.test_bad_input import _cli, _one_error_line
from draslice.trainer import folder_lock
from draslice.trainer.folder_lock import LOCK_FILE

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
DRASLICE = [sys.executable, "-c", "from draslice.cli import main; main()"]
HOLD = ("import sys, time\n"
        "from draslice.trainer import folder_lock\n"
        "folder_lock.acquire(sys.argv[1], 'output_dir')\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n")


def _holder(folder: Path) -> subprocess.Popen:
    """Another process holding ``folder``'s lock, started and holding when this returns."""
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE,
                            text=True, env=ENV)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _end(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(timeout=60)


def test_a_second_run_is_refused_naming_the_holder_then_takes_over_once_it_is_killed(
        tiny_gpt2, demo_data, tmp_path):
    out = tmp_path / "out"
    holder = _holder(out)
    try:
        refused = _cli(out, tiny_gpt2, demo_data["prompt-completion"])
        _one_error_line(refused, f"invalid output_dir='{out}'", "another run is writing there",
                        f"pid {holder.pid} on host {socket.gethostname()}, started 20",
                        str(out / LOCK_FILE), "wait for it to end")
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing else touched
    finally:
        _end(holder)  # SIGKILL: the kernel drops its flock, its file stays and names it
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == holder.pid
    taken = _cli(out, tiny_gpt2, demo_data["prompt-completion"])
    assert taken.exit_code == 0, taken.output
    assert (f"[lock] {out}: took over the lock of a run that is gone (pid {holder.pid} on host "
            f"{socket.gethostname()}, started ") in taken.output
    assert not (out / LOCK_FILE).exists()  # released when the run ended


def test_two_real_train_commands_into_one_folder(tmp_path):
    """The first `draslice train` keeps running untouched; the second exits 2 naming it."""
    out = tmp_path / "out"
    small = ["--device", "cpu", "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
             "--seq-len", "8", "--batch-size", "2", "--log-every", "100000"]
    first = subprocess.Popen([*DRASLICE, "train", "--output-dir", str(out), "--steps",
                              "1000000", *small], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=ENV)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").stat().st_size:
            assert first.poll() is None and time.monotonic() < deadline, "the first run ended"
            time.sleep(0.05)
        second = subprocess.run([*DRASLICE, "train", "--output-dir", str(out), "--steps", "2",
                                 *small], capture_output=True, text=True, env=ENV, timeout=300)
        assert second.returncode == 2, second
        errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and f"pid {first.pid} on host" in errors[0], second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # still training
    finally:
        _end(first)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines[:-1]]  # the last may be cut by the kill
    assert steps and steps == list(range(1, len(steps) + 1))  # one run's lines, no other's


def test_the_checkpoint_folder_is_locked_too(tiny_gpt2, demo_data, tmp_path):
    shared = tmp_path / "checkpoints"
    holder = _holder(shared)
    try:
        _one_error_line(_cli(tmp_path / "out", tiny_gpt2, demo_data["prompt-completion"],
                             "--checkpoint-dir", str(shared)),
                        f"invalid checkpoint_dir='{shared}'", f"pid {holder.pid}")
    finally:
        _end(holder, signal.SIGTERM)
    assert not (tmp_path / "out").exists()  # the refused run took its own folder back


def test_a_refused_run_leaves_no_lock_in_a_folder_it_did_not_make(tiny_gpt2, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{\n")
    _one_error_line(_cli(out, tiny_gpt2, bad), "bad.jsonl:1: not valid JSON")
    assert list(out.iterdir()) == []


def test_one_process_holds_a_folder_once_and_gives_it_back(tmp_path):
    lines: list[str] = []
    assert folder_lock.acquire(tmp_path, "output_dir", lines.append)
    assert not folder_lock.acquire(tmp_path, "output_dir", lines.append)  # the same run
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    other = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path)], capture_output=True,
                           text=True, env=ENV, timeout=120)
    assert other.returncode == 1 and f"pid {os.getpid()}" in other.stderr
    folder_lock.release(tmp_path)
    assert not (tmp_path / LOCK_FILE).exists() and lines == []


def test_a_lock_file_replaced_while_waiting_is_locked_afresh(tmp_path, monkeypatch):
    """A holder that releases between this run's open and its flock deletes the file this run
    opened, and the next run makes a new one: this run must hold the file at the path."""
    real = folder_lock.fcntl.flock
    calls = {"n": 0}

    def release_meanwhile(fd, how):
        calls["n"] += 1
        if calls["n"] == 1:  # what a finishing holder does, then a third run's new file
            os.unlink(tmp_path / LOCK_FILE)
            (tmp_path / LOCK_FILE).write_text("")
        return real(fd, how)

    monkeypatch.setattr(folder_lock.fcntl, "flock", release_meanwhile)
    try:
        assert folder_lock.acquire(tmp_path, "output_dir")
        fd = folder_lock._held[os.path.realpath(tmp_path)][0]
        assert os.fstat(fd).st_ino == os.stat(tmp_path / LOCK_FILE).st_ino
        assert calls["n"] == 2
    finally:
        folder_lock.release(tmp_path)


def test_a_holder_in_this_process_is_not_a_refusal_but_another_is(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(InvalidParameter, match=f"pid {holder.pid}"):
            folder_lock.acquire(tmp_path, "output_dir")
    finally:
        _end(holder)
    lines: list[str] = []
    assert folder_lock.acquire(tmp_path, "output_dir", lines.append)
    folder_lock.release(tmp_path)
    assert len(lines) == 1 and f"pid {holder.pid}" in lines[0]
