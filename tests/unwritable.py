"""A folder the command may not write, refused by the kernel rather than by a stub.

Root writes through any mode bits, so under root the effective uid drops to nobody for the
block (and comes back after); the folder lives outside pytest's root-only tmp tree so that
nobody can reach it. Import the command's modules before entering: nobody cannot read root's
Python installation.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NOBODY = 65534


@contextmanager
def read_only_folder() -> Iterator[Path]:
    """Yield an existing, empty folder (mode 0555) that the block cannot write into."""
    root = Path(tempfile.mkdtemp(prefix="draslice-ro-"))
    root.chmod(0o755)
    folder = root / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.geteuid() == 0:
            os.seteuid(NOBODY)
        try:
            yield folder
        finally:
            if os.getuid() == 0:
                os.seteuid(0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
