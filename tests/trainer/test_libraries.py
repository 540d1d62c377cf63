"""trainer/libraries.py: the trainer keeps the Hub offline and drops two library lines."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from draslice.trainer import libraries

PROBE = ("import draslice.trainer, peft, huggingface_hub.constants as c, os; "
         "print(os.environ['HF_HUB_OFFLINE'], c.HF_HUB_OFFLINE)")


@pytest.mark.parametrize(("given", "expected"), [(None, "1 True"), ("0", "0 False")],
                         ids=["unset", "the user's own"])
def test_the_hub_is_offline_unless_the_environment_says(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    if given is not None:
        env["HF_HUB_OFFLINE"] = given
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == expected
    # whatever this CPU is, importing peft through the trainer says nothing of bitsandbytes'
    # CPU kernel (logged only on CPUs with AVX512-BF16)
    assert "gemm_4bit_forward" not in done.stderr
    assert "publisher trust" not in done.stderr


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
