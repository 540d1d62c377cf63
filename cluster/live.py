"""Read the DRA objects from a live cluster with the official ``kubernetes`` client.

Kubeconfig (``--kubeconfig``/``--context`` or the usual defaults) on an admin's machine; the
in-cluster service account inside a task pod. The objects are read as raw JSON on the
``resource.k8s.io/v1`` paths, which works with any client version (the generated models of older
clients do not know v1), page by page (``limit``/``continue``).

Permissions are the usual failure: a 403 says which verb and resource the identity lacks and
points at ``draslice manifests rbac``. A 404 on the group means the cluster has no
``resource.k8s.io/v1`` (Kubernetes < 1.34 or DRA off): that is "no DRA", which the caller may
skip. Reading other namespaces' claims, nodes and DaemonSets is optional: without the rights,
the report says what it could not see.

Nothing else is taken on trust, because "no DRA" lets a pipeline skip its GPU steps: a 404
counts as "no DRA" only when the server's discovery (``/apis``) is a Kubernetes ``APIGroupList``
that does not list ``resource.k8s.io/v1`` (a real kube-apiserver answers a group it does not
serve with a plain-text "404 page not found", so the 404 itself proves nothing); any answer that
is not JSON, or not the kind of object asked for (a plain web server, a proxy's error page), is
an error naming the server. Each GET has one deadline, ``READ_TIMEOUT_S`` of wall time, for all
of it: connecting, the retries of a refused connection, the TLS handshake, every byte of the
answer. A socket timeout alone would not keep that promise (it restarts at each byte a server
trickles, at each retry, and ``/version`` had none), so the request runs in a thread that the
command stops waiting for at the deadline; past ``PROGRESS_AFTER_S`` the wait is told to
``progress`` (stderr for ``draslice preflight``). A server that stalled ends the read: no other
request follows it (a fallback would wait once more). A kubeconfig
that is not UTF-8, not YAML, or has fields of the wrong type is bad input (exit 2) naming the
file and the field.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path

import yaml

from draslice.cluster.snapshot import Snapshot
from draslice.errors import DrasliceError

GROUP_PATH = "/apis/resource.k8s.io/v1"
PAGE_SIZE = 500
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0  # the wall-time deadline of one GET, its retries included
PROGRESS_AFTER_S = 5.0  # a GET still waiting after this says so, and again as often
# Who hears about a slow GET during read_cluster (a context variable: the functions between
# read_cluster and _get need not carry it).
_PROGRESS: ContextVar[Callable[[str], None] | None] = ContextVar("progress", default=None)
RBAC_HINT = (
    "grant it read access with the RBAC that `draslice manifests rbac` renders "
    "(kubectl apply -f -)"
)


class ClusterAccessError(DrasliceError):
    """The cluster could not be read (connection, credentials, permissions)."""

    exit_code = 1


class KubeconfigError(DrasliceError):
    """The kubeconfig file itself is unusable (bad input: exit 2)."""


class ClusterStalled(ClusterAccessError):
    """A GET passed its deadline: the read ends here, no fallback request is tried."""


class _NotServed(Exception):
    pass


KUBECONFIG_HINT = "a kubeconfig is the YAML file `kubectl config view --raw` shows"
# field -> the type each entry of clusters/users/contexts must have there (what the client reads)
_ENTRY_FIELDS = {
    "clusters": ("cluster", {"server": str, "certificate-authority": str,
                             "certificate-authority-data": str, "insecure-skip-tls-verify": bool,
                             "tls-server-name": str, "proxy-url": str}),
    "users": ("user", {"token": str, "tokenFile": str, "client-certificate": str,
                       "client-key": str, "client-certificate-data": str,
                       "client-key-data": str, "username": str, "password": str,
                       "exec": dict, "auth-provider": dict}),
    "contexts": ("context", {"cluster": str, "user": str, "namespace": str}),
}
_TYPE_WORDS = {str: "a string", bool: "true or false", dict: "a mapping", list: "a list"}


def _kubeconfig_paths(kubeconfig: str | None) -> list[Path]:
    """The files the client will read: --kubeconfig, else each existing $KUBECONFIG entry or
    ~/.kube/config."""
    if kubeconfig is not None:
        return [Path(kubeconfig).expanduser()]
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    paths = [Path(p).expanduser() for p in listed] or [Path("~/.kube/config").expanduser()]
    return [p for p in paths if p.exists()]


def _wrong_type(where: str, value, want: type) -> str:
    return f"{where} must be {_TYPE_WORDS[want]}, not {type(value).__name__} {value!r:.40}"


def _kubeconfig_problem(doc) -> str | None:
    """The first field of the wrong type, as a phrase; None when the shape is usable."""
    if not isinstance(doc, dict):
        return (f"the document must be a mapping (with clusters, users, contexts), not "
                f"{type(doc).__name__}")
    current = doc.get("current-context")
    if current is not None and not isinstance(current, str):
        return _wrong_type("current-context", current, str)
    for section, (inner, fields) in _ENTRY_FIELDS.items():
        entries = doc.get(section)
        if entries is None:
            continue
        if not isinstance(entries, list):
            return _wrong_type(section, entries, list)
        for i, entry in enumerate(entries):
            where = f"{section}[{i}]"
            if not isinstance(entry, dict):
                return _wrong_type(where, entry, dict)
            if not isinstance(entry.get("name"), str):
                return _wrong_type(f"{where}.name", entry.get("name"), str)
            body = entry.get(inner)
            if body is None:
                continue
            if not isinstance(body, dict):
                return _wrong_type(f"{where}.{inner}", body, dict)
            for key, want in fields.items():
                if key in body and body[key] is not None and not isinstance(body[key], want):
                    return _wrong_type(f"{where}.{inner}.{key}", body[key], want)
            server = body.get("server") if inner == "cluster" else None
            if server is not None and not server.startswith(("https://", "http://")):
                return f"{where}.cluster.server must be an http(s):// URL, not {server!r:.60}"
    return None


def check_kubeconfig(path: Path) -> None:
    """Read the kubeconfig before the client does, so that a broken file is one line naming it
    (the client would raise a YAML, Unicode or AttributeError traceback)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise KubeconfigError(f"kubeconfig {path}: no such file (or use --snapshot FILE to "
                              "work from a `kubectl get ... -o yaml` dump)") from None
    except OSError as exc:
        raise KubeconfigError(f"kubeconfig {path}: cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KubeconfigError(f"kubeconfig {path}: not UTF-8 text (byte {exc.start} is "
                              f"{data[exc.start]:#04x}); {KUBECONFIG_HINT}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise KubeconfigError(f"kubeconfig {path}:{where}: not valid YAML ({problem}); "
                              f"{KUBECONFIG_HINT}") from None
    problem = _kubeconfig_problem(doc)
    if problem:
        raise KubeconfigError(f"kubeconfig {path}: {problem}; {KUBECONFIG_HINT}")


def api_client(kubeconfig: str | None = None, context: str | None = None):
    """A configured ``kubernetes.client.ApiClient``: in-cluster in a pod, else kubeconfig."""
    import urllib3
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            paths = _kubeconfig_paths(kubeconfig)
            for path in paths:
                check_kubeconfig(path)
            config.load_kube_config(config_file=kubeconfig, context=context,
                                    client_configuration=cfg)
    except (ConfigException, OSError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ClusterAccessError(
            f"cannot load cluster credentials from {where}: {exc} (use --kubeconfig/--context, "
            "or --snapshot FILE to work from a `kubectl get ... -o yaml` dump)"
        ) from None
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a shape not checked above
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise KubeconfigError(f"kubeconfig {where}: unusable ({type(exc).__name__}: {exc}); "
                              f"{KUBECONFIG_HINT}") from None
    # A stalled server must not hold preflight: no retry after a read timeout; refused
    # connections are retried twice, inside the GET's one deadline (_within_deadline).
    cfg.retries = urllib3.Retry(total=2, connect=2, read=False, status=0, redirect=0)
    return client.ApiClient(cfg)


def _who(api) -> str:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        ns = pod_namespace() or "?"
        return f"this pod's service account (namespace {ns})"
    return "your kubeconfig identity"


def pod_namespace() -> str | None:
    """This pod's namespace (its service account's), or None outside a pod."""
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip()
    except OSError:
        return None


def _get(api, path: str, query: list | None = None):
    """GET ``path``; the raw response (``status``, ``data``, ``headers``), read in full within
    ``READ_TIMEOUT_S`` of wall time.

    Transport failures (refused, reset, timed out, cut off mid-answer) become one
    :class:`ClusterAccessError` naming the server (:class:`ClusterStalled` past the deadline);
    HTTP errors stay ``ApiException``."""
    from urllib3.exceptions import HTTPError, MaxRetryError, ReadTimeoutError

    host = api.configuration.host

    def request():
        resp = api.call_api(
            path, "GET", query_params=query or [], header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
            _request_timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
        )
        resp.data  # noqa: B018 (read the whole body here, inside the deadline and the except)
        return resp

    try:
        return _within_deadline(request, host, path)
    except (ReadTimeoutError, MaxRetryError) as exc:
        if not isinstance(getattr(exc, "reason", exc), ReadTimeoutError):
            raise ClusterAccessError(f"cannot reach the API server {host}: "
                                     f"{_redact(api, exc)}") from None
        raise _stalled(host, path) from None
    except HTTPError as exc:
        raise ClusterAccessError(f"cannot reach the API server {host}: {_redact(api, exc)}") \
            from None


def _stalled(host: str, path: str) -> ClusterStalled:
    return ClusterStalled(f"the API server {host} did not answer GET {path} within "
                          f"{READ_TIMEOUT_S:g} s")


def _within_deadline(request: Callable, host: str, path: str):
    """``request()``'s result or exception, or :class:`ClusterStalled` once ``READ_TIMEOUT_S``
    have passed. The request runs in a daemon thread, left to its socket timeouts when the
    deadline passes (the command ends; nothing waits for it)."""
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["value"] = request()
        except BaseException as exc:  # noqa: BLE001 (handed to the waiting thread as it is)
            outcome["error"] = exc

    start = time.monotonic()
    worker = threading.Thread(target=work, name=f"GET {path}", daemon=True)
    worker.start()
    deadline, tell = start + READ_TIMEOUT_S, start + PROGRESS_AFTER_S
    while True:
        worker.join(max(0.0, min(deadline, tell) - time.monotonic()))
        if not worker.is_alive():
            break
        now = time.monotonic()
        if now >= deadline:
            raise _stalled(host, path)
        if now >= tell:
            progress = _PROGRESS.get()
            if progress is not None:
                progress(f"waiting for the API server {host}: GET {path}, {now - start:.0f} s "
                         f"of {READ_TIMEOUT_S:g} s")
            tell += PROGRESS_AFTER_S
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _redact(api, value) -> str:
    """``value`` as text without the bearer token (a server may echo it back)."""
    text = str(value)
    token = (api.configuration.api_key or {}).get("authorization", "")
    for secret in {token, token.removeprefix("Bearer ")} - {"", "Bearer "}:
        text = text.replace(secret, "<redacted>")
    return text


def _json(api, resp, path: str, kind: str) -> dict:
    """The answer as a JSON object of ``kind`` (``...List`` matches any list kind); anything
    else means the kubeconfig's server is not a Kubernetes API server."""
    host = api.configuration.host
    ctype = resp.headers.get("Content-Type") or "no Content-Type"
    try:
        body = json.loads(resp.data)
    except (ValueError, UnicodeDecodeError):
        raise ClusterAccessError(
            f"{host} answered GET {path} with {len(resp.data)} bytes of {ctype} that are not "
            "JSON: is the kubeconfig's server a Kubernetes API server?") from None
    got = body.get("kind") if isinstance(body, dict) else type(body).__name__
    fits = got == kind or (kind == "...List" and isinstance(got, str) and got.endswith("List"))
    if not isinstance(body, dict) or not fits or (
            kind == "...List" and not isinstance(body.get("items") or [], list)):
        want = "a list" if kind == "...List" else f"an {kind}"
        raise ClusterAccessError(
            f"{host} answered GET {path} with JSON of kind {got!r:.40}, not {want}: is the "
            "kubeconfig's server a Kubernetes API server?")
    return body


def _discovery(api) -> dict | None:
    """The server's ``/apis`` discovery if it is Kubernetes' (an ``APIGroupList``), else None."""
    from kubernetes.client.exceptions import ApiException

    try:
        return _json(api, _get(api, "/apis"), "/apis", "APIGroupList")
    except ClusterStalled:
        raise
    except (ApiException, ClusterAccessError):
        return None


def _group_versions(discovery: dict, group: str) -> list[str]:
    for entry in discovery.get("groups") or []:
        if isinstance(entry, dict) and entry.get("name") == group:
            return [v["groupVersion"] for v in entry.get("versions") or []
                    if isinstance(v, dict) and isinstance(v.get("groupVersion"), str)]
    return []


def list_all(api, path: str, resource: str, scope: str) -> list[dict]:
    """Every object of a list endpoint, following ``continue`` tokens."""
    from kubernetes.client.exceptions import ApiException

    items: list[dict] = []
    token = None
    host = api.configuration.host
    while True:
        query = [("limit", PAGE_SIZE)] + ([("continue", token)] if token else [])
        try:
            resp = _get(api, path, query)
        except ApiException as exc:
            if exc.status == 404:
                _not_served(api, path)
            if exc.status in (401, 403):
                detail = _server_message(exc)
                raise ClusterAccessError(
                    f"{_who(api)} may not list {resource} ({scope}): HTTP {exc.status}"
                    f"{': ' + detail if detail else ''}. {RBAC_HINT}"
                ) from None
            raise ClusterAccessError(
                f"listing {resource} ({scope}) failed: HTTP {exc.status} {exc.reason}: "
                f"{_redact(api, _server_message(exc))[:300]}"
            ) from None
        body = _json(api, resp, path, "...List")
        kind = body["kind"].removesuffix("List")
        api_version = body.get("apiVersion", "")
        for item in body.get("items") or []:
            if not isinstance(item, dict):
                raise ClusterAccessError(f"{host} answered GET {path} with a list whose items "
                                         "are not objects: not a Kubernetes API answer")
            item.setdefault("kind", kind)  # list items come without kind/apiVersion
            item.setdefault("apiVersion", api_version)
            items.append(item)
        meta = body.get("metadata")
        token = meta.get("continue") if isinstance(meta, dict) else None
        if not token:
            return items


def _not_served(api, path: str):
    """A 404 on ``path``: "not served" (``_NotServed``, carrying the versions of the group the
    server does serve) only when the server's discovery is Kubernetes' and agrees; anything
    else (a web server, a proxy) is an error naming the server."""
    host = api.configuration.host
    discovery = _discovery(api)
    if discovery is None:
        raise ClusterAccessError(
            f"{host} answered GET {path} with HTTP 404 but is not a Kubernetes API server (no "
            "Kubernetes API discovery at /apis): check the kubeconfig's server") from None
    group_version = "/".join(path.split("/")[2:4])  # /apis/<group>/<version>/...
    served = _group_versions(discovery, group_version.split("/")[0])
    if group_version in served:
        raise ClusterAccessError(
            f"{host} answered GET {path} with HTTP 404 although its discovery lists "
            f"{group_version}: a proxy in between? check the kubeconfig's server") from None
    raise _NotServed(served) from None


def _status_body(exc) -> dict | None:
    """The Kubernetes ``Status`` object an HTTP error carries, if it carries one."""
    try:
        body = json.loads(exc.body)
    except (TypeError, ValueError):
        return None
    return body if isinstance(body, dict) and body.get("kind") == "Status" else None


def _server_message(exc) -> str:
    status = _status_body(exc)
    if status is not None:
        return str(status.get("message", ""))
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else exc.body
    return f"(not a Kubernetes Status: {str(body or '')[:120]!r})"


def server_version(api) -> str | None:
    """The API server's ``gitVersion`` (``v1.35.2``) from ``/version``; None if unreadable (the
    newest supported allocator then decides, and the report says which one did). A server
    that does not answer at all is no "unreadable version": its error ends the read."""
    from kubernetes.client.exceptions import ApiException

    try:
        version = json.loads(_get(api, "/version").data).get("gitVersion")
    except (ApiException, ValueError, AttributeError):
        return None
    return version if isinstance(version, str) else None


def read_cluster(api, namespace: str | None,
                 progress: Callable[[str], None] | None = None) -> Snapshot:
    """The objects preflight needs; ``namespace``: where templates (and, failing cluster-wide
    rights, claims) are read; ``progress`` hears of a GET that is slow to answer."""
    token = _PROGRESS.set(progress)
    try:
        return _read_cluster(api, namespace)
    finally:
        _PROGRESS.reset(token)


def _read_cluster(api, namespace: str | None) -> Snapshot:
    host = api.configuration.host
    snap = Snapshot(source=f"cluster {host}")
    snap.server_version = server_version(api)
    try:
        snap.device_classes = list_all(api, f"{GROUP_PATH}/deviceclasses", "deviceclasses."
                                       "resource.k8s.io", "cluster scope")
    except _NotServed as not_served:
        snap.dra_api = False
        others = not_served.args[0]
        snap.notes.append(
            f"{host} answers 404 for {GROUP_PATH}: resource.k8s.io/v1 is not served "
            + (f"(it serves {', '.join(others)} only: DRA before GA; upgrade to Kubernetes "
               "1.34+ for the NVIDIA driver's v1 API)" if others
               else "(Kubernetes < 1.34, or DRA disabled)")
        )
        return snap
    snap.slices = list_all(api, f"{GROUP_PATH}/resourceslices",
                           "resourceslices.resource.k8s.io", "cluster scope")
    try:
        snap.claims = list_all(api, f"{GROUP_PATH}/resourceclaims",
                               "resourceclaims.resource.k8s.io", "all namespaces")
    except ClusterAccessError as exc:
        if not namespace or isinstance(exc, ClusterStalled):
            raise
        snap.claims = list_all(api, f"{GROUP_PATH}/namespaces/{namespace}/resourceclaims",
                               "resourceclaims.resource.k8s.io", f"namespace {namespace}")
        snap.notes.append(
            f"claims read in namespace {namespace} only (no cluster-wide list right): devices "
            "held by other namespaces' claims count as free here"
        )
    if namespace:
        snap.templates = list_all(
            api, f"{GROUP_PATH}/namespaces/{namespace}/resourceclaimtemplates",
            "resourceclaimtemplates.resource.k8s.io", f"namespace {namespace}",
        )
    else:
        try:
            snap.templates = list_all(api, f"{GROUP_PATH}/resourceclaimtemplates",
                                      "resourceclaimtemplates.resource.k8s.io", "all namespaces")
        except ClusterStalled:
            raise
        except ClusterAccessError as exc:
            snap.notes.append(f"claim templates not read ({exc}); pass --namespace")
    if snap.device_classes and not snap.slices:
        _read_for_diagnosis(api, snap)
    return snap


def _read_for_diagnosis(api, snap: Snapshot) -> None:
    """Nodes and DaemonSets, to compare the kubelet plugin's nodeSelector with node labels."""
    for path, resource, attr in (("/api/v1/nodes", "nodes", "nodes"),
                                 ("/apis/apps/v1/daemonsets", "daemonsets.apps", "daemonsets")):
        try:
            setattr(snap, attr, list_all(api, path, resource, "cluster scope"))
        except ClusterStalled:
            raise
        except (ClusterAccessError, _NotServed) as exc:
            snap.notes.append(f"could not read {resource} for the diagnosis: {exc}")
