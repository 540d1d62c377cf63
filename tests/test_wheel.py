"""The closest to the trainer image without a container engine: build the wheel, install it
into a fresh virtualenv, and run a component from there — not from the source tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

from draslice.tests.conftest import REPO

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
    # the pure wheel: the allocator's Go sources (built on first use where Go is), no binary
    for needed in ("draslice/cluster/allocator/__init__.py", "draslice/cluster/allocator/main.go",
                   "draslice/cluster/allocator/go.mod", "draslice/cluster/allocator/go.1.34.sum",
                   "draslice/cluster/allocator/releases.txt"):
        assert needed in names, needed
    assert not any("/allocator/bin/" in n for n in names)
    assert wheel.name.endswith("-py3-none-any.whl")
    for needed in ("draslice/cli/__init__.py", "draslice/errors.py", "draslice/trainer/sft.py",
                   "draslice/components/smoke/component.py",
                   "draslice/components/finetune/component.py",
                   "draslice/pipelines/demo/pipeline.py",
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


@pytest.fixture(scope="module")
def platform_wheel(tmp_path_factory):
    """The wheel `make dist` builds for this machine: the allocator binaries inside."""
    from draslice.cluster import allocator

    host = allocator.host_platform()
    out = tmp_path_factory.mktemp("platform-dist")
    subprocess.run([sys.executable, "-m", "draslice.cluster.allocator", "build", "--platform",
                    host, "--out", str(REPO / "build" / "allocator" / host)], check=True,
                   capture_output=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO)],
        check=True, env={**os.environ, "DRASLICE_WHEEL_PLATFORM": host},
    )
    (path,) = out.glob("draslice-*.whl")
    return path


def test_platform_wheel_preflights_without_go(platform_wheel, tmp_path):
    """A pip user on this platform decides with the packaged allocator: no Go on PATH, no
    source, no cache (a fresh XDG_CACHE_HOME)."""
    from draslice.cluster import allocator

    names = zipfile.ZipFile(platform_wheel).namelist()
    host = allocator.host_platform()
    for release in allocator.SUPPORTED:
        assert f"draslice/cluster/allocator/bin/{host}/allocator-{release}" in names
    assert "-py3-none-manylinux2014_" in platform_wheel.name or "macosx" in platform_wheel.name

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    str(platform_wheel)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True).stdout
    deps = [p for p in sys.path if p.endswith("site-packages")] + [sysconfig.get_path("purelib")]
    with open(f"{site.strip()}/deps.pth", "w") as f:
        f.write("\n".join(dict.fromkeys(deps)) + "\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    fixture = REPO / "tests" / "fixtures" / "resourceslices" / "p100-16gb.v1beta1.yaml"
    done = subprocess.run([str(venv / "bin" / "draslice"), "preflight", "--snapshot",
                           str(fixture), "--shared", "mps", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert out["decision"] == "ready" and out["node"] == "192.168.140.59"
    assert out["allocator"].startswith("k8s.io/dynamic-resource-allocation v0.37.")
    assert not (tmp_path / "cache").exists()  # nothing was built
