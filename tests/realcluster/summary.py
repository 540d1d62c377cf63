"""The two closing lines of `make test-cluster`: the API server's version and how many
fixture x template pairs preflight and the scheduler agreed on.

The tests record into this module; :func:`write` (at the end of the pytest session) puts the
lines into the file named by ``DRASLICE_CLUSTER_SUMMARY``, which scripts/cluster/test.sh
prints after pytest's own summary.
"""

from __future__ import annotations

import os
from pathlib import Path

_state: dict = {"version": None, "pairs": {}}


def record_version(version: str) -> None:
    _state["version"] = version


def record_pair(pair: str, agree: bool) -> None:
    _state["pairs"][pair] = agree


def lines() -> list[str]:
    out = [f"kube-apiserver {_state['version'] or '(not started)'}"]
    pairs = _state["pairs"]
    out.append(f"preflight vs scheduler: {sum(pairs.values())}/{len(pairs)} agree")
    return out


def write() -> None:
    target = os.environ.get("DRASLICE_CLUSTER_SUMMARY")
    if target:
        Path(target).write_text("\n".join(lines()) + "\n")
