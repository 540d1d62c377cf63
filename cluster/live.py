"""Read the DRA objects from a live cluster with the official ``kubernetes`` client.

Kubeconfig (``--kubeconfig``/``--context`` or the usual defaults) on an admin's machine; the
in-cluster service account inside a task pod. The objects are read as raw JSON on the
``resource.k8s.io/v1`` paths, which works with any client version (the generated models of
older clients do not know v1), page by page (``limit``/``continue``).

Permissions are the usual failure: a 403 says which verb and resource the identity lacks and
points at ``draslice manifests rbac``. A 404 on the group means the cluster has no
``resource.k8s.io/v1`` (Kubernetes < 1.34 or DRA off): that is "no DRA", which the caller may
skip. Reading other namespaces' claims, nodes and DaemonSets is optional: without the rights,
the report says what it could not see.
"""

from __future__ import annotations

import json
import os

from draslice.cluster.snapshot import Snapshot
from draslice.errors import DrasliceError

GROUP_PATH = "/apis/resource.k8s.io/v1"
PAGE_SIZE = 500
RBAC_HINT = (
    "grant it read access with the RBAC that `draslice manifests rbac` renders "
    "(kubectl apply -f -)"
)


class ClusterAccessError(DrasliceError):
    """The cluster could not be read (connection, credentials, permissions)."""

    exit_code = 1


class _NotServed(Exception):
    pass


def api_client(kubeconfig: str | None = None, context: str | None = None):
    """A configured ``kubernetes.client.ApiClient``: in-cluster in a pod, else kubeconfig."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            return client.ApiClient()
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, context=context,
                                client_configuration=cfg)
        return client.ApiClient(cfg)
    except (ConfigException, OSError, TypeError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ClusterAccessError(
            f"cannot load cluster credentials from {where}: {exc} (use --kubeconfig/--context, "
            "or --snapshot FILE to work from a `kubectl get ... -o yaml` dump)"
        ) from None


def _who(api) -> str:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        ns = _pod_namespace() or "?"
        return f"this pod's service account (namespace {ns})"
    return "your kubeconfig identity"


def _pod_namespace() -> str | None:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip()
    except OSError:
        return None


def list_all(api, path: str, resource: str, scope: str) -> list[dict]:
    """Every object of a list endpoint, following ``continue`` tokens."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    items: list[dict] = []
    token = None
    while True:
        query = [("limit", PAGE_SIZE)] + ([("continue", token)] if token else [])
        try:
            resp = api.call_api(
                path, "GET", query_params=query, header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
            )
        except ApiException as exc:
            if exc.status == 404:
                raise _NotServed(path) from None
            if exc.status in (401, 403):
                detail = _server_message(exc)
                raise ClusterAccessError(
                    f"{_who(api)} may not list {resource} ({scope}): HTTP {exc.status}"
                    f"{': ' + detail if detail else ''}. {RBAC_HINT}"
                ) from None
            raise ClusterAccessError(
                f"listing {resource} ({scope}) failed: HTTP {exc.status} {exc.reason}: "
                f"{_server_message(exc)}"
            ) from None
        except HTTPError as exc:
            host = api.configuration.host
            raise ClusterAccessError(f"cannot reach the API server {host}: {exc}") from None
        body = json.loads(resp.data)
        kind = body.get("kind", "List").removesuffix("List")
        api_version = body.get("apiVersion", "")
        for item in body.get("items") or []:
            item.setdefault("kind", kind)  # list items come without kind/apiVersion
            item.setdefault("apiVersion", api_version)
            items.append(item)
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return items


def _served_versions(api) -> list[str]:
    """The versions of resource.k8s.io the server does serve (discovery), if any."""
    from kubernetes.client.exceptions import ApiException

    try:
        resp = api.call_api("/apis/resource.k8s.io", "GET",
                            header_params={"Accept": "application/json"},
                            auth_settings=["BearerToken"], _preload_content=False,
                            _return_http_data_only=True)
        return [v["groupVersion"] for v in json.loads(resp.data).get("versions", [])]
    except (ApiException, ValueError, KeyError):
        return []


def _server_message(exc) -> str:
    try:
        return json.loads(exc.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        return str(exc.body or "")[:300]


def read_cluster(api, namespace: str | None) -> Snapshot:
    """The objects preflight needs; ``namespace``: where templates (and, failing cluster-wide
    rights, claims) are read."""
    host = api.configuration.host
    snap = Snapshot(source=f"cluster {host}")
    try:
        snap.device_classes = list_all(api, f"{GROUP_PATH}/deviceclasses", "deviceclasses."
                                       "resource.k8s.io", "cluster scope")
    except _NotServed:
        snap.dra_api = False
        others = _served_versions(api)
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
    except ClusterAccessError:
        if not namespace:
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
        except (ClusterAccessError, _NotServed) as exc:
            snap.notes.append(f"could not read {resource} for the diagnosis: {exc}")
