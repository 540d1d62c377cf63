"""What ``draslice run`` shows while kfp.local runs the pipeline, and the full log it keeps.

kfp.local prints everything to ``sys.stdout`` of this process: its own log records (a
``logging.StreamHandler(sys.stdout)`` it installs per task), and each task subprocess's output,
which it reads line by line and ``print``s. So the run swaps ``sys.stdout`` for a
:class:`RunOutput` while the pipeline runs: every byte goes to the run folder's log file, and
the console gets one line per task start and end, the lines users grep
(``loglines.is_greppable``), the fine-tune's progress, and, when a task fails, its reason,
parsed from that task's traceback (the exception class names the exit code, see
:func:`failure_of`). Warnings (kfp's "non-Python base image") go to the log file too.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from draslice import errors
from draslice.trainer import loglines

LOG_FILE = "kfp-local.log"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# kfp.local 2.17's own log records (kfp/local/task_dispatcher.py, enhanced_dag_orchestrator.py).
_STARTED = re.compile(r"Executing task '([^']+)'")
_FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
_SKIPPED = re.compile(r"Skipping (?:conditional )?task (\S+?):? (.*)")
BAR_WIDTH = 24
POLL_S = 0.5


@dataclass
class TaskFailure:
    """Why a task failed, as its own traceback says."""

    task: str
    reason: str
    exit_code: int

    def __str__(self) -> str:
        """The run's last line for it (``run`` and ``run --sweep``)."""
        return f"task {self.task} FAILED (exit {self.exit_code}): {self.reason}"


@dataclass
class _Task:
    name: str
    start: float
    lines: list[str] = field(default_factory=list)


def failure_of(task: str, lines: list[str]) -> TaskFailure:
    """The reason and exit code of a task whose output is ``lines``.

    The last exception line after the last ``Traceback`` is the one that ended the task (with
    chained exceptions it is the outermost, ours). A :class:`~draslice.errors.DrasliceError`
    subclass, of ``errors`` or of any ``draslice`` module (``SnapshotError``,
    ``ClusterAccessError``), gives its documented exit code and its message alone; any other
    exception is a bug: exit code 1.
    """
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")),
                default=None)
    if start is None:  # no traceback: the task's last words
        tail = [line.strip() for line in lines if line.strip()][-1:]
        return TaskFailure(task, tail[0] if tail else f"no output (see {LOG_FILE})", 1)
    # The frames are indented; the first line that is not names the exception.
    last = next((line for line in lines[start + 1:] if line and not line.startswith(" ")),
                "")
    qualified, _, message = last.partition(": ")
    module_name, _, name = qualified.rpartition(".")
    cls = _draslice_class(module_name, name) or getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.DrasliceError):
        return TaskFailure(task, message.strip() or name, cls.exit_code)
    return TaskFailure(task, last.strip() or "a traceback without an exception line", 1)


def _draslice_class(module_name: str, name: str) -> type | None:
    """The class a traceback names as ``draslice.<module>.<name>``; None for another
    package's (nothing outside draslice is imported for it) or a name that is not there."""
    if module_name != "draslice" and not module_name.startswith("draslice."):
        return None
    try:
        return getattr(importlib.import_module(module_name), name, None)
    except ImportError:
        return None


class RunOutput(io.TextIOBase):
    """A ``sys.stdout`` stand-in: all of it to ``log``, the short story to ``console``.

    ``total_steps`` sizes the fine-tune's progress bar; the bar is drawn only on a terminal
    (elsewhere the trainer's own step lines, one every ``log_every`` steps, are the progress).
    """

    def __init__(self, log: TextIO, console: TextIO, run_dir: Path, total_steps: int,
                 verbose: bool = False, bar: bool | None = None) -> None:
        super().__init__()
        self.log, self.console, self.run_dir = log, console, run_dir
        self.total_steps, self.verbose = total_steps, verbose
        self.bar = (console.isatty() if bar is None else bar) and not verbose
        self.tasks: dict[str, _Task] = {}
        self.finished: list[tuple[str, str, float]] = []
        self.failures: list[TaskFailure] = []
        self._partial = ""
        self._current: _Task | None = None
        self._lock = threading.Lock()
        self._bar_text = ""
        self._stop_bar: threading.Event | None = None

    # -- the file protocol kfp.local and print() use --------------------------------------
    def write(self, text: str) -> int:
        if self.log.closed:  # a logging handler kfp.local left holding this stream after the run
            return len(text)
        self.log.write(text)
        if self.verbose:
            self.console.write(text)
        self._partial += text
        *complete, self._partial = self._partial.split("\n")
        for line in complete:
            self._line(_ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        if not self.log.closed:
            self.log.flush()
        self.console.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return "utf-8"

    # -- what the console shows ------------------------------------------------------------
    def say(self, line: str) -> None:
        """A line on the console (not in verbose mode, where kfp's stream is shown as is)."""
        if self.verbose:
            return
        with self._lock:
            if self._bar_text:
                self.console.write("\r\x1b[K")
            self.console.write(line + "\n")
            if self._bar_text:
                self.console.write(self._bar_text)
            self.console.flush()

    def _line(self, line: str) -> None:
        if match := _STARTED.search(line):
            self._start(match.group(1))
        elif match := _FINISHED.search(line):
            self._end(match.group(1), match.group(2))
        elif (match := _SKIPPED.search(line)) and " - INFO - " in line:
            self.say(loglines.task_skipped(match.group(1), match.group(2).rstrip(".").strip("()")))
        elif self._current is not None:
            text = line[4:] if line.startswith("    ") else line  # kfp indents task output
            self._current.lines.append(text)
            if loglines.is_progress(text) and self.bar:
                return  # the bar shows it
            if loglines.is_greppable(text):
                self.say(text)

    def _start(self, name: str) -> None:
        self._current = self.tasks[name] = _Task(name, time.perf_counter())
        self.say(loglines.task_started(name))
        if self.bar and name == "finetune":
            self._stop_bar = threading.Event()
            threading.Thread(target=self._draw_bar, args=(self._stop_bar,), daemon=True).start()

    def _end(self, name: str, status: str) -> None:
        task = self.tasks.get(name) or _Task(name, time.perf_counter())
        seconds = time.perf_counter() - task.start
        if self._stop_bar is not None:
            self._stop_bar.set()
            self._stop_bar = None
            with self._lock:
                if self._bar_text:  # the bar's last state stays as a line
                    self.console.write("\n")
                    self._bar_text = ""
        self.finished.append((name, status, seconds))
        self.say(loglines.task_finished(name, status, seconds))
        if status != "SUCCESS":
            self.failures.append(failure_of(name, task.lines))
        self._current = None

    def close(self) -> None:
        """The run is over. With ``raise_on_error`` kfp.local raises at a failed task instead
        of logging its end, so a task still open here is the one that failed."""
        if self._partial:
            self.write("\n")
        if self._current is not None:
            self._end(self._current.name, "FAILURE")

    def _draw_bar(self, stop: threading.Event) -> None:
        """Redraw the fine-tune's bar from its per-step metrics file, which it appends to as
        each step ends (``trainer/measure.py``)."""
        while not stop.wait(POLL_S):
            found = sorted(self.run_dir.glob("*/finetune/train_log"))
            if not found:
                continue
            try:
                rows = found[-1].read_text().splitlines()
                last = json.loads(rows[-1]) if rows else None
            except (OSError, ValueError):
                continue  # a line half-written right now: the next poll reads it whole
            if last is None:
                continue
            done = min(int(last["step"]), self.total_steps)
            filled = BAR_WIDTH * done // max(self.total_steps, 1)
            text = (f"finetune [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                    f"step {done}/{self.total_steps}  loss {last['loss']:.4f}  "
                    f"{last['tokens_per_s']:,.0f} tokens/s")
            with self._lock:
                if stop.is_set():
                    return
                self._bar_text = text
                self.console.write("\r\x1b[K" + text)
                self.console.flush()


@contextlib.contextmanager
def captured(output: RunOutput) -> Iterator[RunOutput]:
    """kfp.local's stdout and Python warnings go through ``output`` (warnings: to its log
    only, unless verbose) for the time of the run."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    with contextlib.redirect_stdout(output), warnings.catch_warnings():
        if not output.verbose:
            def to_log(message, category, filename, lineno, file=None, line=None) -> None:
                output.log.write(warnings.formatwarning(message, category, filename, lineno,
                                                        line))

            warnings.showwarning = to_log
        try:
            yield output
        finally:
            output.close()
            for handler in set(root.handlers) - set(handlers):  # bound to ``output``: it ends here
                if getattr(handler, "stream", None) is output:
                    root.removeHandler(handler)
    sys.stdout.flush()
