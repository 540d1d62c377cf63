"""The package tree is the folder tree: from the repository root, every importable module's
dotted name is its file's path (``draslice.trainer.sft`` -> ``trainer/sft.py``), and the
wheel carries exactly those packages."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

from draslice.tests.conftest import REPO

# Folders at the root that are not part of the draslice package (pyproject.toml says why).
OUTSIDE = {"tests", "benchmarks", "scripts", "compiled", "manifests", "docs", "build", "dist"}


def _package_dirs() -> list[Path]:
    """The root and every folder under it reached through folders holding __init__.py."""
    found, todo = [], [REPO]
    while todo:
        folder = todo.pop()
        found.append(folder)
        todo += [d for d in sorted(folder.iterdir())
                 if d.is_dir() and (d / "__init__.py").is_file()
                 and not (folder == REPO and d.name in OUTSIDE)]
    return found


def _dotted(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("draslice", *parts))


def test_draslice_is_this_checkout():
    assert Path(importlib.util.find_spec("draslice").origin) == REPO / "__init__.py"


def test_the_checkout_imports_only_as_draslice(request):
    """pytest adds nothing to sys.path (no ``pythonpath``): with the repository root on it,
    ``trainer``, ``cluster`` or ``tests`` would import as top-level modules beside
    ``draslice.*`` and one file could run twice as two modules. The tests import this checkout
    through the editable install only."""
    assert request.config.getini("pythonpath") == []
    top = {p.stem if p.suffix == ".py" else p.name for p in REPO.iterdir()
           if (p.suffix == ".py" or (p / "__init__.py").is_file())
           and p.stem not in ("__init__", "__main__")}
    assert {"trainer", "cluster", "errors", "tests", "benchmarks"} <= top  # the walk saw them
    assert not [p for p in sys.path if Path(p or ".").resolve() == REPO], sys.path
    # pytest names the files it collects after the rootdir's folder ("main.tests.conftest"), or,
    # where that folder is no identifier (a clone in "ci-clone"), as "tests.*": its own doing,
    # not an import of this checkout by a bare name
    bare = (top - {"tests"}) & set(sys.modules)
    assert not bare, f"imported by a bare name: {sorted(bare)}"


def test_every_modules_dotted_name_is_its_path():
    modules = [f for d in _package_dirs() for f in sorted(d.glob("*.py"))]
    assert len(modules) > 50  # the walk found the tree, not just the root
    wrong = {}
    for path in modules:
        spec = importlib.util.find_spec(_dotted(path))
        if spec is None or Path(spec.origin) != path:
            wrong[_dotted(path)] = spec and spec.origin
    assert not wrong, f"dotted name does not lead to its file: {wrong}"


def test_no_python_folder_is_left_out_of_the_package():
    """A folder of modules inside the package without __init__.py would not be importable
    under its path (nor shipped): every one has it."""
    inside = [d for d in REPO.iterdir() if d.is_dir() and d.name not in OUTSIDE
              and not d.name.startswith((".", "_"))]
    for top in inside:
        for folder in [top, *[p for p in top.rglob("*") if p.is_dir()]]:
            if "__pycache__" in folder.parts or not any(folder.glob("*.py")):
                continue
            assert (folder / "__init__.py").is_file(), folder.relative_to(REPO)


def test_the_wheel_ships_exactly_the_package_tree():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"draslice": "."}
    assert sorted(config["packages"]) == sorted(_dotted(d / "__init__.py")
                                                for d in _package_dirs())


def test_docs_layout_names_every_trainer_module():
    """docs/layout.md is where a newcomer looks for the module to change: a trainer module it
    does not name is one they will not find."""
    listed = (REPO / "docs" / "layout.md").read_text()
    trainer = REPO / "trainer"
    names = []
    for path in sorted(trainer.rglob("*.py")):
        rel = path.relative_to(trainer)
        if "__pycache__" in rel.parts or rel == Path("__init__.py"):
            continue
        # a subpackage's __init__ is named by its folder (`speed/`), a module by its path
        names.append(f"{rel.parent.as_posix()}/" if rel.name == "__init__.py" else rel.as_posix())
    missing = [name for name in names if f"`{name}`" not in listed]
    assert not missing, f"add them to docs/layout.md's trainer table: {missing}"
