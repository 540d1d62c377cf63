"""The architecture contracts of `make lint` (``[tool.importlinter]`` in pyproject.toml) hold on
this tree and fail on a wrong arrow.

Each case copies the package (its Python files and pyproject.toml) into a temporary folder,
adds one wrong import and runs import-linter's own ``lint-imports`` on the copy, which is put
first on the child's ``PYTHONPATH`` so that ``draslice`` resolves to it and not to this
checkout. The unchanged copy is the control: it passes, so each failure comes from the arrow
the case added.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from draslice.tests.conftest import REPO

# The root folders a copy leaves out: those without the package's code, and the test and benchmark
# trees, which sit above every layer and import whatever they check.
_NOT_COPIED = {"tests", "benchmarks", "docs", "compiled", "manifests", "scripts", "build",
               "dist", "runs"}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# (case, {file in the copy: text appended or written}, words the failure must print)
WRONG_ARROWS = [
    ("a component imports a pipeline",
     {"components/__init__.py": "from draslice.pipelines import variants\n"},
     ["BROKEN", "draslice.components is not allowed to import draslice.pipelines"]),
    ("the trainer imports the cluster package",
     {"trainer/__init__.py": "from draslice.cluster import names\n"},
     ["BROKEN", "draslice.trainer is not allowed to import draslice.cluster"]),
    ("the errors module imports the CLI",
     {"errors.py": "import draslice.cli\n"},
     ["BROKEN", "draslice.errors is not allowed to import draslice.cli"]),
    ("the trainer imports the KFP SDK",
     {"trainer/__init__.py": "import kfp.dsl\n"},
     ["BROKEN", "draslice.trainer is not allowed to import kfp"]),
    ("the trainer imports the Kubernetes client",
     {"trainer/__init__.py": "from kubernetes import client\n"},
     ["BROKEN", "draslice.trainer is not allowed to import kubernetes"]),
    ("two trainer modules import each other",
     {"trainer/cycle_a.py": "from draslice.trainer import cycle_b\n",
      "trainer/cycle_b.py": "from draslice.trainer import cycle_a\n"},
     ["BROKEN", "No cycles are allowed in draslice.trainer", ".cycle_"]),
]


def _copy(tmp_path: Path) -> Path:
    package = tmp_path / "site" / "draslice"
    shutil.copytree(REPO, package, ignore=lambda folder, names: [
        n for n in names if n.startswith(".") or n == "__pycache__"
        or (Path(folder) == REPO and n in _NOT_COPIED)
        or (Path(folder, n).is_file() and not n.endswith(".py") and n != "pyproject.toml")])
    return package


def _lint(package: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo",
                           str(package / "pyproject.toml")], cwd=package.parent, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_contracts_hold_on_this_tree():
    done = subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """One copy, checked unchanged (the control), that each case copies again."""
    package = _copy(tmp_path_factory.mktemp("pristine"))
    done = _lint(package)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
    return package


@pytest.mark.parametrize(("case", "edits", "words"), WRONG_ARROWS, ids=[c[0] for c in WRONG_ARROWS])
def test_a_wrong_arrow_breaks_the_lint(case, edits, words, pristine, tmp_path):
    package = tmp_path / "site" / "draslice"
    shutil.copytree(pristine, package)
    for name, text in edits.items():
        path = package / name
        path.write_text((path.read_text() if path.exists() else "") + text)
    done = _lint(package)
    assert done.returncode == 1, f"{case}: lint-imports passed\n{done.stdout[-3000:]}"
    for word in words:
        assert word in done.stdout, f"{case}: {word!r} not in\n{done.stdout[-3000:]}"
