"""docs/cli.md is what `make cli-docs` writes now: every command's --help and the --variant list.

The page is rendered once, in a fresh Python (this test process has torch loaded by conftest),
which also proves that rendering every command's help loads no torch: `--help` must stay fast.
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys

from draslice.tests.conftest import REPO

RENDER = """\
import json, sys
from draslice.cli.docs import render
text = render()
print(json.dumps({"text": text, "heavy": sorted(m for m in ("torch", "transformers", "peft")
                                               if m in sys.modules)}))
"""


def _render() -> dict:
    done = subprocess.run([sys.executable, "-c", RENDER], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_cli_md_is_current_and_rendered_without_torch():
    rendered = _render()
    assert rendered["heavy"] == [], f"rendering --help imported {rendered['heavy']}"
    committed = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    if committed != rendered["text"]:
        diff = "".join(list(difflib.unified_diff(
            committed.splitlines(keepends=True), rendered["text"].splitlines(keepends=True),
            "docs/cli.md (committed)", "docs/cli.md (rendered now)"))[:40])
        raise AssertionError(f"docs/cli.md is stale: run `make cli-docs`\n{diff}")
    # The page names every compiled variant and every command, so a stale list cannot hide.
    from draslice.cli import COMMANDS
    from draslice.pipelines.variants import VARIANTS

    for variant in VARIANTS:
        assert f"| `{variant.filename.removesuffix('.yaml')}` |" in committed
    for name in COMMANDS:
        assert f"## `draslice {name}`" in committed
    assert "→ validate → gate |" in committed
