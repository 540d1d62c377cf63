"""What the training loop measures, and how it reads it without stalling the GPU.

Each step's loss and duration are read one step late on a GPU (:class:`StepReader`): the host
queues step N+1 before it waits for step N, so the GPU never idles while the host learns a
figure. Every figure is measured: a step's seconds are the span between two marks on the
device's own timeline (CUDA events; on the CPU, where a step is done when its call returns,
the host clock), never the time between two host reads, which collapses when two reads come
back to back (the last step read 1.3-1.5 million tokens/s that way).
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

from draslice.errors import TrainingDiverged
from draslice.trainer import device as dev
from draslice.trainer import loglines, outputs
from draslice.trainer.data.examples import TokenRows
from draslice.trainer.speed.loss import to_device


@dataclass(frozen=True)
class StepFigures:
    """One finished step, as measured."""

    step: int
    loss: float
    seconds: float
    """From the end of the previous step (or this step's start, after a pause) to its end."""
    tokens: int
    lr: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


class _HostMark:
    """A point in time on the CPU, where work is done when its call returns."""

    def __init__(self) -> None:
        self.t = time.perf_counter()

    def wait(self) -> None:
        pass

    def seconds_since(self, earlier: _HostMark) -> float:
        return self.t - earlier.t


class _CudaMark:
    """A point on the GPU's timeline: a timing event queued behind the work before it."""

    def __init__(self) -> None:
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record()

    def wait(self) -> None:
        self.event.synchronize()

    def seconds_since(self, earlier: _CudaMark) -> float:
        return earlier.event.elapsed_time(self.event) / 1000.0


@dataclass
class _Pending:
    step: int
    loss: torch.Tensor
    tokens: int
    lr: float
    start: _HostMark | _CudaMark
    end: _HostMark | _CudaMark


class StepReader:
    """Reads each step's loss and duration, one step late where that keeps the GPU busy.

    On a GPU the loss is copied into pinned host memory behind the step that produced it and
    a timing event marks the step's end; reading waits for that event only, while the next
    step's kernels are already queued (``loss.item()`` would wait for everything queued, next
    step included). On the CPU there is nothing to overlap: a step is read as it ends.
    """

    def __init__(self, device: torch.device, lagged: bool | None = None) -> None:
        on_cuda = device.type == "cuda"
        self.lag = 1 if (on_cuda if lagged is None else lagged) else 0
        self._mark = _CudaMark if on_cuda else _HostMark
        self._buffers = [torch.zeros((), dtype=torch.float32, pin_memory=on_cuda)
                         for _ in range(2)]
        self._queued: deque[_Pending] = deque()
        self._last_end: _HostMark | _CudaMark | None = None
        self._start: _HostMark | _CudaMark | None = None

    def begin(self) -> None:
        """A step starts. It is timed from the previous step's end, so the host's work between
        steps counts; after :meth:`flush` (evaluation, a checkpoint), from here."""
        self._start = self._mark() if self._last_end is None else self._last_end

    def push(self, step: int, loss: torch.Tensor, tokens: int, lr: float) -> list[StepFigures]:
        """Queue this step's loss; return the steps now finished (on a GPU the previous one,
        on the CPU this one). On a GPU this waits for the previous step: the loop's one sync."""
        value = self._buffers[step % 2]
        value.copy_(loss.detach(), non_blocking=True)
        end = self._mark()
        self._queued.append(_Pending(step, value, tokens, lr, self._start, end))
        self._last_end = end
        done = []
        while len(self._queued) > self.lag:
            done.append(self._read(self._queued.popleft()))
        return done

    def flush(self) -> list[StepFigures]:
        """Wait for every queued step and return them; the next step is timed from its own
        start, so whatever the host does now (evaluate, checkpoint) is not training time."""
        done = [self._read(p) for p in list(self._queued)]
        self._queued.clear()
        self._last_end = None
        return done

    @staticmethod
    def _read(p: _Pending) -> StepFigures:
        p.end.wait()
        return StepFigures(p.step, float(p.loss), p.end.seconds_since(p.start), p.tokens, p.lr)


WARMUP_FACTOR = 2.0
"""A step is warm-up while it takes more than this many times the run's median seconds per
token (:func:`steady_from`)."""


@dataclass(frozen=True)
class Speed:
    """A run's speed as three separate figures, so a short run's rate is not its warm-up's.

    The first steps of a process carry one-off work: torch.compile's compilation, a CUDA
    graph's capture, cuBLAS's and the allocator's first calls. On an H100 a 40-step run of a
    1.5B model showed 15,151 tokens/s over all its steps where its steady rate was above
    34,000 (the same command with 80 steps: 34,496).
    """

    tokens_per_s: float
    """Steady rate: the tokens of the steps after warm-up over their seconds; with no step
    after warm-up (a one-step run), the rate over every step (``steady_from_step`` None)."""
    steady_from_step: int | None
    warmup_seconds: float
    """The warm-up steps' seconds (compilation, capture and first calls inside them)."""
    wall_seconds: float
    """From the start of the run (input checks, model load) to its last step's end: warm-up,
    steps, evaluation and checkpoints included; the final save not."""


def steady_from(figures: list[StepFigures]) -> int:
    """Index of the first steady step of a process's ``figures``: the first step is always
    warm-up, and so is each step right after it that took more than :data:`WARMUP_FACTOR`
    times the median seconds per token (a recompilation at step 2 of unpacked rows, say). Per
    token, so that rows of another width are no warm-up; ``len(figures)`` when none is steady."""
    if len(figures) < 2:
        return len(figures)
    per_token = [f.seconds / max(f.tokens, 1) for f in figures]
    median = sorted(per_token)[len(per_token) // 2]
    index = 1
    while index < len(figures) and per_token[index] > WARMUP_FACTOR * median:
        index += 1
    return index


def speed(figures: list[StepFigures], wall_seconds: float) -> Speed:
    """The :class:`Speed` of a process's finished steps."""
    cut = steady_from(figures)
    steady = figures[cut:] or figures
    seconds = sum(f.seconds for f in steady)
    return Speed(tokens_per_s=sum(f.tokens for f in steady) / seconds if seconds else 0.0,
                 steady_from_step=figures[cut].step if cut < len(figures) else None,
                 warmup_seconds=sum(f.seconds for f in figures[:cut]),
                 wall_seconds=wall_seconds)


class Progress:
    """The run's record as steps finish: losses, one JSON line per step, the log lines.

    The last step's line also carries the run's :class:`Speed` (its fields, the rate as
    ``steady_tokens_per_s``): every line keeps one schema, and what reads the file for the
    steps (the report, ``draslice run``'s bar) reads it as before."""

    def __init__(self, path: Path | None, start_step: int, losses: list[float], log_every: int,
                 last_step: int, device: torch.device, log, learning_rate: float,
                 started: float | None = None) -> None:
        """``path`` None: a process that records but writes nothing (not rank 0);
        ``started``: the ``time.perf_counter()`` the run began at (default: now)."""
        if path is not None:
            outputs.keep_metrics_until(path, start_step)
        self.path = path
        self.first, self.last, self.every = start_step + 1, last_step, log_every
        self.losses, self.device, self.log, self.learning_rate = losses, device, log, learning_rate
        self.started = time.perf_counter() if started is None else started
        self.train_seconds = 0.0
        self.train_tokens = 0
        self.eval_loss: float | None = None
        self.figures: list[StepFigures] = []
        self.speed: Speed | None = None

    def logged(self, step: int) -> bool:
        """Steps that print a line (and measure the eval loss): every ``log_every``, the first
        and the last."""
        return step % self.every == 0 or step in (self.first, self.last)

    def add(self, f: StepFigures, eval_loss: float | None = None) -> None:
        """Record a finished step; stop the run if its loss is not finite."""
        if not math.isfinite(f.loss):
            raise TrainingDiverged(
                f"loss became {f.loss} at step {f.step}; training stopped. Lower learning_rate "
                f"(now {self.learning_rate}), add warmup_steps or use precision=fp32."
            )
        self.losses.append(f.loss)
        self.train_seconds += f.seconds
        self.train_tokens += f.tokens
        self.figures.append(f)
        peak = dev.peak_memory_bytes(self.device)
        record = {
            "step": f.step, "loss": f.loss, "tokens": f.tokens, "step_seconds": f.seconds,
            "tokens_per_s": f.tokens_per_s, "peak_mem_gib": loglines.gib(peak),
            "mem_gib": loglines.gib(torch.cuda.memory_allocated(self.device)
                                    if self.device.type == "cuda" else peak),
            "lr": f.lr,
        }
        if eval_loss is not None:
            record["eval_loss"] = self.eval_loss = eval_loss
        if f.step == self.last:
            self.speed = speed(self.figures, time.perf_counter() - self.started)
            record.update(speed_record(self.speed))
        if self.path is not None:
            with self.path.open("a") as metrics:  # on disk as each step ends: a kill keeps it
                metrics.write(json.dumps(record) + "\n")
        if self.logged(f.step):
            self.log(loglines.step_loss(f.step, f.loss, f.tokens_per_s))
            if eval_loss is not None:
                self.log(loglines.eval_loss(f.step, eval_loss))
        if self.speed is not None and f.step == self.last:
            self.log(loglines.speed(self.speed.tokens_per_s, self.speed.steady_from_step,
                                    self.first, self.last, self.speed.warmup_seconds,
                                    self.speed.wall_seconds))


# The :class:`Speed` on the last metrics line: the step's own rate keeps ``tokens_per_s``,
# so the run's is ``steady_tokens_per_s``.
SPEED_KEYS = ("steady_tokens_per_s", "steady_from_step", "warmup_seconds", "wall_seconds")


def speed_record(found: Speed) -> dict:
    return dict(zip(SPEED_KEYS, (found.tokens_per_s, found.steady_from_step,
                                 found.warmup_seconds, found.wall_seconds), strict=True))


def speed_of(records: list[dict]) -> dict | None:
    """The run's speed from its metrics lines (the last one's :func:`speed_record`), or None
    for a file written before these figures."""
    last = records[-1] if records else {}
    return {k: last.get(k) for k in SPEED_KEYS} if SPEED_KEYS[0] in last else None


def evaluate(step, rows: TokenRows, batch_size: int, device: torch.device, autocast) -> float:
    """Mean token loss over every labelled eval token. ``step`` is the step's loss module
    (``distributed.StepLoss``; FSDP2's root when sharded, which gathers the weights: every
    process then calls it alike)."""
    was_training = step.training
    step.eval()
    total, count = 0.0, 0
    with torch.no_grad(), autocast:
        for start in range(0, len(rows), batch_size):
            batch = to_device(rows.collate(range(start, min(start + batch_size, len(rows)))),
                              device)
            total += float(step(batch)) * batch.count
            count += batch.count
    step.train(was_training)
    return total / count if count else float("nan")
