"""The closing lines of `make test-node`, which a script can grep (docs/cluster-tests.md):

    kubelet v1.37.2
    containerd v2.4.2
    dra driver gpu.nvidia.com: 3 devices published
    pod smoke: Succeeded (claim gpu.nvidia.com/draslice-node/gpu-0-mig-1g6gb-0-0)
    pod finetune: Succeeded
    pipeline pods on a real node: PASS

The tests record into this module; :func:`write` (at the end of the pytest session) puts the
lines into the file named by ``DRASLICE_NODE_SUMMARY``, which scripts/node/test.sh prints after
pytest's own summary. The last line says PASS only when every test of the session passed.
"""

from __future__ import annotations

import os
from pathlib import Path

ORDER = ("kubelet", "containerd", "driver", "pod smoke", "pod finetune")
_lines: dict[str, str] = {}


def record(key: str, line: str) -> None:
    _lines[key] = line


def lines(passed: bool) -> list[str]:
    out = [_lines.get(key, f"{key}: (not reached)") for key in ORDER]
    out.append(f"pipeline pods on a real node: {'PASS' if passed else 'FAIL'}")
    return out


def write(passed: bool) -> None:
    target = os.environ.get("DRASLICE_NODE_SUMMARY")
    if target:
        Path(target).write_text("\n".join(lines(passed)) + "\n")
