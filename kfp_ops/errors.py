"""What can go wrong talking to a KFP server, as one clear message each.

Every call into ``kfp.Client`` goes through :func:`api_errors`, which turns the generated
client's exceptions (``kfp_server_api.ApiException``, urllib3 connection errors) into
:class:`~draslice.errors.DrasliceError` subclasses: the CLI prints ``error: ...`` and
exits with the class's code, and a notebook gets an exception whose text says what to do.

What a server says is first scrubbed of every credential the caller configured (tokens,
cookies, passwords in URLs), whole, and only then cut: the line shows the first line of the
server's message (KFP 2.17's internal errors carry Go stack traces after it), at most
:data:`MAX_SERVER_TEXT` characters of it; the whole scrubbed answer is the error's
``detail``, which ``--verbose`` prints.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from urllib.parse import quote, quote_plus, urlsplit

from draslice.cluster.names import NATIVE_FIELD
from draslice.errors import DrasliceError
from draslice.kfp_ops.answers import NoAnswerInTime, NotKfpAnswer

MAX_SERVER_TEXT = 400  # characters of a server's message on the one error line
SNIPPET_CHARS = 80  # characters of a body that is not the KFP API's answer
MAX_DETAIL = 100_000  # characters of a server's answer that --verbose prints
MIN_SECRET = 4  # shorter values are not redacted: they would garble every message
REDACTED = "<redacted>"
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@:]+:[^\s/@]+@")
_CHECK_HOST = ("Check --host: the KFP API's address (for example http://127.0.0.1:8080 after "
               "kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80, or "
               "https://<kubeflow host>/pipeline)")


class KfpError(DrasliceError):
    """Base class for problems reported by, or on the way to, the KFP server."""

    exit_code = 10

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


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


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced, whole: as sent, JSON-escaped and URL-encoded (a
    server may echo a header in any of these), longest first (a whole Cookie header before
    the values in it), and with any ``user:password@`` of a URL."""
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_SECRET}, key=len,
                         reverse=True):
        for form in {secret, json.dumps(secret)[1:-1], quote(secret, safe=""),
                     quote_plus(secret)}:
            text = text.replace(form, REDACTED)
    return _URL_CREDENTIALS.sub(r"\1<credentials>@", text)


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters (scrub it first)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def server_text(body: str | bytes | None) -> str:
    """The whole human part of a KFP error body: its ``message`` (``{"code", "message",
    "details"}``), or ``error_message`` and then ``error_details`` (the upload endpoints'
    ``{"error_message", "error_details"}``), or the body itself when it is not KFP's JSON (a
    proxy's page, Go's plain ``404 page not found``)."""
    if body is None:
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        if isinstance(doc.get("message"), str) and doc["message"].strip():
            return doc["message"].strip()
        message, details = doc.get("error_message"), doc.get("error_details")
        if isinstance(message, str) and message.strip():
            more = details.strip() if isinstance(details, str) else ""
            return message.strip() + (f"\n{more}" if more and more != message.strip() else "")
    return text.strip()


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, at most :data:`MAX_SERVER_TEXT` characters."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    return shorten(line, MAX_SERVER_TEXT)


def _native_hint() -> str:
    return (
        f"this KFP backend does not know the '{NATIVE_FIELD}' field that native claim mode "
        "writes into the pipeline's platform spec (it needs a KFP backend with "
        "kubeflow/pipelines#14243; KFP 2.17 and older accept the upload but reject every run). "
        "Use the policy-mode variant instead (for example --variant sft.policy.mig-1g-6gb) "
        "and install the admission policy from manifests/ on the cluster"
    )


def speaks_plain_http(host: str, timeout_s: float = 2.0) -> bool:
    """Whether ``host`` (an https:// URL) answers a plain-HTTP request: the reason a TLS
    handshake with it fails is then that it does not do TLS at all."""
    parts = urlsplit(host)
    try:
        with socket.create_connection((parts.hostname, parts.port or 443),
                                      timeout=timeout_s) as sock:
            sock.sendall(b"HEAD / HTTP/1.0\r\nHost: " + (parts.hostname or "").encode()
                         + b"\r\n\r\n")
            return sock.recv(5) == b"HTTP/"
    except (OSError, UnicodeError):
        return False


def _tls_failure(action: str, host: str, reason: str) -> KfpUnreachable:
    if host.startswith("https://") and speaks_plain_http(host):
        plain = "http://" + host.removeprefix("https://")
        return KfpUnreachable(
            f"{action}: {host} does not speak TLS: it answers plain HTTP. Use --host {plain}")
    return KfpUnreachable(
        f"{action}: TLS to {host} failed ({reason}). If the server uses a private CA, pass its "
        "bundle with --ca-bundle PATH (verification stays on)")


def _not_kfp(err: NotKfpAnswer, action: str, host: str, secrets: list[str]) -> KfpError:
    if err.text is None:
        return KfpError(
            f"{action}: the server at {host} did not answer with JSON (HTTP {err.status}, "
            f"{err.size} bytes of {err.content_type} that are not text). {_CHECK_HOST}")
    text = scrub(err.text, secrets)
    snippet = shorten(text, SNIPPET_CHARS)
    detail = text[:MAX_DETAIL]
    if err.problem is None:
        return KfpError(
            f"{action}: the server at {host} did not answer with JSON (HTTP {err.status}, "
            f"{err.size} characters of {err.content_type}: {snippet!r}). {_CHECK_HOST}", detail)
    return KfpError(
        f"{action}: {host} answered HTTP {err.status} with JSON in which "
        f"{scrub(err.problem, secrets)} ({snippet!r}): not the KFP API's answer. {_CHECK_HOST}",
        detail)


def translate(err: BaseException, host: str, action: str, secrets: Iterable[str] = ()) -> KfpError:
    """The :class:`KfpError` that says what ``err`` means for ``action`` against ``host``."""
    import kfp_server_api  # here, not at the top: `draslice upload --help` needs no client
    import urllib3

    secrets = list(secrets)
    if isinstance(err, NotKfpAnswer):
        return _not_kfp(err, action, host, secrets)
    if isinstance(err, NoAnswerInTime):
        what = ("took the connection and sent nothing back" if err.connected
                else "did not take the connection")
        return KfpUnreachable(
            f"{action}: {host} did not answer within {err.seconds:.0f} s (it {what}). Check "
            "that the KFP API server is up, and --host (the port of the API, not of another "
            "service)")
    if isinstance(err, kfp_server_api.ApiException):
        status = err.status or 0
        whole = scrub(server_text(err.body), secrets)
        line = first_line(whole)
        detail = whole[:MAX_DETAIL] if whole != line else ""
        said = f". Server said: {line}" if line else ""
        if status == 0:  # the generated client's wrapper for TLS failures
            return _tls_failure(action, host, scrub(" ".join(str(err.reason or "").split()),
                                                    secrets))
        if NATIVE_FIELD in whole:
            return NativeClaimsRejected(f"{action} at {host} was rejected: {_native_hint()}"
                                        f"{said}", detail)
        if status == 401:
            return KfpAuthError(
                f"{action}: {host} answered 401 Unauthorized: the credentials were missing or "
                "rejected. Give a token with --token-env NAME or --token-file PATH, use "
                f"--sa-token inside the cluster, or --cookies-file for Dex/oauth2-proxy{said}",
                detail)
        if status == 403:
            return KfpAuthError(
                f"{action}: {host} answered 403 Forbidden: the credentials are valid but may not "
                "do this (multi-user Kubeflow: check --namespace and your profile's "
                f"contributors){said}", detail)
        if status == 404:
            return KfpNotFound(
                f"{action}: {host} answered 404 Not Found: a wrong pipeline, version, run or "
                f"schedule id, or a --host without the KFP API behind it{said}", detail)
        return KfpError(
            f"{action}: {host} answered HTTP {status} {err.reason or ''}".rstrip()
            + (f": {line}" if line else ""), detail)
    if isinstance(err, (urllib3.exceptions.HTTPError, ConnectionError, OSError)):
        reason = getattr(err, "reason", None) or err
        text = shorten(scrub(str(reason), secrets), MAX_SERVER_TEXT)
        if isinstance(reason, urllib3.exceptions.SSLError):
            return _tls_failure(action, host, text)
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
            NotKfpAnswer, NoAnswerInTime) as err:
        raise translate(err, host, action, secrets) from None
