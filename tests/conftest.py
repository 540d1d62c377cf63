"""Shared test fixtures: repository paths, the shared fixtures folder, a trained adapter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """One default (seed-config) SFT run on the CPU, shared by the tests that read its output."""
    from draslice.trainer.sft import SFTConfig, train

    out = tmp_path_factory.mktemp("sft")
    lines: list[str] = []
    result = train(SFTConfig(device="cpu"), out / "adapter", out / "metrics.jsonl",
                   log=lines.append)
    return {"dir": out / "adapter", "metrics": out / "metrics.jsonl", "result": result,
            "lines": lines}
