"""How a failed command tells its user: one ``error: ...`` line on stderr and the error's exit
code, and with ``--json`` also one JSON object on stdout, so a script that reads stdout gets
an answer in every case.

Every command with a ``--json`` flag is built with ``cls=JsonErrorCommand``; the one place
that turns an error into output is :func:`fail`. Bad input from click's own parsing (an
unknown option, a value that is not a number, a choice not offered) is covered as well as a
:class:`~draslice.errors.DrasliceError` raised by the command. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from draslice.errors import DrasliceError, InvalidParameter

JSON_FLAG = "--json"


def error_object(err: DrasliceError | click.ClickException) -> dict[str, Any]:
    """The JSON form of an error: ``error`` (the message), ``exit_code`` and ``field`` (the
    parameter at fault, or null when the error names no single one)."""
    if isinstance(err, click.ClickException):
        message, code = err.format_message(), err.exit_code
    else:
        message, code = str(err), err.exit_code
    return {"error": message, "exit_code": code, "field": _field(err)}


def _field(err: DrasliceError | click.ClickException) -> str | None:
    if isinstance(err, InvalidParameter):
        return err.name
    if isinstance(err, click.NoSuchOption):
        return err.option_name
    param = getattr(err, "param", None)  # click.BadParameter and MissingParameter
    if isinstance(param, click.Parameter):
        return param.opts[0] if param.opts else param.name
    return None


def fail(err: DrasliceError, json_object: dict[str, Any] | None = None) -> NoReturn:
    """Print ``err`` as ``error: ...`` on stderr (its detail under it when asked for, and
    ``json_object`` on stdout, one line) and exit with its code."""
    click.echo(f"error: {err}", err=True)
    if err.show_detail and err.detail:
        click.echo(err.detail, err=True)
    if json_object is not None:
        click.echo(json.dumps(json_object))
    sys.exit(err.exit_code)


def asks_for_json(args: Sequence[str]) -> bool:
    """Whether ``--json`` is among a command's arguments (before a ``--``), read from the raw
    arguments because parsing them may be what failed."""
    args = list(args)
    return JSON_FLAG in (args[:args.index("--")] if "--" in args else args)


class JsonErrorCommand(click.Command):
    """A command whose errors are JSON objects on stdout when ``--json`` is given.

    Subclasses shape the object with :meth:`json_error` (``preflight`` keeps the keys its
    report documents)."""

    def json_error(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        as_json = asks_for_json(args)
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as err:  # bad usage: click says it, then the JSON line
            if not as_json:
                raise
            err.show()
            click.echo(json.dumps(self.json_error(error_object(err))))
            sys.exit(err.exit_code)
        ctx.meta["draslice.json_errors"] = as_json
        return ctx

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DrasliceError as err:
            if not ctx.meta.get("draslice.json_errors"):
                raise
            fail(err, self.json_error(error_object(err)))
