"""The ``draslice`` command line. Each subcommand lives in its own module; this file only
assembles them and turns :class:`DrasliceError` into a one-line message and an exit code."""

from __future__ import annotations

import sys

import click

from draslice import __version__
from draslice.trainer.errors import DrasliceError


class _Group(click.Group):
    """Prints a DrasliceError as ``error: ...`` (no traceback) and exits with its code."""

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


def _register() -> None:
    from draslice.commands import (
        advise_cmd,
        compile_cmd,
        run_cmd,
        schedule_cmd,
        steps_cmd,
        submit_cmd,
        upload_cmd,
    )

    main.add_command(run_cmd.run)
    main.add_command(compile_cmd.compile_pipelines)
    main.add_command(steps_cmd.smoke)
    main.add_command(steps_cmd.train)
    main.add_command(advise_cmd.advise)
    main.add_command(upload_cmd.upload)
    main.add_command(submit_cmd.submit)
    main.add_command(schedule_cmd.schedule)


_register()
