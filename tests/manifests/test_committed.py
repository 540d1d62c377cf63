"""manifests/: exactly the rendered set, and not stale."""

from __future__ import annotations

import pytest

from draslice.cluster.manifests import committed
from draslice.components.image import TRAINER_IMAGE
from draslice.tests.conftest import REPO

MANIFESTS = REPO / "manifests"
FILES = committed.files(TRAINER_IMAGE)


def test_folder_holds_exactly_the_rendered_set():
    assert sorted(p.name for p in MANIFESTS.iterdir()) == sorted(FILES)


@pytest.mark.parametrize("name", sorted(FILES))
def test_committed_file_is_not_stale(name):
    assert (MANIFESTS / name).read_text() == FILES[name], (
        f"manifests/{name} is stale: run `{committed.REGENERATE}` and commit manifests/"
    )


def test_rendering_is_deterministic():
    assert committed.files(TRAINER_IMAGE) == FILES


def test_every_file_says_how_to_regenerate_it():
    for name, text in FILES.items():
        assert text.startswith("# ") and committed.REGENERATE in text.split("---\n")[0], name


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_command_in_each_header_renders_that_file(name):
    """What a file says it was rendered by is true: running it prints the same documents."""
    import shlex

    from click.testing import CliRunner

    from draslice.cli import main

    header, body = FILES[name].split("---\n", 1)
    (line,) = [ln for ln in header.splitlines() if ln.startswith("# Rendered by: ")]
    argv = shlex.split(line.removeprefix("# Rendered by: "))
    assert argv[:2] == ["draslice", "manifests"]
    result = CliRunner().invoke(main, argv[1:])
    assert result.exit_code == 0, result.output
    assert result.stdout == "---\n" + body
