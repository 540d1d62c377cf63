"""trainer/libraries.py: the draslice command runs offline; the trainer drops library lines."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from draslice.cli import main
from draslice.trainer import libraries

PROBE = ("import draslice.trainer, peft, os; "
         "print(os.environ.get('HF_HUB_OFFLINE', 'unset'))")


def test_importing_the_trainer_drops_the_lines_and_leaves_the_environment():
    """A notebook that imports the trainer keeps its own Hub settings; the bitsandbytes lines
    (logged only on CPUs with AVX512-BF16) are gone whatever this CPU is."""
    env = {k: v for k, v in os.environ.items() if k not in libraries.OFFLINE}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "unset"
    assert "gemm_4bit_forward" not in done.stderr
    assert "publisher trust" not in done.stderr


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("0", "0")],
                         ids=["unset", "the user's own"])
def test_the_command_runs_offline_unless_the_environment_says(monkeypatch, given, expected):
    for name in libraries.OFFLINE:
        monkeypatch.delenv(name, raising=False)
    if given is not None:
        monkeypatch.setenv("HF_HUB_OFFLINE", given)
    result = CliRunner().invoke(main, ["smoke", "--device", "cpu", "--matmul-size", "64"])
    assert result.exit_code == 0, result.output
    assert os.environ["HF_HUB_OFFLINE"] == expected
    assert os.environ["TRANSFORMERS_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"


def test_only_the_named_lines_are_dropped(caplog):
    libraries.settle()
    libraries.settle()  # idempotent: one filter a logger
    for name, prefix in libraries.DROPPED.items():
        logger = logging.getLogger(name)
        assert sum(isinstance(f, libraries._DropLine) for f in logger.filters) == 1
        with caplog.at_level(logging.WARNING, logger=name):
            caplog.clear()
            logger.warning(prefix + ": the rest of the line")
            logger.warning("Some other warning")
        assert [r.getMessage() for r in caplog.records] == ["Some other warning"]
