"""What can go wrong talking to a KFP server, as one clear message each.

Every call into ``kfp.Client`` goes through :func:`api_errors`, which turns the generated
client's exceptions (``kfp_server_api.ApiException``, urllib3 connection errors) into
:class:`~draslice.errors.DrasliceError` subclasses: the CLI prints ``error: ...`` and
exits with the class's code, and a notebook gets an exception whose text says what to do.
Server text is cut short and scrubbed of the caller's secrets before it is shown.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from draslice.errors import DrasliceError
from draslice.kfp_ops.answers import NotKfpAnswer

NATIVE_FIELD = "podResourceClaims"
_MAX_SERVER_TEXT = 400


class KfpError(DrasliceError):
    """Base class for problems reported by, or on the way to, the KFP server."""

    exit_code = 10


class KfpUnreachable(KfpError):
    """No HTTP answer at all: wrong host or port, DNS, TLS, a proxy in the way."""

    exit_code = 7


class KfpAuthError(KfpError):
    """The server answered 401 or 403."""

    exit_code = 8


class KfpNotFound(KfpError):
    """The server answered 404: a wrong pipeline, version, run, experiment or schedule id."""

    exit_code = 9


class NativeClaimsRejected(KfpError):
    """A native-mode pipeline reached a backend without kubeflow/pipelines#14243."""

    exit_code = 11


class RunNotFinished(KfpError):
    """``--wait`` gave up before the run reached a final state."""

    exit_code = 6


def server_message(body: str | bytes | None) -> str:
    """The human part of a KFP error body (``{"error", "code", "message", "details"}``)."""
    if body is None:
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        text = str(doc.get("message") or doc.get("error") or text)
    text = " ".join(text.split())
    return text if len(text) <= _MAX_SERVER_TEXT else text[: _MAX_SERVER_TEXT - 3] + "..."


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced, so no error message can leak a token or cookie."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "<redacted>")
    return text


def _native_hint() -> str:
    return (
        f"this KFP backend does not know the '{NATIVE_FIELD}' field that native claim mode "
        "writes into the pipeline's platform spec (it needs a KFP backend with "
        "kubeflow/pipelines#14243; KFP 2.17 and older accept the upload but reject every run). "
        "Use the policy-mode variant instead (for example --variant sft.policy.mig-1g-6gb) "
        "and install the admission policy from manifests/ on the cluster"
    )


def translate(err: BaseException, host: str, action: str, secrets: Iterable[str] = ()) -> KfpError:
    """The :class:`KfpError` that says what ``err`` means for ``action`` against ``host``."""
    import kfp_server_api  # here, not at the top: `draslice upload --help` needs no client
    import urllib3

    secrets = list(secrets)
    if isinstance(err, NotKfpAnswer):
        return KfpError(
            f"{action}: {host} answered {scrub(str(err), secrets)}: not the KFP API's answer. "
            "Check --host: the KFP API's address (for example http://127.0.0.1:8080 after "
            "kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80, or "
            "https://<kubeflow host>/pipeline)"
        )
    if isinstance(err, kfp_server_api.ApiException):
        status = err.status or 0
        detail = scrub(server_message(err.body), secrets)
        if NATIVE_FIELD in (detail + str(err.body or "")):
            return NativeClaimsRejected(f"{action} at {host} was rejected: {_native_hint()}. "
                                        f"Server said: {detail}")
        if status == 0:  # the generated client's wrapper for TLS failures
            reason = scrub(" ".join(str(err.reason or "").split()), secrets)
            return KfpUnreachable(
                f"{action}: no TLS connection to {host} ({reason}). If the server uses a "
                "private CA, pass its bundle with --ca-bundle PATH"
            )
        if status == 401:
            return KfpAuthError(
                f"{action}: {host} answered 401 Unauthorized: the credentials were missing or "
                "rejected. Give a token with --token-env NAME or --token-file PATH, use "
                "--sa-token inside the cluster, or --cookies-file for Dex/oauth2-proxy"
                + (f". Server said: {detail}" if detail else "")
            )
        if status == 403:
            return KfpAuthError(
                f"{action}: {host} answered 403 Forbidden: the credentials are valid but may not "
                "do this (multi-user Kubeflow: check --namespace and your profile's "
                "contributors)" + (f". Server said: {detail}" if detail else "")
            )
        if status == 404:
            return KfpNotFound(
                f"{action}: {host} answered 404 Not Found: a wrong pipeline, version, run or "
                "schedule id, or a --host without the KFP API behind it"
                + (f". Server said: {detail}" if detail else "")
            )
        return KfpError(
            f"{action}: {host} answered HTTP {status} {err.reason or ''}".rstrip()
            + (f": {detail}" if detail else "")
        )
    if isinstance(err, (urllib3.exceptions.HTTPError, ConnectionError, OSError)):
        reason = getattr(err, "reason", None) or err
        text = scrub(" ".join(str(reason).split()), secrets)
        if isinstance(reason, urllib3.exceptions.SSLError):
            return KfpUnreachable(
                f"{action}: TLS to {host} failed ({text}). If the server uses a private CA, "
                "pass its bundle with --ca-bundle PATH (verification stays on)"
            )
        return KfpUnreachable(
            f"{action}: cannot reach the KFP API at {host} ({text}). Check --host (with "
            "http:// or https:// and the port), or port-forward it: kubectl -n kubeflow "
            "port-forward svc/ml-pipeline-ui 8080:80 and --host http://127.0.0.1:8080"
        )
    raise TypeError(f"not a KFP client error: {err!r}")


@contextmanager
def api_errors(host: str, action: str, secrets: Iterable[str] = ()) -> Iterator[None]:
    """Run a block of ``kfp.Client`` calls; re-raise their errors as :class:`KfpError`."""
    import kfp_server_api
    import urllib3

    try:
        yield
    except (kfp_server_api.ApiException, urllib3.exceptions.HTTPError, ConnectionError,
            NotKfpAnswer) as err:
        raise translate(err, host, action, secrets) from None
