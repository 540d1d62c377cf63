"""A small JSON client for the test control plane's REST API (``requests``, mutual TLS or a
bearer token), with the few verbs the tests use: get, list, create (optionally dry-run),
server-side apply, status patches, delete and waiting on a condition.

The tests talk REST directly rather than through the ``kubernetes`` client's generated models,
because several of the kinds used here (ResourceSlice v1, MutatingAdmissionPolicy v1) are newer
than the models it ships.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

# kind -> (API path prefix, plural, namespaced) for the kinds the tests create themselves
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "PersistentVolume": ("/api/v1", "persistentvolumes", False),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "MutatingAdmissionPolicy": ("/apis/admissionregistration.k8s.io/v1",
                                "mutatingadmissionpolicies", False),
    "MutatingAdmissionPolicyBinding": ("/apis/admissionregistration.k8s.io/v1",
                                       "mutatingadmissionpolicybindings", False),
    "SubjectAccessReview": ("/apis/authorization.k8s.io/v1", "subjectaccessreviews", False),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
}


class KubeError(Exception):
    """A non-2xx answer: the HTTP status and the server's Status message."""

    def __init__(self, status: int, message: str, reason: str = ""):
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status, self.message, self.reason = status, message, reason


@dataclass
class Kube:
    server: str
    ca: str
    cert: tuple[str, str] | None = None
    token: str | None = None
    timeout: float = 15.0

    def __post_init__(self):
        self.session = requests.Session()
        if self.cert:
            self.session.cert = self.cert
        if self.token:
            self.session.headers["Authorization"] = f"Bearer {self.token}"

    # --- paths --------------------------------------------------------------------------------

    @staticmethod
    def path(kind: str, name: str | None = None, namespace: str | None = None,
             api_version: str | None = None) -> str:
        prefix, plural, namespaced = KINDS[kind]
        if api_version:
            prefix = ("/api/" if "/" not in api_version else "/apis/") + api_version
        ns = f"/namespaces/{namespace}" if namespaced and namespace else ""
        return f"{prefix}{ns}/{plural}" + (f"/{name}" if name else "")

    def path_of(self, obj: dict) -> str:
        meta = obj.get("metadata", {})
        return self.path(obj["kind"], meta.get("name"), meta.get("namespace"),
                         obj.get("apiVersion"))

    # --- verbs --------------------------------------------------------------------------------

    def request(self, method: str, path: str, body=None, params=None,
                content_type: str = "application/json", raw: bool = False):
        """The JSON answer (``raw``: the body's text, e.g. a pod's log); KubeError on >= 300."""
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        resp = self.session.request(method, self.server + path, data=data, params=params,
                                    headers={"Content-Type": content_type,
                                             "Accept": "application/json"},
                                    timeout=self.timeout,
                                    # per request: requests lets $REQUESTS_CA_BUNDLE override
                                    # a session's CA, and this machine sets it
                                    verify=self.ca)
        if raw and resp.status_code < 300:
            return resp.text
        try:
            payload = resp.json()
        except ValueError:
            payload = {"message": resp.text[:500]}
        if resp.status_code >= 300:
            raise KubeError(resp.status_code, payload.get("message", ""),
                            payload.get("reason", ""))
        return payload

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        return self.request("GET", self.path(kind, name, namespace))

    def list(self, kind: str, namespace: str | None = None, **params) -> list[dict]:
        return self.request("GET", self.path(kind, None, namespace), params=params)["items"]

    def create(self, obj: dict, dry_run: bool = False) -> dict:
        path = self.path_of({**obj, "metadata": {**obj["metadata"], "name": None}})
        return self.request("POST", path, obj, params={"dryRun": "All"} if dry_run else None)

    def apply(self, obj: dict, manager: str = "draslice-tests") -> dict:
        """Server-side apply (PATCH application/apply-patch+yaml), forcing conflicts."""
        return self.request("PATCH", self.path_of(obj), obj,
                            params={"fieldManager": manager, "force": "true"},
                            content_type="application/apply-patch+yaml")

    def patch_status(self, kind: str, name: str, patch: dict, namespace: str | None = None):
        return self.request("PATCH", self.path(kind, name, namespace) + "/status", patch,
                            content_type="application/merge-patch+json")

    def delete(self, kind: str, name: str, namespace: str | None = None,
               missing_ok: bool = True) -> None:
        """Delete at once (grace period 0: no kubelet will confirm a pod's end)."""
        try:
            self.request("DELETE", self.path(kind, name, namespace),
                         {"gracePeriodSeconds": 0, "propagationPolicy": "Background"})
        except KubeError as exc:
            if not (missing_ok and exc.status == 404):
                raise

    def delete_all(self, kind: str, namespace: str | None = None) -> None:
        for obj in self.list(kind, namespace):
            self.delete(kind, obj["metadata"]["name"], obj["metadata"].get("namespace"))

    def wait(self, what: str, probe: Callable[[], object], timeout: float = 60.0,
             interval: float = 0.1):
        """Poll ``probe`` until it returns something truthy; fail naming ``what``."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = probe()
                if value:
                    return value
            except KubeError as exc:  # not there yet
                last_error = exc
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                           + (f" (last error: {last_error})" if last_error else ""))
