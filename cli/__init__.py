"""The ``draslice`` command line. Each subcommand lives in its own module; this file only
assembles them and turns :class:`DrasliceError` into a one-line message and an exit code."""

from __future__ import annotations

import importlib
import sys

import click

from draslice import __version__
from draslice.errors import DrasliceError

# name -> (module under draslice.cli.commands, attribute). Imported when the command runs, so
# `draslice train` (the trainer image's entry point, also used on bare GPU hosts) never loads
# kfp, which only the pipeline commands need.
COMMANDS: dict[str, tuple[str, str]] = {
    "advise": ("advise_cmd", "advise"),
    "compile": ("compile_cmd", "compile_pipelines"),
    "manifests": ("manifests_cmd", "manifests"),
    "preflight": ("preflight_cmd", "preflight"),
    "run": ("run_cmd", "run"),
    "schedule": ("schedule_cmd", "schedule"),
    "smoke": ("steps_cmd", "smoke"),
    "submit": ("submit_cmd", "submit"),
    "train": ("steps_cmd", "train"),
    "upload": ("upload_cmd", "upload"),
}


def _missing_dependency(name: str, err: ImportError) -> click.Command:
    """A stand-in for a command whose module cannot be imported here: says what is missing."""
    missing = err.name or str(err)

    @click.command(name, context_settings={"ignore_unknown_options": True},
                   add_help_option=False, help=f"(unavailable here: needs {missing})")
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def unavailable(args: tuple[str, ...]) -> None:  # noqa: ARG001 (whatever was typed)
        click.echo(f"error: `draslice {name}` needs the Python package {missing!r}, which is "
                   f"not installed here ({err}); install draslice with its dependencies: "
                   "pip install draslice", err=True)
        sys.exit(2)

    return unavailable


class _Group(click.Group):
    """Loads each command on first use; prints a DrasliceError as ``error: ...`` (no
    traceback) and exits with its code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr = COMMANDS[cmd_name]
        try:
            loaded = importlib.import_module(f"draslice.cli.commands.{module}")
        except ImportError as err:
            return _missing_dependency(cmd_name, err)
        return getattr(loaded, attr)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DrasliceError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(err.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="draslice")
def main() -> None:
    """Fine-tune models on a DRA GPU slice (MIG or shared GPU) with Kubeflow Pipelines.

    Start with `draslice run` (the whole pipeline on this machine, no cluster), then
    `draslice compile` for the YAML you upload to the KFP UI.
    """
