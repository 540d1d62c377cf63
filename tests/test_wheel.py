"""The closest to the trainer image without a container engine: build the wheel, install it
into a fresh virtualenv, and run a component from there — not from the source tree."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO)],
        check=True,
    )
    (path,) = out.glob("draslice-*.whl")
    return path


def test_wheel_carries_every_package_and_no_tests(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("draslice/cli/__init__.py", "draslice/errors.py", "draslice/trainer/sft.py",
                   "draslice/components/smoke/component.py",
                   "draslice/components/sft/component.py",
                   "draslice/pipelines/claim.py", "draslice/cluster/names.py"):
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "draslice/tests/", "draslice/benchmarks/"))
                   for n in names)


def test_component_runs_from_the_installed_wheel(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True)
    # The heavy dependencies (torch, kfp, ...) come from this test's environment by path;
    # draslice itself only from the wheel (a .pth adds directories, not editable finders).
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True).stdout
    deps = [p for p in sys.path if p.endswith("site-packages")] + [sysconfig.get_path("purelib")]
    with open(f"{site.strip()}/deps.pth", "w") as f:
        f.write("\n".join(dict.fromkeys(deps)) + "\n")

    script = textwrap.dedent(f"""
        import draslice, sys
        assert draslice.__file__.startswith({str(venv)!r}), draslice.__file__
        from kfp import local
        from draslice.components.smoke import smoke
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root="outputs")
        task = smoke(device="cpu", matmul_size=256)
        print("RESULT", task.outputs["cuda_available"], task.outputs["tflops"] > 0)
    """)
    done = subprocess.run([str(python), "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "RESULT False True" in done.stdout
    assert "matmul_on_slice: OK" in done.stdout + done.stderr

    cli = subprocess.run([str(venv / "bin" / "draslice"), "--version"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert cli.returncode == 0 and "draslice, version" in cli.stdout
