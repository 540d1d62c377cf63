"""Shared test fixtures: repository paths, the shared fixtures folder, a trained adapter."""

from __future__ import annotations

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
