"""One carry for the peer benchmarks: the ``peers`` and ``bench-c`` wheels, less what the GPU
host never loads, into one folder (``.whl/peers-one`` by default).

A carry holds 64 MiB and the two groups take 89 MiB, so Unsloth (which needs bitsandbytes in
the same process) took two calls on one warm machine; a machine that idled out or was not lent
for the second call lost the first. What is dropped:

- Unsloth's ``studio/`` (a web UI, 25 MB of the 29 MB wheel): ``peer_trainers.py`` imports
  ``unsloth``, which does not import it.
- bitsandbytes' CUDA libraries for other toolkits than the host's (``--cuda``, default 13: the
  host's torch is built for CUDA 13.0): bitsandbytes loads the one that matches torch's.

Each trimmed wheel's ``RECORD`` drops the same files, so pip installs it as a whole wheel.

    python benchmarks/remote/trim_wheels.py [--src .whl] [--dest .whl/peers-one] [--cuda 13]
"""

from __future__ import annotations

import argparse
import re
import shutil
import zipfile
from pathlib import Path


def dropped(name: str, cuda: str) -> bool:
    """Whether a file of a wheel is left out (see the module docstring)."""
    if name.startswith("studio/"):
        return True
    lib = re.match(r"bitsandbytes/libbitsandbytes_cuda(\d+)\.so$", name)
    return bool(lib) and not lib.group(1).startswith(cuda)


def trim(wheel: Path, dest: Path, cuda: str) -> int:
    """Copy ``wheel`` into ``dest`` without the dropped files; how many bytes it saved."""
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        gone = {i.filename for i in src.infolist() if dropped(i.filename, cuda)}
        if not gone:
            out.unlink()
            shutil.copy2(wheel, out)
            return 0
        for info in src.infolist():
            if info.filename in gone:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                kept = [line for line in data.decode().splitlines()
                        if line.split(",", 1)[0] not in gone]
                data = ("\n".join(kept) + "\n").encode()
            dst.writestr(info, data)
    return wheel.stat().st_size - out.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", type=Path, default=Path(".whl"),
                        help="where fetch_gpu_wheels.sh put the groups (default .whl)")
    parser.add_argument("--dest", type=Path, default=Path(".whl/peers-one"))
    parser.add_argument("--cuda", default="13", help="CUDA major version of the host's torch")
    args = parser.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    for old in args.dest.glob("*.whl"):
        old.unlink()
    saved = 0
    for group in ("peers", "bench-c"):
        for wheel in sorted((args.src / group).glob("*.whl")):
            if not (args.dest / wheel.name).exists():
                saved += trim(wheel, args.dest, args.cuda)
    total = sum(w.stat().st_size for w in args.dest.glob("*.whl"))
    print(f"{args.dest}: {len(list(args.dest.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB "
          f"({saved / 2**20:.1f} MiB dropped)")
    return 0 if total < 54 * 2**20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
