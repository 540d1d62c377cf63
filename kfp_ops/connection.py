"""How draslice reaches a KFP server: host, credentials, TLS, namespace.

A :class:`KfpConnection` holds only *where* secrets are (an environment variable's name, a
file path), never a secret itself, so it can be printed, logged and put in a dataclass repr.
:func:`connect` reads the secrets, hands them to the real ``kfp.Client`` and keeps them in the
session only to scrub them out of error messages and log records; every request adds the
credentials it really sent (:mod:`draslice.kfp_ops.transport`), so a rotated token file is
covered too.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from draslice.errors import InvalidParameter
from draslice.kfp_ops import answers, transport
from draslice.kfp_ops.errors import api_errors, scrub

if TYPE_CHECKING:  # kfp itself is imported on connecting: the CLI's --help needs none of it
    import kfp

log = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "KFP_TOKEN"


@dataclass(frozen=True)
class KfpConnection:
    """Where the KFP API is and how to authenticate; safe to print (it holds no secret).

    Credentials, at most one of: ``token_env`` (name of an environment variable holding a
    bearer token), ``token_file`` (a file holding one; re-read on every request, so a rotated
    projected token keeps working), ``sa_token`` (the in-cluster pipelines service-account
    token through ``kfp.client.ServiceAccountTokenVolumeCredentials``; ``sa_token_path``
    overrides its default path). ``cookies_file`` adds a Cookie header (Dex/oauth2-proxy
    session cookie, ``name=value; name2=value2``) and can be combined with a token.
    """

    host: str | None = None
    namespace: str | None = None
    token_env: str | None = None
    token_file: str | None = None
    sa_token: bool = False
    sa_token_path: str | None = None
    cookies_file: str | None = None
    verify_tls: bool = True
    ca_bundle: str | None = None
    ui_host: str | None = None
    progress: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    def resolved_host(self) -> str:
        from kfp.client.client import KF_PIPELINES_ENDPOINT_ENV

        host = self.host or os.environ.get(KF_PIPELINES_ENDPOINT_ENV)
        if not host:
            raise InvalidParameter(
                "--host", host,
                f"give the KFP API address, e.g. --host http://127.0.0.1:8080, or set "
                f"{KF_PIPELINES_ENDPOINT_ENV} (in a cluster pod: "
                "http://ml-pipeline.kubeflow.svc.cluster.local:8888)",
            )
        return checked_url(host, "--host")

    def resolved_ui_host(self, host: str) -> str:
        return checked_url(self.ui_host, "--ui-host") if self.ui_host else host


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def checked_url(url: str, option: str) -> str:
    """``url`` as an http(s) base URL (``https://`` added when no scheme is given), refused
    with another scheme or with credentials in it."""
    scheme = _SCHEME.match(url)
    if scheme and scheme.group(1).lower() not in ("http", "https"):
        raise InvalidParameter(option, url, f"the KFP API speaks HTTP: give an http:// or "
                                            f"https:// URL, not {scheme.group(1)}://")
    if not scheme:
        url = "https://" + url
    parts = urlsplit(url)
    if "@" in parts.netloc:  # user:password@ would be printed with every error
        shown = parts._replace(netloc="<credentials>@" + parts.netloc.rpartition("@")[2])
        raise InvalidParameter(
            option, shown.geturl(),
            "must not carry credentials (user:password@): kfp.Client does not send them, "
            "and every error message would show them. Give a token with --token-env NAME "
            "or --token-file PATH, or a session cookie with --cookies-file PATH",
        )
    return url.rstrip("/")


@dataclass
class KfpSession:
    """A connected ``kfp.Client`` plus what draslice needs around it."""

    client: kfp.Client
    host: str
    ui_host: str
    namespace: str | None
    secrets: set[str] = field(default_factory=set, repr=False)
    transport: transport.Transport | None = field(default=None, repr=False)

    @contextlib.contextmanager
    def errors(self, action: str):
        """Context manager: KFP client errors inside become clear :class:`KfpError` s; a
        request still waiting after a few seconds is reported as part of ``action``."""
        if self.transport is not None:
            self.transport.action = action
        with api_errors(self.host, action, self.secrets):
            yield

    def ui_link(self, fragment: str) -> str:
        return f"{self.ui_host}/#/{fragment.lstrip('/')}"


def _client_class(policy: transport.Transport) -> type[kfp.Client]:
    """``kfp.Client`` whose every request goes through ``policy`` and whose every answer is
    checked (:mod:`draslice.kfp_ops.answers`), and whose health check answers once instead of
    retrying for 25 seconds.

    The stock client retries ``healthz`` five times, five seconds apart, and logs a traceback
    each time; for a wrong host or a rejected token the user should hear why at once.
    """
    import kfp

    class _Client(kfp.Client):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._checked()

        def _checked(self):
            """The one ApiClient behind every service, with the checks installed (once; the
            stock ``__init__`` may ask healthz before it returns)."""
            api_client = self._healthz_api.api_client
            if not getattr(api_client, "_draslice_checked", False):
                answers.install(api_client)
                policy.install(api_client)
                api_client._draslice_checked = True
            return api_client

        def get_kfp_healthz(self, sleep_duration: int = 5):
            self._checked()
            return self._healthz_api.healthz_service_get_healthz()

    return _Client


class _Scrubber(logging.Filter):
    """Takes every secret of every session out of log records: ``kfp_server_api`` logs each
    answer's body at DEBUG, and a server may echo the token back in one."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[set[str]] = []

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = set().union(*self.sources)
        if secrets:
            message = record.getMessage()
            clean = scrub(message, secrets)
            if clean != message:
                record.msg, record.args = clean, ()
        return True


_SCRUBBER = _Scrubber()
# The loggers of the packages a request goes through; a filter acts on the records of the
# logger it is on, not on those its children pass up, so each existing one gets it.
_LOGGED_PACKAGES = ("kfp", "kfp_server_api", "urllib3", "draslice")


def _scrub_logs(secrets: set[str]) -> None:
    if not any(source is secrets for source in _SCRUBBER.sources):
        _SCRUBBER.sources.append(secrets)
    names = {"kfp_server_api.rest", "urllib3.connectionpool", __name__, *(
        name for name in logging.root.manager.loggerDict
        if name.split(".")[0] in _LOGGED_PACKAGES)}
    for name in names:
        logger = logging.getLogger(name)
        if _SCRUBBER not in logger.filters:
            logger.addFilter(_SCRUBBER)


@contextlib.contextmanager
def quiet_client():
    """Keep ``kfp.Client``'s own prints ("Run details: ...") and warnings off our output."""
    buf = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(buf):
        warnings.simplefilter("ignore", FutureWarning)
        yield
    if buf.getvalue().strip():
        log.debug("kfp.Client said: %s", buf.getvalue().strip())


def _read_secret_file(path: str, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise InvalidParameter(what, path, "no such file")
    value = p.read_text().strip()
    if not value:
        raise InvalidParameter(what, path, "the file is empty")
    return value


def _credentials(conn: KfpConnection) -> tuple[dict, list[str]]:
    """The ``kfp.Client`` keyword arguments for ``conn``'s credentials, and the secrets."""
    from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

    chosen = [n for n, on in (("--token-env", conn.token_env), ("--token-file", conn.token_file),
                              ("--sa-token", conn.sa_token)) if on]
    if len(chosen) > 1:
        raise InvalidParameter("credentials", " and ".join(chosen), "choose one token source")
    kwargs: dict = {}
    secrets: list[str] = []
    if conn.token_env:
        token = os.environ.get(conn.token_env, "").strip()
        if not token:
            raise InvalidParameter(
                "--token-env", conn.token_env, "that environment variable is unset or empty"
            )
        kwargs["existing_token"] = token
        secrets.append(token)
    elif conn.token_file:
        secrets.append(_read_secret_file(conn.token_file, "--token-file"))
        kwargs["credentials"] = ServiceAccountTokenVolumeCredentials(path=conn.token_file)
    elif conn.sa_token:
        creds = ServiceAccountTokenVolumeCredentials(path=conn.sa_token_path)
        secrets.append(_read_secret_file(creds._token_path, "--sa-token"))
        kwargs["credentials"] = creds
    if conn.cookies_file:
        cookies = _read_secret_file(conn.cookies_file, "--cookies-file")
        kwargs["cookies"] = cookies
        secrets.extend([cookies, *(c.split("=", 1)[-1].strip() for c in cookies.split(";"))])
    return kwargs, secrets


def connect(conn: KfpConnection) -> KfpSession:
    """A :class:`KfpSession` on the real ``kfp.Client``, checked with one health call."""
    host = conn.resolved_host()
    ui_host = conn.resolved_ui_host(host)
    if conn.ca_bundle and not Path(conn.ca_bundle).is_file():
        raise InvalidParameter("--ca-bundle", conn.ca_bundle, "no such file")
    kwargs, found = _credentials(conn)
    secrets = set(found)
    _scrub_logs(secrets)
    if not conn.verify_tls:
        log.warning("TLS certificate verification is OFF for %s", host)
    policy = transport.Transport(host, secrets, conn.progress, transport.REQUEST_DEADLINE_S)
    with api_errors(host, "connecting", secrets), quiet_client():
        client = _client_class(policy)(
            host=host,
            namespace=conn.namespace or "kubeflow",
            ssl_ca_cert=conn.ca_bundle,
            verify_ssl=conn.verify_tls,
            ui_host=ui_host,
            **kwargs,
        )
        client.get_kfp_healthz()
    _scrub_logs(secrets)  # loggers kfp made while connecting
    return KfpSession(client=client, host=host, ui_host=ui_host,
                      namespace=conn.namespace or None, secrets=secrets, transport=policy)
