"""The one YAML writer for rendered manifests: deterministic, so committed files can be diffed.

Key order is the order the builders use (Kubernetes reading order: apiVersion, kind,
metadata, spec), lines are never folded, multi-line strings (CEL) become literal blocks,
and every file starts with a comment that says what it is and how to regenerate it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import yaml


class _Dumper(yaml.SafeDumper):
    """SafeDumper that keeps insertion order and writes multi-line strings as ``|`` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(docs: Iterable[dict], header: str = "") -> str:
    """Documents separated by ``---``, preceded by ``header`` as ``#`` comment lines."""
    parts = [
        yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096,
                  allow_unicode=False)
        for doc in docs
    ]
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comment + "---\n" + "---\n".join(parts)


def write(out_dir: str | Path, files: dict[str, str]) -> list[Path]:
    """Write ``{filename: text}`` into ``out_dir``; returns the paths in the given order.

    The folder is checked (created, and a probe written) before any file, so a read-only or
    full one is one line naming it; each file is written under a temporary name and renamed,
    so a failed write leaves no half-written manifest."""
    from draslice.trainer.outputs import check_writable_dir

    out = check_writable_dir(out_dir, "out", created=[])
    paths = []
    for name, text in files.items():
        path = out / name
        tmp = out / f".tmp-{name}"
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        paths.append(path)
    return paths
