"""Live preflight facing what is not a working Kubernetes API: broken kubeconfigs, faults a
real server does not produce on demand (tests/cluster/k8s_fake_server.py), and a plain HTTP
file server. Each is one line, no traceback, the documented exit code (`draslice preflight
--help`: 2 bad input, 1 cluster cannot be read), and never "no DRA" (77), which would let a
pipeline skip its GPU steps on a misconfigured cluster.

The live read of a working cluster is tested against a real kube-apiserver in
tests/realcluster/test_live.py.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import re
import socket
import threading
import time

import pytest
import yaml
from click.testing import CliRunner

from draslice.cli import main
from draslice.cluster import live
from draslice.tests.cluster.k8s_fake_server import FakeServer, kubeconfig, serve

TOKEN = "s3cr3t-t0ken-value"


def _preflight(path, *args):
    res = CliRunner().invoke(main, ["preflight", "--kubeconfig", str(path), *args])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert "Traceback" not in res.output, res.output
    assert len(lines) == 1, res.output  # one clear line
    return res.exit_code, lines[0]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    server_state = FakeServer()
    server, url = serve(server_state)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(url, TOKEN)))
    server_state.kubeconfig, server_state.url = path, url
    yield server_state
    server.shutdown()
    server.server_close()


def test_a_working_fake_reads_as_an_empty_cluster(fake):
    """The control: with no fault the stand-in reads as a DRA cluster with nothing in it."""
    res = CliRunner().invoke(main, ["preflight", "--kubeconfig", str(fake.kubeconfig),
                                    "--on-missing-dra", "fail"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "does not serve resource.k8s.io/v1" not in res.output


def test_http_500_is_named_with_the_servers_message(fake):
    fake.fault = "500"
    code, line = _preflight(fake.kubeconfig)
    assert code == 1
    assert "listing deviceclasses.resource.k8s.io (cluster scope) failed: HTTP 500" in line
    assert "etcdserver: request timed out" in line


def test_connection_cut_mid_answer(fake):
    fake.fault = "cut"
    code, line = _preflight(fake.kubeconfig)
    assert code == 1 and f"cannot reach the API server {fake.url}" in line


def test_a_stalled_server_ends_within_the_read_timeout(fake, monkeypatch):
    monkeypatch.setattr(live, "READ_TIMEOUT_S", 0.5)
    fake.fault, fake.stall_s = "stall", 5.0
    start = time.monotonic()
    code, line = _preflight(fake.kubeconfig)
    assert time.monotonic() - start < 3.0  # one read timeout, no retries of the stalled read
    assert code == 1
    assert f"the API server {fake.url} did not answer GET /apis/resource.k8s.io/v1/" \
           "deviceclasses within 0.5 s" in line


@contextlib.contextmanager
def _stalling_server(trickle: bool):
    """A real TCP server that takes every connection and then never answers (``trickle``
    False), or sends an HTTP head and then one byte of body every 0.1 s forever, which no
    socket timeout ever ends (each byte restarts it)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def feed(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n")
            while not stop.wait(0.1):
                conn.sendall(b" ")

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                held.append(conn)
                if trickle:
                    threading.Thread(target=feed, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickling"])
def test_one_deadline_holds_for_a_server_that_never_answers(tmp_path, monkeypatch, trickle):
    """Issue 37, 12: "did not answer ... within 30 s" came after 151 s (``/version`` had no
    timeout, and a read timeout restarts at each byte). Now the whole GET has the deadline,
    and a wait past a few seconds is told on stderr."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(live, "READ_TIMEOUT_S", 1.5)
    monkeypatch.setattr(live, "PROGRESS_AFTER_S", 0.5)
    with _stalling_server(trickle) as url:
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(url, TOKEN)))
        import kubernetes.client  # noqa: F401 (its import is not the server's time)

        start = time.monotonic()
        res = CliRunner().invoke(main, ["preflight", "--kubeconfig", str(path)])
        elapsed = time.monotonic() - start
    assert elapsed < 1.5 + 1.0, elapsed  # the deadline and a little slack, not a timeout's
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert res.stdout == ""
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: the API server {url} did not answer GET /version within 1.5 s"]
    waits = [line for line in res.stderr.splitlines() if line.startswith("waiting for ")]
    assert 1 <= len(waits) <= 2, res.stderr  # at 0.5 and 1.0 s
    for line in waits:
        assert re.fullmatch(rf"waiting for the API server {re.escape(url)}: GET /version, "
                            r"[01] s of 1\.5 s", line), line


@pytest.mark.parametrize("fault, words", [
    ("html", "bytes of text/html that are not JSON"),
    ("wrong-kind", "with JSON of kind 'Pod', not a list"),
])
def test_an_answer_that_is_not_the_api_asked_for_is_an_error(fake, fault, words):
    fake.fault = fault
    code, line = _preflight(fake.kubeconfig, "--on-missing-dra", "skip")
    assert code == 1 and words in line and "Kubernetes API server?" in line


def test_a_token_the_server_echoes_is_redacted(fake):
    fake.fault = "echo-token"
    code, line = _preflight(fake.kubeconfig)
    assert code == 1 and "HTTP 502" in line
    assert TOKEN not in line and "<redacted>" in line


@pytest.fixture
def file_server(tmp_path):
    """Python's own static file server: a real HTTP server that is not a Kubernetes API."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "index.html").write_text("<html>hello</html>")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # its request log would mix into the CLI's output
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_a_plain_http_file_server_is_not_no_dra(file_server, tmp_path, monkeypatch, policy):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(file_server)))
    code, line = _preflight(path, "--profile", "1g.10gb", "--on-missing-dra", policy)
    assert code == 1, line  # never 77
    assert "does not serve resource.k8s.io" not in line
    assert f"{file_server} answered GET /apis/resource.k8s.io/v1/deviceclasses with HTTP 404 " \
           "but is not a Kubernetes API server" in line


def test_unreachable_server_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig("http://127.0.0.1:9")))
    code, line = _preflight(path)
    assert code == 1 and "cannot reach the API server http://127.0.0.1:9" in line


# --- the kubeconfig file itself: bad input, exit 2, naming the file and the field -----------

GOOD = kubeconfig("https://127.0.0.1:6443")


def _with(path: str, value) -> dict:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    node = doc
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    node[parts[-1]] = value
    return doc


@pytest.mark.parametrize("content, words", [
    (b"clusters: [\n  - name: x\n    cluster: {server: 'https://a'\n",
     "line 2 column 3: not valid YAML"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "not UTF-8 text (byte 0 is 0x89)"),
    (b"just a string", "the document must be a mapping"),
    (yaml.safe_dump(_with("clusters.0.cluster.server", 8080)).encode(),
     "clusters[0].cluster.server must be a string, not int 8080"),
    (yaml.safe_dump(_with("clusters.0.cluster.server", "127.0.0.1:6443")).encode(),
     "clusters[0].cluster.server must be an http(s):// URL"),
    (yaml.safe_dump(_with("clusters", "all of them")).encode(),
     "clusters must be a list, not str"),
    (yaml.safe_dump(_with("users.0.user.token", 12345)).encode(),
     "users[0].user.token must be a string, not int"),
    (yaml.safe_dump(_with("contexts.0.context", ["fake"])).encode(),
     "contexts[0].context must be a mapping, not list"),
    (yaml.safe_dump(_with("current-context", 7)).encode(),
     "current-context must be a string, not int 7"),
])
def test_a_broken_kubeconfig_is_bad_input_naming_file_and_field(tmp_path, monkeypatch,
                                                                content, words):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    code, line = _preflight(path)
    assert code == 2, line
    assert f"kubeconfig {path}" in line and words in line


def test_a_missing_kubeconfig_is_bad_input_and_points_at_snapshot(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, line = _preflight(tmp_path / "none")
    assert code == 2
    assert f"kubeconfig {tmp_path / 'none'}: no such file" in line and "--snapshot" in line


def test_no_kubeconfig_at_all_is_cluster_unreadable(tmp_path, monkeypatch):
    """No --kubeconfig, no $KUBECONFIG file, no ~/.kube/config, not in a pod: exit 1."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    res = CliRunner().invoke(main, ["preflight"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "cannot load cluster credentials" in res.output and "--snapshot" in res.output
