"""A stand-in for a Kubernetes API server, kept ONLY for the faults a real server does not
produce on demand: an HTTP 500, a connection cut in the middle of an answer, a stall longer
than the read timeout, an answer that is not JSON or not the kind asked for, and a server that
echoes the bearer token into a broken reply.

Everything else live preflight does is tested against a real kube-apiserver
(tests/realcluster, `make test-cluster`). Between faults it answers like the API server does
on the paths preflight reads (discovery, list endpoints with ``kind``/``items``), so each test
shows that the one fault, not a missing path, is what preflight reports.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

RESOURCE = "/apis/resource.k8s.io/v1"
FAULTS = ("500", "cut", "stall", "html", "wrong-kind", "echo-token")
LISTS = {"deviceclasses": "DeviceClassList", "resourceslices": "ResourceSliceList",
         "resourceclaims": "ResourceClaimList",
         "resourceclaimtemplates": "ResourceClaimTemplateList"}


@dataclass
class FakeServer:
    fault: str | None = None  # one of FAULTS
    fault_path: str = f"{RESOURCE}/deviceclasses"  # where the fault happens
    stall_s: float = 5.0
    log: list[tuple[str, dict]] = field(default_factory=list)


def _answer(path: str) -> tuple[int, dict]:
    """What a DRA-serving API server with no objects answers on the paths preflight reads."""
    if path == "/apis":
        return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
    if path == "/apis/resource.k8s.io":
        return 200, {"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io",
                     "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}]}
    last = path.rstrip("/").split("/")[-1]
    if path.startswith(RESOURCE + "/") and last in LISTS:
        return 200, {"kind": LISTS[last], "apiVersion": "resource.k8s.io/v1",
                     "metadata": {"resourceVersion": "1"}, "items": []}
    return 404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": "the server could not find the requested resource",
                 "reason": "NotFound", "code": 404}


def serve(fake: FakeServer):
    """Start the server in a thread; returns (server, base URL)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def _send(self, code: int, data: bytes, ctype: str = "application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            # the client may have given up already (a read timeout)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's name)
            path = urlparse(self.path).path
            fake.log.append((path, dict(self.headers)))
            fault = fake.fault if path == fake.fault_path else None
            if fault == "500":
                self._send(500, json.dumps({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
                    "reason": "InternalError", "message": "etcdserver: request timed out"
                }).encode())
            elif fault == "cut":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "4096")
                self.end_headers()
                self.wfile.write(b'{"kind": "DeviceClassList", "items": [')
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # cut: far fewer bytes than announced
            elif fault == "stall":
                time.sleep(fake.stall_s)
                code, body = _answer(path)
                self._send(code, json.dumps(body).encode())
            elif fault == "html":
                self._send(200, b"<html><body>Welcome to nginx!</body></html>", "text/html")
            elif fault == "wrong-kind":
                self._send(200, json.dumps({"kind": "Pod", "apiVersion": "v1"}).encode())
            elif fault == "echo-token":
                self._send(502, f"bad gateway for {self.headers.get('Authorization')}".encode(),
                           "text/plain")
            else:
                code, body = _answer(path)
                self._send(code, json.dumps(body).encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
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
