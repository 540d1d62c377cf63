"""The ``draslice`` command line. Each subcommand lives in its own module; this file only
assembles them and turns :class:`DrasliceError` into a one-line message and an exit code."""

from __future__ import annotations

import importlib
import importlib.util

import click

from draslice import __version__
from draslice.cli.error_output import JsonErrorCommand, fail
from draslice.errors import DrasliceError, MissingDependency

# name -> (module under draslice.cli.commands, attribute, packages it needs besides the
# trainer's). A command's module is imported only when that command runs (or --help lists
# it), and command modules import torch and kfp only where a command does its work, so
# `--help`, option parsing and bad input answer in a fraction of a second, and `draslice
# train` (the trainer image's entry point, also used on bare GPU hosts) never loads kfp.
COMMANDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "advise": ("advise_cmd", "advise", ()),
    "compile": ("compile_cmd", "compile_pipelines", ("kfp",)),
    "manifests": ("manifests_cmd", "manifests", ()),
    "preflight": ("preflight_cmd", "preflight", ()),
    "run": ("run_cmd", "run", ("kfp",)),
    "schedule": ("schedule_cmd", "schedule", ("kfp",)),
    "smoke": ("steps_cmd", "smoke", ()),
    "submit": ("submit_cmd", "submit", ("kfp",)),
    "train": ("steps_cmd", "train", ()),
    "upload": ("upload_cmd", "upload", ("kfp",)),
}


def _installed(package: str) -> bool:
    """Whether ``package`` can be imported, without importing it (kfp takes a second)."""
    try:
        return importlib.util.find_spec(package) is not None
    except ImportError:
        return False


def _missing_dependency(name: str, missing: str, detail: str) -> click.Command:
    """A stand-in for a command that needs a package not installed here: says what is
    missing, before any work starts."""

    @click.command(name, cls=JsonErrorCommand, add_help_option=False,
                   context_settings={"ignore_unknown_options": True},
                   help=f"(unavailable here: needs {missing})")
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def unavailable(args: tuple[str, ...]) -> None:  # noqa: ARG001 (whatever was typed)
        raise MissingDependency(
            f"`draslice {name}` needs the Python package {missing!r}, which is not installed "
            f"here ({detail}); install draslice with its dependencies: pip install draslice")

    return unavailable


class _Group(click.Group):
    """Loads each command on first use; prints a DrasliceError as ``error: ...`` (no
    traceback) and exits with its code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr, needs = COMMANDS[cmd_name]
        for package in needs:
            if not _installed(package):
                return _missing_dependency(cmd_name, package, f"No module named {package!r}")
        try:
            loaded = importlib.import_module(f"draslice.cli.commands.{module}")
        except ImportError as err:
            return _missing_dependency(cmd_name, err.name or str(err), str(err))
        return getattr(loaded, attr)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DrasliceError as err:
            fail(err)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="draslice")
def main() -> None:
    """Fine-tune models on a DRA GPU slice (MIG or shared GPU) with Kubeflow Pipelines.

    Start with `draslice run` (the whole pipeline on this machine, no cluster), then
    `draslice compile` for the YAML you upload to the KFP UI.
    """
    from draslice.trainer import libraries

    libraries.offline()  # nothing is downloaded at run time, as in the trainer image
    libraries.settle()  # before any command imports peft: library lines no one can act on
