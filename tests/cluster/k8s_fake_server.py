"""A Kubernetes API server on loopback that serves recorded objects on the real list paths.

Enough of the API for preflight through the real ``kubernetes`` client: list endpoints with
``limit``/``continue`` paging, ``Status`` bodies for 403 Forbidden and 404 Not Found, and a
log of every request (method, path, query) so tests can see the paging happen.
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

RESOURCE = "/apis/resource.k8s.io/v1"
PLURALS = {
    "DeviceClass": ("deviceclasses", False),
    "ResourceSlice": ("resourceslices", False),
    "ResourceClaim": ("resourceclaims", True),
    "ResourceClaimTemplate": ("resourceclaimtemplates", True),
}


@dataclass
class FakeCluster:
    objects: list[dict] = field(default_factory=list)
    forbidden: set[str] = field(default_factory=set)  # paths answered 403
    dra: bool = True  # False: resource.k8s.io/v1 is not served (404)
    user: str = "system:serviceaccount:kubeflow:pipeline-runner"
    log: list[tuple[str, str, dict]] = field(default_factory=list)

    def listing(self, path: str) -> list[dict] | None:
        """Objects for a list path, or None when the path is not an API list endpoint."""
        if not path.startswith(RESOURCE + "/"):
            return None
        parts = path[len(RESOURCE) + 1:].split("/")
        namespace = None
        if len(parts) == 3 and parts[0] == "namespaces":
            namespace, parts = parts[1], parts[2:]
        if len(parts) != 1:
            return None
        kinds = [k for k, (plural, _) in PLURALS.items() if plural == parts[0]]
        if not kinds:
            return None
        out = []
        for obj in self.objects:
            if obj.get("kind") != kinds[0]:
                continue
            if namespace and obj.get("metadata", {}).get("namespace") != namespace:
                continue
            item = json.loads(json.dumps(obj))
            item.pop("kind", None)  # list items come without kind and apiVersion
            item.pop("apiVersion", None)
            out.append(item)
        return out


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def serve(cluster: FakeCluster):
    """Start the server in a thread; returns (server, base URL)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def _send(self, code: int, body: dict):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's name)
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            cluster.log.append(("GET", url.path, query))
            resource = url.path.rstrip("/").split("/")[-1]
            if url.path in cluster.forbidden:
                scope = ("in the namespace " + url.path.split("/")[-2]
                         if "/namespaces/" in url.path else "at the cluster scope")
                group = "resource.k8s.io" if url.path.startswith("/apis/resource") else ""
                self._send(403, _status(403, "Forbidden", (
                    f"{resource}.{group} is forbidden: User \"{cluster.user}\" cannot list "
                    f"resource \"{resource}\" in API group \"{group}\" {scope}")))
                return
            items = cluster.listing(url.path) if cluster.dra else None
            if items is None:
                self._send(404, _status(404, "NotFound", "the server could not find the "
                                                         "requested resource"))
                return
            start = int(base64.b64decode(query["continue"]).decode()) if "continue" in query \
                else 0
            limit = int(query.get("limit", 0)) or len(items)
            page = items[start:start + limit]
            meta = {"resourceVersion": "4242"}
            if start + limit < len(items):
                meta["continue"] = base64.b64encode(str(start + limit).encode()).decode()
            kind = next(k for k, (p, _) in PLURALS.items() if p == resource) + "List"
            self._send(200, {"kind": kind, "apiVersion": "resource.k8s.io/v1",
                             "metadata": meta, "items": page})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def kubeconfig(url: str, token: str = "test-token") -> dict:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }
