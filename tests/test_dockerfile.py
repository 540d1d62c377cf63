"""trainer/Dockerfile keeps its promises (no container engine here to build it)."""

from __future__ import annotations

import re
import subprocess
import tomllib

from draslice.tests.conftest import REPO

DOCKERFILE = (REPO / "trainer" / "Dockerfile").read_text()
INSTRUCTIONS = [line.strip() for line in DOCKERFILE.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]


def test_base_is_a_pinned_cuda_pytorch_image():
    (arg,) = [i for i in INSTRUCTIONS if i.startswith("ARG BASE_IMAGE=")]
    image = arg.split("=", 1)[1]
    assert re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime", image)


def test_runs_as_a_non_root_user():
    users = [i.split()[1] for i in INSTRUCTIONS if i.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")


def test_copies_every_package_folder_of_the_distribution():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    # The root is the package: each subpackage's first folder, and the root's own modules.
    folders = {p.split(".")[1] for p in pyproject["tool"]["setuptools"]["packages"] if "." in p}
    root_modules = {p.name for p in REPO.glob("*.py")}
    copied = {word.rstrip("/") for i in INSTRUCTIONS if i.startswith("COPY ") and "--from" not in i
              for word in i.split()[1:-1]}
    assert folders | root_modules <= copied, (folders | root_modules) - copied


def test_nothing_is_fetched_at_run_time():
    env = DOCKERFILE[DOCKERFILE.index("ENV "):]
    for var in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "PIP_NO_INDEX=1"):
        assert var in env
    assert 'pip install --no-cache-dir "$(ls /wheels/draslice-*.whl)[qlora,speed]"' in DOCKERFILE


def test_the_image_can_run_qlora():
    """The finetune pipeline's load_in_4bit needs bitsandbytes in the image: the qlora extra
    is installed and its import is checked while building."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert any(r.startswith("bitsandbytes")
               for r in pyproject["project"]["optional-dependencies"]["qlora"])
    assert "[qlora,speed]" in DOCKERFILE
    (check,) = [i for i in INSTRUCTIONS if "python -c" in i]
    assert "bitsandbytes" in check
    assert "ADD http" not in DOCKERFILE and "curl" not in DOCKERFILE


def test_the_image_runs_the_fast_kernels():
    """``compile="auto"`` applies Liger's kernels to Llama/Qwen on a GPU when liger-kernel is
    installed (trainer/speed/): the image installs the speed extra that declares it."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert any(r.startswith("liger-kernel")
               for r in pyproject["project"]["optional-dependencies"]["speed"])
    assert "[qlora,speed]" in DOCKERFILE


def _build_loop_modfiles() -> dict[str, str]:
    """The release -> module file pairs the allocator stage's loop builds, found by running its
    shell up to the ``go build`` (with ``echo`` instead) on cluster/allocator/releases.txt,
    which the stage copies in."""
    start = DOCKERFILE.index("RUN releases=")
    loop = DOCKERFILE[start + len("RUN "):DOCKERFILE.index("CGO_ENABLED=0", start)]
    script = loop.replace("\\\n", "\n") + 'echo "$v $modfile"; done'
    out = subprocess.run(["sh", "-ec", script], cwd=REPO / "cluster" / "allocator",
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split() for line in out.splitlines())


def test_the_image_carries_the_allocator_built_from_source():
    """A Go build stage compiles the DRA allocator for every supported release, the wheel is
    built for the image's platform with those binaries, and each one runs before the image is
    done."""
    from draslice.cluster.allocator import MODFILES, SUPPORTED

    assert "AS allocator" in DOCKERFILE and "CGO_ENABLED=0" in DOCKERFILE
    assert _build_loop_modfiles() == {v: MODFILES[v] for v in SUPPORTED}
    assert "COPY --from=allocator /out/ build/allocator/" in DOCKERFILE
    assert "DRASLICE_WHEEL_PLATFORM=linux-${TARGETARCH}" in DOCKERFILE
    assert '"$b" --version' in DOCKERFILE
