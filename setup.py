"""Build hook for platform wheels that carry the DRA allocator binaries (everything else about
the distribution is in pyproject.toml).

``make dist`` cross-compiles the allocator (cluster/allocator, one binary per Kubernetes minor
release) into ``build/allocator/<goos>-<goarch>/`` and then builds one wheel per platform with
``DRASLICE_WHEEL_PLATFORM=<goos>-<goarch>``. With that variable set, this hook copies those
binaries into the package (``draslice/cluster/allocator/bin/<goos>-<goarch>/``) and tags the
wheel for that platform, so a ``pip install`` user needs no Go. Without it, the wheel is pure
Python and carries the Go sources instead (a machine with Go builds the binary on first use).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 ships bdist_wheel; older ones use the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - depends on the build environment
    from wheel.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parent
# Go's GOOS-GOARCH -> the wheel platform tag (static CGO-free binaries run on any of these).
WHEEL_TAGS = {
    "linux-amd64": "manylinux2014_x86_64",
    "linux-arm64": "manylinux2014_aarch64",
    "darwin-arm64": "macosx_11_0_arm64",
}
# The allocator's supported releases: the file cluster/allocator/__init__.py reads (this hook
# runs before the package can be imported); one a line, a line starting with "#" is a comment.
RELEASES = tuple(line.strip() for line in
                 (ROOT / "cluster" / "allocator" / "releases.txt").read_text().splitlines()
                 if line.strip() and not line.startswith("#"))


def _platform() -> str | None:
    value = os.environ.get("DRASLICE_WHEEL_PLATFORM") or None
    if value is not None and value not in WHEEL_TAGS:
        raise SystemExit(f"DRASLICE_WHEEL_PLATFORM={value!r}: must be one of "
                         f"{', '.join(WHEEL_TAGS)}")
    return value


class BuildPyWithAllocator(build_py):
    """Copies the platform's allocator binaries into the built package (and only those)."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "draslice" / "cluster" / "allocator" / "bin"
        shutil.rmtree(target, ignore_errors=True)  # never a previous platform's binaries
        platform = _platform()
        if platform is None:
            return
        source = ROOT / "build" / "allocator" / platform
        missing = [r for r in RELEASES if not (source / f"allocator-{r}").is_file()]
        if missing:
            raise SystemExit(f"no allocator binaries for {platform} in {source} (missing "
                             f"{', '.join(missing)}): run `make dist`, which builds them")
        (target / platform).mkdir(parents=True)
        for release in RELEASES:
            out = target / platform / f"allocator-{release}"
            shutil.copy2(source / f"allocator-{release}", out)
            out.chmod(0o755)


class PlatformWheel(bdist_wheel):
    """Tags the wheel for the platform whose binaries it carries. The files stay in purelib
    (the binaries are data run as programs, not extension modules), so only the tag changes."""

    def get_tag(self) -> tuple[str, str, str]:
        platform = _platform()
        if platform is not None:
            return "py3", "none", WHEEL_TAGS[platform]
        return super().get_tag()


setup(cmdclass={"build_py": BuildPyWithAllocator, "bdist_wheel": PlatformWheel})
