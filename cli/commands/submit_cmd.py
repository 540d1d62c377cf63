"""``draslice submit``: one run on a KFP server, optionally waited for."""

from __future__ import annotations

import sys

import click

from draslice.cli.commands.kfp_options import connection_options, variant_help

DEFAULT_VARIANT = "sft.policy.mig-1g-6gb"


@click.command("submit")
@click.option("--variant", default=None, metavar="ID|PATH", help=variant_help(DEFAULT_VARIANT))
@click.option("--upload", "upload_first", is_flag=True,
              help="Upload the variant first (idempotent) and run that version, so the run is "
                   "linked to the pipeline in the UI.")
@click.option("--pipeline-id", default=None, help="Run an uploaded pipeline (with --version-id).")
@click.option("--version-id", default=None, help="The uploaded version to run.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A pipeline input, typed against the pipeline's inputs (e.g. steps=60, "
                   "on_missing_dra=fail). Repeat for several; unknown keys are refused.")
@click.option("--experiment", default="draslice", show_default=True,
              help="Experiment to put the run in (created when missing).")
@click.option("--run-name", default=None, help="[default: '<pipeline name> <UTC time>']")
@click.option("--service-account", default=None,
              help="Kubernetes service account for the run's pods.")
@click.option("--caching/--no-caching", default=None,
              help="Override the compiled caching settings for every task.")
@click.option("--wait", "wait_for", is_flag=True,
              help="Wait for the final state, print progress, exit with the run's code: "
                   "SUCCEEDED 0, FAILED/ERROR/SKIPPED 1, CANCELED 5, timeout 6.")
@click.option("--timeout", default=3600.0, show_default=True, type=click.FloatRange(min=1),
              help="With --wait: seconds before giving up (the run goes on).")
@click.option("--poll", default=5.0, show_default=True, type=click.FloatRange(min=0.01),
              help="With --wait: seconds between status reads.")
@click.option("--compiled-dir", default="compiled", show_default=True,
              type=click.Path(file_okay=False), help="Where the committed YAML is.")
@connection_options
def submit(variant, upload_first, pipeline_id, version_id, params, experiment, run_name,
           service_account, caching, wait_for, timeout, poll, compiled_dir, conn) -> None:
    """Start a pipeline run on KFP from a compiled variant or an uploaded version.

    Parameters are checked against the pipeline's inputs before anything is sent. A
    native-mode variant on a backend without DRA support (KFP 2.17 and older) is refused by
    the server; draslice says so and points to the policy-mode variant.

    \b
    Examples:
      draslice submit --host http://127.0.0.1:8080 --param steps=60 --wait
      draslice submit --variant sft.policy.shared-gpu-timeslice --upload --experiment nightly
      draslice submit --pipeline-id P --version-id V --namespace team-a --wait
    """
    from draslice.errors import InvalidParameter
    from draslice.kfp_ops import connect, resolve_package, upload, wait
    from draslice.kfp_ops import submit as do_submit
    from draslice.kfp_ops.package import arguments_for, default_image_warning

    if (pipeline_id is None) != (version_id is None):
        raise InvalidParameter("--pipeline-id/--version-id", pipeline_id or version_id,
                               "give both")
    if version_id and (variant or upload_first):
        raise InvalidParameter("--version-id", version_id,
                               "runs an uploaded version; leave out --variant and --upload")
    package = None if version_id else resolve_package(variant or DEFAULT_VARIANT, compiled_dir)
    if package is not None:
        params = arguments_for(package, params)  # refused here, before anything is sent
        warning = default_image_warning([package])
        if warning:
            click.echo(warning, err=True)
    if package is not None and package.native_claims:
        click.echo("note: native claim mode (podResourceClaims) needs a KFP backend with "
                   "kubeflow/pipelines#14243", err=True)
    session = connect(conn)
    if upload_first:
        up = upload(session, package)
        click.echo(f"version   {up.version_name}  id={up.version_id}  "
                   f"({'created' if up.created_version else 'unchanged'})")
        pipeline_id, version_id = up.pipeline_id, up.version_id
    run = do_submit(
        session, None if version_id else package, pipeline_id=pipeline_id,
        version_id=version_id, params=params, experiment=experiment, run_name=run_name,
        service_account=service_account, enable_caching=caching,
    )
    click.echo(f"run       {run.run_name}  id={run.run_id}  experiment={run.experiment_name}")
    click.echo(f"UI        {run.url}")
    if not wait_for:
        return
    outcome = wait(session, run.run_id, timeout_s=timeout, poll_s=poll, progress=click.echo)
    click.echo(f"final     {outcome.state}" + (f": {outcome.error}" if outcome.error else ""))
    sys.exit(outcome.exit_code)
