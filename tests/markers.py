"""Markers given by folder: every test under tests/realcluster is ``cluster``, under tests/node
``node``, so `make test` deselects them by marker whatever a test file declares."""

from __future__ import annotations

from pathlib import Path

import pytest


def mark_folder(items: list[pytest.Item], folder: Path, marker: pytest.MarkDecorator) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(folder):
            item.add_marker(marker)
