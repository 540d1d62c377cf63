"""The Kubernetes scheduler's own DRA allocator, as a program draslice runs (see main.go here).

One Go binary per supported Kubernetes minor release links ``k8s.io/dynamic-resource-allocation``
of that release (``go.mod`` for the newest, ``go.1.3x.mod`` for the others; build tags
``k8s13x`` select the release's default feature gates). Preflight and the template renderer
send it JSON and report from its answer: draslice decides nothing about allocation or CEL
itself.

Where the binary comes from, in order:

1. a platform wheel: ``bin/<goos>-<goarch>/allocator-1.3x`` inside this package (``make dist``);
2. the cache ``${XDG_CACHE_HOME:-~/.cache}/draslice/allocator/<key>/``, keyed by the release,
   its go.sum and the Go sources, so a rebuilt checkout or CI on the same machine reuses it;
3. a build into that cache when the Go sources are here (a source or editable install) and
   ``go`` is on PATH (``make allocator`` does the same ahead of time).

Without any of them, :class:`AllocatorUnavailable` says in one line how to get one (exit 2).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from draslice.errors import DrasliceError

HERE = Path(__file__).resolve().parent
# The supported minor releases, oldest first: the one list (setup.py and trainer/Dockerfile
# read the same file).
RELEASES_FILE = HERE / "releases.txt"


def read_releases(path: Path = RELEASES_FILE) -> tuple[str, ...]:
    """The releases listed in ``path``: one a line; a line that starts with ``#`` is a comment."""
    return tuple(line.strip() for line in path.read_text().splitlines()
                 if line.strip() and not line.startswith("#"))


SUPPORTED = read_releases()
NEWEST = SUPPORTED[-1]
# Kubernetes minor release -> the module file that pins its k8s.io/dynamic-resource-allocation:
# go.mod for the newest, go.<release>.mod for the others.
MODFILES = {v: "go.mod" if v == NEWEST else f"go.{v}.mod" for v in SUPPORTED}
# Wheel platforms `make dist` builds: Go's GOOS-GOARCH.
PLATFORMS = ("linux-amd64", "linux-arm64", "darwin-arm64")
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
# A snapshot of 1,000 nodes answers in well under a second; a stuck process must not hold a
# pipeline's preflight task for ever.
TIMEOUT_S = 300


class AllocatorUnavailable(DrasliceError):
    """No allocator binary for this machine and no way to build one: bad setup, exit 2."""


class AllocatorFailed(DrasliceError):
    """The allocator program itself failed (crashed, answered no JSON): a bug, said plainly."""

    exit_code = 1


def host_platform() -> str:
    """This machine as Go names it (``linux-amd64``)."""
    arch = platform.machine().lower()
    return f"{sys.platform.removesuffix('2')}-{_ARCH.get(arch, arch)}"


def check_version(version: str | None) -> str:
    """``1.35`` (or ``v1.35.2``) -> ``1.35``; None -> the newest supported."""
    if version is None:
        return NEWEST
    text = str(version).strip().removeprefix("v")
    minor = ".".join(text.split(".")[:2])
    if minor not in MODFILES:
        from draslice.errors import InvalidParameter

        raise InvalidParameter("kubernetes_version", version,
                               f"must be one of {', '.join(SUPPORTED)}")
    return minor


def clamp_version(server: str) -> tuple[str, str | None]:
    """A server's ``gitVersion`` (``v1.33.4``) -> a supported minor, and a note if clamped."""
    try:
        major, minor = (int(p) for p in server.removeprefix("v").split("-")[0].split(".")[:2])
    except ValueError:
        return NEWEST, f"server version {server!r} not understood: decided as Kubernetes {NEWEST}"
    wanted = f"{major}.{minor}"
    if wanted in MODFILES:
        return wanted, None
    lowest, newest = SUPPORTED[0], NEWEST
    chosen = lowest if (major, minor) < tuple(int(p) for p in lowest.split(".")) else newest
    return chosen, (f"the cluster runs Kubernetes {wanted}; decided with the {chosen} allocator "
                    f"(supported: {', '.join(SUPPORTED)})")


def _sources_key(version: str) -> str:
    """The cache key: release, its module file and go.sum, and every Go source file."""
    modfile = HERE / MODFILES[version]
    digest = hashlib.sha256(version.encode())
    for path in [modfile, modfile.with_suffix(".sum"), *sorted(HERE.glob("*.go"))]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "draslice" / "allocator"


def _have_sources(version: str) -> bool:
    modfile = HERE / MODFILES[version]
    return modfile.is_file() and modfile.with_suffix(".sum").is_file() and any(HERE.glob("*.go"))


def build(version: str, out: Path, goos: str | None = None, goarch: str | None = None) -> Path:
    """Build the allocator for ``version`` into ``out`` (a file path); cross-compiles with CGO
    off when ``goos``/``goarch`` are given. Raises :class:`AllocatorUnavailable` without Go."""
    go = shutil.which("go")
    if go is None:
        raise AllocatorUnavailable(_missing_message(version, "Go is not installed"))
    tag = "k8s" + version.replace(".", "")
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
    if goos:
        env["GOOS"] = goos
    if goarch:
        env["GOARCH"] = goarch
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    cmd = [go, "build", f"-modfile={MODFILES[version]}", "-tags", tag, "-trimpath",
           "-ldflags", "-s -w", "-o", str(tmp), "."]
    done = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise AllocatorUnavailable(
            f"building the DRA allocator for Kubernetes {version} failed: "
            + " | ".join(done.stderr.strip().splitlines()[-5:])
        )
    tmp.replace(out)
    return out


def _missing_message(version: str, why: str) -> str:
    return (f"no DRA allocator binary for Kubernetes {version} on {host_platform()} ({why}): "
            "install the draslice wheel for your platform (linux amd64/arm64, macOS arm64), "
            "or install Go 1.26+ and run `make allocator` in a source checkout")


def cached_build(version: str, target: str | None = None) -> Path:
    """The binary for ``version`` and ``target`` (GOOS-GOARCH; None: this machine) from the
    cache, built there first if needed: CI and ``make dist`` rebuild only what changed."""
    target = target or host_platform()
    name = f"allocator-{version}"
    cached = cache_root() / f"{version}-{_sources_key(version)}" / target / name
    if not cached.is_file():
        goos, _, goarch = target.partition("-")
        build(version, cached, goos, goarch)
    return cached


@cache
def binary(version: str = NEWEST) -> Path:
    """The allocator binary for ``version``, building it into the cache when needed."""
    version = check_version(version)
    packaged = HERE / "bin" / host_platform() / f"allocator-{version}"
    if packaged.is_file():
        return packaged
    if not _have_sources(version):
        shipped = sorted(p.name for p in (HERE / "bin").glob("*")) if (HERE / "bin").is_dir() \
            else []
        why = (f"this install carries binaries for {', '.join(shipped)} only" if shipped
               else "this install carries neither a binary nor the Go sources")
        raise AllocatorUnavailable(_missing_message(version, why))
    return cached_build(version)


def run(payload: dict, version: str = NEWEST) -> dict:
    """Send ``payload`` (see types.go) to the allocator of ``version``; its JSON answer."""
    path = binary(version)
    data = json.dumps(payload, separators=(",", ":")).encode()
    try:
        done = subprocess.run([str(path)], input=data, capture_output=True, timeout=TIMEOUT_S)
    except OSError as exc:  # e.g. a binary for another platform: "Exec format error"
        raise AllocatorUnavailable(
            f"cannot run the DRA allocator {path}: {exc.strerror or exc} (a binary for another "
            f"platform than {host_platform()}? reinstall draslice for this platform, or install "
            "Go 1.26+ and run `make allocator`)"
        ) from None
    except subprocess.TimeoutExpired:
        raise AllocatorFailed(f"the DRA allocator {path} did not answer in {TIMEOUT_S} s") from None
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        tail = " | ".join(done.stderr.decode(errors="replace").strip().splitlines()[-3:])
        raise AllocatorFailed(
            f"the DRA allocator {path} exited {done.returncode} without an answer: {tail}"
        ) from None
    return answer


def check_selectors(expressions: list[str], version: str = NEWEST) -> dict[str, str]:
    """Each expression -> the API server's objection to it as a new selector ("" if none)."""
    todo = [e for e in dict.fromkeys(expressions) if (e, version) not in _checked]
    if todo:
        for item in run({"checks": todo}, version)["checks"]:
            _checked[(item["expression"], version)] = item.get("error", "")
    return {e: _checked[(e, version)] for e in expressions}


_checked: dict[tuple[str, str], str] = {}


def main(argv: list[str] | None = None) -> int:
    """``python -m draslice.cluster.allocator build [--version V|all] [--platform P] [--out D]``:
    build binaries (``make allocator`` for this machine's cache, ``make dist`` for wheels)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m draslice.cluster.allocator",
                                     description=main.__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "path"])
    parser.add_argument("--version", default="all", help=f"{', '.join(SUPPORTED)} or all")
    parser.add_argument("--platform", help="GOOS-GOARCH to cross-compile for ("
                        f"{', '.join(PLATFORMS)}); default: this machine, into the cache")
    parser.add_argument("--out", type=Path, help="folder for the binaries (with --platform)")
    args = parser.parse_args(argv)
    versions = SUPPORTED if args.version == "all" else (check_version(args.version),)
    try:
        for version in versions:
            if args.command == "path" or not args.platform:
                print(binary(version))
                continue
            if args.platform not in PLATFORMS:
                parser.error(f"--platform must be one of {', '.join(PLATFORMS)}")
            built = cached_build(version, args.platform)
            out = (args.out or Path(tempfile.gettempdir())) / built.name
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, out)
            print(out)
    except DrasliceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
