"""Every per-step figure is measured: a step's seconds are its own, read late or not, and the
tokens/s recorded are its tokens over those seconds (the last step once showed 1.3-1.5 M
tokens/s, taken between two host reads that came back to back)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from draslice.trainer import distributed, sft
from draslice.trainer.config import SFTConfig
from draslice.trainer.measure import StepReader

SLACK = 0.5  # seconds a busy 2-core CI host may add to a sleep


def _run_steps(reader: StepReader, durations: list[float], flush_at=(), pause=0.0) -> list:
    """Steps of known length pushed through ``reader`` as the loop does; flushed at the
    steps in ``flush_at`` and the last, then ``pause`` seconds of non-training work."""
    figures = []
    last = len(durations)
    for step, seconds in enumerate(durations, start=1):
        reader.begin()
        time.sleep(seconds)
        done = reader.push(step, torch.tensor(float(step)), tokens=1000 * step, lr=0.1)
        if step in flush_at or step == last:
            done += reader.flush()
            time.sleep(pause)
        figures += done
    return figures


@pytest.mark.parametrize("lagged", [True, False], ids=["read-one-step-late", "read-at-once"])
def test_each_step_is_timed_by_its_own_span_the_last_one_too(lagged):
    durations = [0.05, 0.15, 0.05, 0.25]
    figures = _run_steps(StepReader(torch.device("cpu"), lagged=lagged), durations,
                         flush_at={2}, pause=0.3)
    assert [f.step for f in figures] == [1, 2, 3, 4]
    assert [f.loss for f in figures] == [1.0, 2.0, 3.0, 4.0]
    for f, slept in zip(figures, durations, strict=True):
        # The 0.3 s pause after the flush at step 2 is not step 3's time.
        assert slept <= f.seconds < slept + SLACK, (f.step, f.seconds, slept)
        assert f.tokens_per_s == pytest.approx(f.tokens / f.seconds)
        assert f.tokens_per_s <= f.tokens / slept


def test_a_lagged_reader_returns_the_previous_step_and_flush_the_rest():
    reader = StepReader(torch.device("cpu"), lagged=True)
    reader.begin()
    assert reader.push(1, torch.tensor(1.0), 10, 0.1) == []
    reader.begin()
    assert [f.step for f in reader.push(2, torch.tensor(2.0), 10, 0.1)] == [1]
    assert [f.step for f in reader.flush()] == [2]
    assert reader.flush() == []


def test_recorded_tokens_per_s_are_the_measured_step_times(tmp_path, monkeypatch):
    """A run whose every step takes at least 0.1 s: no step, the last included, may claim
    more than its tokens over 0.1 s, and the run's figure is the steps' own total."""
    real_loss = distributed.causal_lm_loss  # what each step calls, alone or under DDP

    def slow_loss(model, batch):
        time.sleep(0.1)
        return real_loss(model, batch)

    monkeypatch.setattr(distributed, "causal_lm_loss", slow_loss)
    cfg = SFTConfig.from_params({"steps": 4, "log_every": 2, "device": "cpu", "n_layer": 1,
                                 "n_embd": 64, "n_head": 2, "seq_len": 16})
    result = sft.train(cfg, tmp_path / "out", tmp_path / "m.jsonl", log=lambda _line: None)
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert 0.1 <= r["step_seconds"] < 0.1 + SLACK + 2.0, r
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["step_seconds"])
        assert r["tokens_per_s"] <= r["tokens"] / 0.1
    assert result.train_seconds == pytest.approx(sum(r["step_seconds"] for r in records))
    assert result.train_tokens == sum(r["tokens"] for r in records)
    steady = [r for r in records if r["step"] >= result.steady_from_step]
    assert result.steady_from_step >= 2  # the first step is warm-up
    assert result.tokens_per_s == pytest.approx(sum(r["tokens"] for r in steady)
                                                / sum(r["step_seconds"] for r in steady))
    assert result.warmup_seconds == pytest.approx(sum(
        r["step_seconds"] for r in records if r["step"] < result.steady_from_step))
