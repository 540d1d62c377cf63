"""What a refused command must look like: exit 2 and its whole output one line holding every
needle, no traceback (the charter's "one clear line")."""

from __future__ import annotations


def one_line(result, *needles: str) -> str:
    """The only line of a click ``result`` that exited 2; each needle in it."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = result.output.splitlines()
    for needle in needles:
        assert needle in line, line
    return line
