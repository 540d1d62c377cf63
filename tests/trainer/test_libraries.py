"""trainer/libraries.py: the draslice command runs offline; the command and the components
drop library lines where they start, and importing the trainer changes nothing."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from draslice.cli import main
from draslice.trainer import libraries

# Print, for each logger libraries.settle() filters, how many filters it has.
FILTERS = ("import logging; from draslice.trainer import libraries; "
           "print([len(logging.getLogger(n).filters) for n in libraries.DROPPED])")


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in libraries.OFFLINE}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_importing_the_trainer_changes_neither_logging_nor_the_environment():
    """A notebook that imports the trainer (peft with it) keeps its own settings."""
    done = _python("import os, draslice.trainer.sft, draslice.trainer.tasks.validate; "
                   "print(os.environ.get('HF_HUB_OFFLINE', 'unset')); " + FILTERS)
    assert done.stdout.split("\n")[-3:-1] == ["unset", str([0] * len(libraries.DROPPED))]


def test_the_command_drops_the_lines_before_peft_loads():
    """The bitsandbytes lines (logged only on CPUs with AVX512-BF16) are gone after the
    command starts, whatever this CPU is: each named logger has its filter."""
    done = _python("from draslice.cli import main\ntry:\n"
                   "    main(['smoke', '--device', 'cpu', '--matmul-size', '64'])\n"
                   "except SystemExit as end:\n    assert end.code == 0, end.code\n"
                   "import peft; " + FILTERS)
    assert done.stdout.split("\n")[-2] == str([1] * len(libraries.DROPPED))
    assert "gemm_4bit_forward" not in done.stderr
    assert "publisher trust" not in done.stderr


@pytest.mark.parametrize("call", [
    "finetune.python_func(adapter=None, train_log=None, metrics=None, model_dir='m', "
    "base_model=object())",
    "validate.python_func(adapter=None, train_log=None, slice_total_mem_gib=1.0, "
    "peak_mem_gib=1.0, device_json='not json', claim_template='t', claim_mode='policy', "
    "metrics=None, report=None, summary=None)",
], ids=["finetune", "validate"])
def test_a_component_drops_the_lines_where_it_starts(call):
    """Each component that imports peft settles the libraries first: the call here stops at
    its first check of the inputs, after that."""
    done = _python("from draslice.components.finetune import finetune; "
                   "from draslice.components.validate import validate\n"
                   f"try:\n    {call}\nexcept Exception as err:\n    print(type(err).__name__)\n"
                   + FILTERS)
    assert done.stdout.split("\n")[-2] == str([1] * len(libraries.DROPPED))
    assert done.stdout.split("\n")[-3] in ("InvalidParameter", "JSONDecodeError")


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
