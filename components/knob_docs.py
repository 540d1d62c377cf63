"""A component's input descriptions, from the knobs' declaration (``trainer/config.py``).

KFP reads a component's input descriptions from its docstring's ``Args:``. For a knob the
description is the config's help and valid range, so the KFP UI's run form shows what
``draslice train --help`` shows, written once; other inputs say their own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

from draslice.trainer.config import KNOBS


def with_input_docs(func: Callable, others: Mapping[str, str]) -> Callable:
    """``func`` with an ``Args:`` section before its ``Returns:``, one line per input: the
    knob's help and range, or ``others[name]`` for an input that is no knob."""
    lines = []
    for name in inspect.signature(func).parameters:
        if name in KNOBS:
            knob = KNOBS[name]
            text = f"{knob.help} ({knob.valid.removeprefix('must be ')})" if knob.valid \
                else knob.help
        else:
            text = others[name]
        lines.append(f"    {name}: {text}")
    doc = inspect.getdoc(func)
    head, sep, returns = doc.partition("\nReturns:")
    func.__doc__ = f"{head.rstrip()}\n\nArgs:\n" + "\n".join(lines) + f"\n{sep}{returns}"
    return func
