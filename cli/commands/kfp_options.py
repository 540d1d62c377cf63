"""The connection options shared by ``upload``, ``submit`` and ``schedule``.

One decorator so the three commands spell host, credentials and TLS the same way; secrets
are only ever named (an environment variable, a file), never passed on the command line,
where they would land in shell history and ``ps``. A server's error is one line (the first of
its message); ``--verbose`` prints the rest of its answer (KFP's Go stack traces) under it.
"""

from __future__ import annotations

import functools
import os

import click

from draslice.kfp_ops.connection import DEFAULT_TOKEN_ENV, KfpConnection
from draslice.kfp_ops.errors import KfpError


def connection_options(func):
    """Add ``--host``, credential and TLS options; pass a :class:`KfpConnection` as ``conn``."""

    @click.option("--host", envvar="KF_PIPELINES_ENDPOINT", metavar="URL",
                  help="KFP API address, e.g. http://127.0.0.1:8080 (port-forwarded "
                       "ml-pipeline-ui) or https://kubeflow.example.com/pipeline. "
                       "[env: KF_PIPELINES_ENDPOINT]")
    @click.option("--namespace", default=None, metavar="NS",
                  help="Profile namespace on multi-user Kubeflow (leave out on standalone KFP).")
    @click.option("--token-env", default=None, metavar="NAME",
                  help=f"Read a bearer token from this environment variable. Default: "
                       f"${DEFAULT_TOKEN_ENV} when it is set and no other credential is given.")
    @click.option("--token-file", default=None, type=click.Path(dir_okay=False), metavar="PATH",
                  help="Read a bearer token from this file (re-read on every request).")
    @click.option("--sa-token", is_flag=True,
                  help="Use the in-cluster pipelines service-account token "
                       "(kfp ServiceAccountTokenVolumeCredentials; default path "
                       "/var/run/secrets/kubeflow/pipelines/token).")
    @click.option("--sa-token-path", default=None, metavar="PATH",
                  help="With --sa-token: a different projected token path.")
    @click.option("--cookies-file", default=None, type=click.Path(dir_okay=False),
                  metavar="PATH",
                  help="Send the cookies in this file ('name=value; ...'), e.g. a Dex/"
                       "oauth2-proxy session cookie.")
    @click.option("--ca-bundle", default=None, type=click.Path(dir_okay=False), metavar="PATH",
                  help="Verify the server's TLS certificate against this CA bundle.")
    @click.option("--insecure-skip-tls-verify", is_flag=True,
                  help="Do not verify the TLS certificate (verification is on by default).")
    @click.option("--ui-host", default=None, metavar="URL",
                  help="Base URL for the printed UI links, when it differs from --host.")
    @click.option("--verbose", is_flag=True,
                  help="On a server error, print the server's whole answer under the error "
                       "line (without it: the first line of its message).")
    @functools.wraps(func)
    def wrapper(*args, host, namespace, token_env, token_file, sa_token, sa_token_path,
                cookies_file, ca_bundle, insecure_skip_tls_verify, ui_host, verbose, **kwargs):
        if not (token_env or token_file or sa_token) and os.environ.get(DEFAULT_TOKEN_ENV):
            token_env = DEFAULT_TOKEN_ENV
        kwargs["conn"] = KfpConnection(
            host=host, namespace=namespace, token_env=token_env, token_file=token_file,
            sa_token=sa_token, sa_token_path=sa_token_path, cookies_file=cookies_file,
            verify_tls=not insecure_skip_tls_verify, ca_bundle=ca_bundle, ui_host=ui_host,
            progress=lambda line: click.echo(line, err=True),
        )
        try:
            return func(*args, **kwargs)
        except KfpError as err:
            err.show_detail = verbose
            raise

    return wrapper


def variant_help(default: str) -> str:
    from draslice.kfp_ops.package import variant_ids

    return (f"A compiled variant ({', '.join(variant_ids())}) or a path to a compiled "
            f"pipeline YAML. [default: {default}]")
