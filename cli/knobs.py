"""Click options generated from the fine-tune's config (``trainer/config.py``).

A command names the knobs it offers; each option's flag, type, default, help and valid range
come from the config's declaration, so the CLI cannot drift from the trainer. Choices and
ranges are shown in ``--help`` and checked once, when the config is built (one error line,
exit 2, the same wording as a component's). Importing this loads neither torch nor kfp.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import click

from draslice.trainer.config import KNOBS, flag

__all__ = ["flag", "knob_option", "knob_options"]


def knob_option(name: str, default: Any) -> Callable:
    """One click option for the knob ``name``, starting from ``default``."""
    knob = KNOBS[name]
    valid = knob.valid.removeprefix("must be ")
    text = f"{knob.help} ({valid})" if valid else knob.help
    if knob.type is bool:
        spelled = flag(name)
        return click.option(f"{spelled}/--no-{spelled[2:]}", name, default=default,
                            show_default=True, help=text)
    return click.option(flag(name), name, type=knob.type, default=default, show_default=True,
                        help=text)


def knob_options(names: Iterable[str], defaults: Mapping[str, Any] | None = None) -> Callable:
    """A decorator adding the options of ``names`` (in that order in ``--help``), each starting
    from ``defaults[name]`` when given (a preset's value), else from the config's default."""
    names = list(names)

    def decorate(command: Callable) -> Callable:
        for name in reversed(names):
            default = (defaults or {}).get(name, KNOBS[name].default)
            command = knob_option(name, default)(command)
        return command

    return decorate
