"""kfp.local writes each task's program into ``mktemp -d`` and never removes it: a run's tasks
get a TMPDIR of their own, gone when the run ends."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from draslice.local.run import own_tmpdir


def test_the_tasks_temp_folders_live_in_the_run_and_go_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", "/tmp")
    with own_tmpdir(tmp_path):
        # What kfp.local's command line does for each task, in a subprocess as it runs them.
        made = Path(subprocess.run(["sh", "-c", 'd=$(mktemp -d); touch "$d/ephemeral_component.py";'
                                    ' echo "$d"'], capture_output=True, text=True,
                                   check=True).stdout.strip())
        assert made.parent.parent == tmp_path and (made / "ephemeral_component.py").is_file()
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"]  # torch's compile cache stays shared
    assert not made.exists() and not list(tmp_path.iterdir())
    assert os.environ["TMPDIR"] == "/tmp"
