"""``draslice schedule``: recurring runs (nightly canaries) on a KFP server."""

from __future__ import annotations

import click

from draslice.cli.commands.kfp_options import connection_options


def _canaries() -> list[str]:
    from draslice.kfp_ops.package import variant_ids

    return [v for v in variant_ids() if v.startswith("canary.")]


@click.group("schedule")
def schedule() -> None:
    """Recurring runs: create, list, enable, disable, delete.

    The default is the canary (preflight + smoke) of every claim template, nightly at
    02:00, one schedule per template, each pointing at an uploaded pipeline version.
    """


@schedule.command("create")
@click.option("--variant", "variants", multiple=True, metavar="ID|PATH",
              help="Variant(s) to schedule, repeatable. [default: every canary variant, one "
                   "schedule per claim template]")
@click.option("--cron", default=None, metavar="EXPR",
              help="Cron in the usual 5 fields ('0 2 * * *', converted to KFP's 6 with "
                   "seconds), KFP's 6 fields, or @daily/@hourly/... [default: '0 2 * * *']")
@click.option("--every", default=None, metavar="DURATION",
              help="Run at a fixed interval instead of cron: 30m, 6h, 1d, or seconds.")
@click.option("--max-concurrency", default=1, show_default=True, type=int,
              help="How many runs of this schedule may run at once (1-10).")
@click.option("--catchup/--no-catchup", default=False, show_default=True,
              help="After a pause, run every missed interval (--catchup) or only the latest.")
@click.option("--start", default=None, metavar="TIME",
              help="First possible run, ISO 8601 (e.g. 2026-12-01T00:00:00Z).")
@click.option("--end", default=None, metavar="TIME", help="Last possible run, ISO 8601.")
@click.option("--disabled", is_flag=True, help="Create it disabled (enable it later).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A pipeline input for every run, typed against the pipeline's inputs.")
@click.option("--name", default=None,
              help="Schedule name (one variant only); 'draslice-' is prepended when missing. "
                   "[default: <pipeline name>-nightly, or -schedule with --cron/--every]")
@click.option("--experiment", default="draslice", show_default=True,
              help="Experiment for the scheduled runs (created when missing).")
@click.option("--service-account", default=None, help="Service account for the runs' pods.")
@click.option("--replace", is_flag=True,
              help="Delete a schedule of the same name and create it again (e.g. to move it "
                   "to a new pipeline version). Without it an existing schedule is kept.")
@click.option("--compiled-dir", default="compiled", show_default=True,
              type=click.Path(file_okay=False), help="Where the committed YAML is.")
@connection_options
def create(variants, cron, every, max_concurrency, catchup, start, end, disabled, params, name,
           experiment, service_account, replace, compiled_dir, conn) -> None:
    """Create recurring runs (uploads the variants first; idempotent).

    \b
    Examples:
      draslice schedule create --host http://127.0.0.1:8080          # nightly canaries
      draslice schedule create --variant canary.policy.mig-1g-6gb --every 6h
      draslice schedule create --variant sft.policy.mig-1g-6gb --cron '30 3 * * 1-5' \\
          --param steps=60 --name sft-weekdays
    """
    from draslice.errors import InvalidParameter
    from draslice.kfp_ops import connect, create_schedule, parse_interval, resolve_package
    from draslice.kfp_ops.package import arguments_for, default_image_warning
    from draslice.kfp_ops.schedule import checked_trigger

    chosen = list(variants) or _canaries()
    if name and len(chosen) > 1:
        raise InvalidParameter("--name", name, "can only name a single --variant's schedule")
    if cron and every:
        raise InvalidParameter("--cron/--every", f"{cron} / {every}", "choose one")
    interval = parse_interval(every) if every else None
    checked_trigger(cron, interval, start, end)  # fail before connecting
    packages = [resolve_package(v, compiled_dir) for v in chosen]
    for package in packages:
        arguments_for(package, params)  # refused here, before anything is sent
    warning = default_image_warning(packages)
    if warning:
        click.echo(warning, err=True)
    session = connect(conn)
    for package in packages:
        result = create_schedule(
            session, package, name=name, cron=cron, interval_s=interval,
            max_concurrency=max_concurrency, no_catchup=not catchup, start=start, end=end,
            enabled=not disabled, params=params, experiment=experiment,
            service_account=service_account, replace=replace,
        )
        verb = "created" if result.created else "exists "
        click.echo(f"{verb}  {result.schedule.line()}")
        if result.note:
            click.echo(f"         note: {result.note}")


@schedule.command("list")
@click.option("--all", "include_all", is_flag=True,
              help="Show every schedule on the server, not only draslice's.")
@connection_options
def list_cmd(include_all, conn) -> None:
    """List draslice's schedules (names starting 'draslice-')."""
    from draslice.kfp_ops import connect, list_schedules

    rows = list_schedules(connect(conn), include_all=include_all)
    if not rows:
        click.echo("no schedules")
    for s in rows:
        click.echo(s.line())


def _toggle(enabled: bool):
    verb = "enable" if enabled else "disable"

    @schedule.command(verb)
    @click.argument("schedules", nargs=-1, required=True, metavar="NAME|ID...")
    @connection_options
    def toggle(schedules, conn) -> None:
        from draslice.kfp_ops import connect, set_enabled

        session = connect(conn)
        for s in schedules:
            click.echo(set_enabled(session, s, enabled).line())

    toggle.__doc__ = f"{verb.capitalize()} schedules, by name or id."
    toggle.help = toggle.__doc__
    return toggle


enable = _toggle(True)
disable = _toggle(False)


@schedule.command("delete")
@click.argument("schedules", nargs=-1, required=True, metavar="NAME|ID...")
@connection_options
def delete(schedules, conn) -> None:
    """Delete schedules, by name or id (runs they started are kept)."""
    from draslice.kfp_ops import connect, delete_schedule

    session = connect(conn)
    for s in schedules:
        gone = delete_schedule(session, s)
        click.echo(f"deleted  {gone.schedule_id}  {gone.name}")
