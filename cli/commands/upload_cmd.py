"""``draslice upload``: compiled pipelines onto a KFP server, a new version only on change."""

from __future__ import annotations

import click

from draslice.cli.commands.kfp_options import connection_options, variant_help

DEFAULT_VARIANT = "sft.policy.mig-1g-6gb"


@click.command("upload")
@click.option("--variant", "variants", multiple=True, metavar="ID|PATH",
              help=variant_help(DEFAULT_VARIANT) + " Repeat for several.")
@click.option("--all", "all_variants", is_flag=True,
              help="Upload every compiled variant (all templates, both modes, the canaries).")
@click.option("--name", default=None,
              help="Pipeline name in the UI (one variant only). [default: the compiled name, "
                   "e.g. draslice-sft-mig-1g-6gb]")
@click.option("--description", default=None, help="Pipeline description in the UI.")
@click.option("--compiled-dir", default="compiled", show_default=True,
              type=click.Path(file_okay=False),
              help="Where the committed YAML is; a variant missing there is compiled on the fly.")
@connection_options
def upload(variants, all_variants, name, description, compiled_dir, conn) -> None:
    """Upload compiled pipelines for the KFP UI, idempotently.

    Creates the pipeline when it is missing, otherwise adds a version named from the
    content (v<draslice version>-<12 hex of the YAML's SHA-256>). Uploading an unchanged
    pipeline again creates nothing. Prints the pipeline id, the version id and the UI link.

    \b
    Examples:
      draslice upload --host http://127.0.0.1:8080
      draslice upload --all --host https://kubeflow.example.com/pipeline --token-env KFP_TOKEN
      draslice upload --variant my/pipeline.yaml --name my-slice-sft
    """
    from draslice.errors import InvalidParameter
    from draslice.kfp_ops import connect, resolve_package
    from draslice.kfp_ops import upload as do_upload
    from draslice.kfp_ops.package import default_image_warning, variant_ids

    chosen = list(variant_ids()) if all_variants else list(variants) or [DEFAULT_VARIANT]
    if name and len(chosen) > 1:
        raise InvalidParameter("--name", name, "can only rename a single --variant")
    packages = [resolve_package(v, compiled_dir) for v in chosen]
    warning = default_image_warning(packages)
    if warning:
        click.echo(warning, err=True)
    session = connect(conn)
    for package in packages:
        result = do_upload(session, package, name=name, description=description)
        for line in result.lines():
            click.echo(line)
