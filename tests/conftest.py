"""Shared test fixtures: repository paths, the shared fixtures folder, a trained adapter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# Real ResourceSlice dumps live in the repository (tests/fixtures/resourceslices, with SOURCES.md),
# so a fresh clone runs every test without anything beside it.
FIXTURES = REPO / "tests" / "fixtures"


def fixture_path(*parts: str) -> Path:
    """The path of a committed fixture; a missing one fails the test naming the file."""
    path = FIXTURES.joinpath(*parts)
    if not path.is_file():
        pytest.fail(f"fixture missing: {path.relative_to(REPO)} (see tests/fixtures/"
                    "resourceslices/SOURCES.md for where each fixture comes from)", pytrace=False)
    return path

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def pytest_configure(config):
    """One intra-op thread in the test process and in every process a test starts (they
    inherit the variable), unless the caller set OMP_NUM_THREADS: the models here are tiny, and
    on a busy 2-core machine OpenMP's threads spin against other processes, so a step of a
    150k-parameter model costs several times the CPU (the demo fine-tune: 22 CPU-s with two
    threads, 6 with one)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """One default (seed-config) SFT run on the CPU, shared by the tests that read its output."""
    from draslice.trainer.config import SFTConfig
    from draslice.trainer.sft import train

    out = tmp_path_factory.mktemp("sft")
    lines: list[str] = []
    result = train(SFTConfig(device="cpu"), out / "adapter", out / "metrics.jsonl",
                   log=lines.append)
    return {"dir": out / "adapter", "metrics": out / "metrics.jsonl", "result": result,
            "lines": lines}
