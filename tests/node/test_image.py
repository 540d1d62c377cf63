"""The trainer image as a node gets it: built from trainer/Dockerfile by scripts/node/image.sh
(buildah, local base images, no registry), loaded from the archive the script prints into a
storage of its own, and run with runc the way a kubelet's container starts (its own user, no
network).

Marker ``node``: the first build takes tens of minutes (torch's CUDA build is about 3 GB), a rerun
takes the cached archive; root and Debian's apt are needed (the script installs buildah).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from draslice.cluster.allocator import SUPPORTED
from draslice.components.image import trainer_image
from draslice.tests.conftest import REPO

pytestmark = pytest.mark.node

SCRIPT = REPO / "scripts" / "node" / "image.sh"


@pytest.fixture(scope="module")
def built() -> tuple[Path, str]:
    """The script's last two lines: the OCI archive and the image reference."""
    proc = subprocess.run(["bash", str(SCRIPT)], stdout=subprocess.PIPE, text=True)
    assert proc.returncode == 0, f"{SCRIPT.name} exited {proc.returncode}"
    *_, archive, ref = proc.stdout.splitlines()
    return Path(archive), ref


@pytest.fixture(scope="module")
def run(built, tmp_path_factory):
    """A container of the archive's image in a fresh buildah storage (so the archive alone
    carries every layer), and a function that runs a command in it, as the image's user."""
    archive, ref = built
    root = tmp_path_factory.mktemp("buildah")
    bh = ["buildah", "--root", str(root / "storage"), "--runroot", str(root / "run"),
          "--storage-driver", "overlay"]
    name = subprocess.run([*bh, "from", f"oci-archive:{archive}"],
                          stdout=subprocess.PIPE, text=True, check=True).stdout.strip()

    def in_image(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run([*bh, "run", "--network", "none", name, "--", *cmd],
                              capture_output=True, text=True)

    in_image.images = subprocess.run([*bh, "images", "--format", "{{.Name}}:{{.Tag}}"],
                                     stdout=subprocess.PIPE, text=True, check=True).stdout
    yield in_image
    subprocess.run([*bh, "rm", name], capture_output=True)
    subprocess.run([*bh, "rmi", "--all", "--force"], capture_output=True)
    # The overlay driver leaves its storage folder mounted (private): unmount it, then remove
    # the unpacked image (gigabytes) rather than leave it in pytest's kept temporary folders.
    for mount in reversed(Path("/proc/self/mounts").read_text().splitlines()):
        if mount.split()[1].startswith(str(root)):
            subprocess.run(["umount", mount.split()[1]], check=True)
    shutil.rmtree(root)


def test_the_archive_names_the_image_the_pipelines_run(built, run):
    archive, ref = built
    assert ref == trainer_image()
    assert archive.name.endswith(".oci.tar") and archive.is_file()
    assert ref in run.images.split()


def test_draslice_runs_as_uid_1000(run):
    ids = run("sh", "-c", "id -u; id -g")
    assert ids.returncode == 0 and ids.stdout.split() == ["1000", "1000"], ids
    helped = run("draslice", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "Usage: draslice" in helped.stdout


def test_the_trainer_imports_on_the_cuda_build_of_torch(run):
    """pip kept the base image's torch: a CUDA build, not a CPU wheel pulled in by a dependency."""
    imported = run("python", "-c", "import draslice.trainer, torch; print(torch.version.cuda)")
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() not in ("", "None")


def test_hugging_face_and_pip_are_offline(run):
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "PIP_NO_INDEX")
    env = run("printenv", *names)
    assert env.returncode == 0 and env.stdout.split() == ["1"] * len(names), env


def test_every_allocator_binary_answers_its_release(run):
    versions = run("sh", "-c", 'for b in $(python -m draslice.cluster.allocator path); do '
                               '"$b" --version || exit 1; done')
    assert versions.returncode == 0, versions.stderr
    assert [line.split()[0] for line in versions.stdout.splitlines()] == list(SUPPORTED)
