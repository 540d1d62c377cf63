"""A stand-in for KFP 2.17.0's ``v2beta1`` API server on 127.0.0.1, for the upload, submit
and schedule tests.

A stand-in, not KFP: KFP's own API server (Go, ``github.com/kubeflow/pipelines``) cannot be had
on these machines, because the Go module proxy refuses that module at every version
(``make kfp-backend`` shows the refusal; docs/kfp.md). What it answers, it answers as a real
KFP **2.17.0** API server did (issue 36: single-user mode, MariaDB, a real kube-apiserver with
Argo's and KFP's CRDs, driven with the kfp 2.17.3 SDK and raw HTTP). Marked *observed* below:
those statuses, body shapes and texts come from that server, verbatim (ids aside). The rest is
*read* from KFP's source (its ``util.UserError`` wrapping, ``resource_manager.go``, the run and
job servers); docs/kfp.md lists which is which.

- **Errors** (observed): ``{"code", "message", "details": [google.rpc.Status]}``, no ``error``
  key; ``message`` is KFP's chain of wrapped messages, ``details[0]`` the external message
  (read). An error that is not KFP's own (the Argo compiler's) is code 13 with
  ``Internal error: `` and Go's ``%+v``: every wrap followed by its stack trace (observed; the
  frames here are shaped like Go's, the functions and lines are illustrative). The upload
  endpoints, plain HTTP handlers in KFP, answer ``{"error_message", "error_details"}`` (read).
  A path outside ``/apis/`` gets Go's plain-text ``404 page not found`` (observed).
- **Modes**: single-user (the default; observed): ``namespace`` is ignored by every list and
  create. ``multi_user = True`` (read): objects keep the namespace they were created in and
  lists filter on it. Each test that depends on it says which mode it runs.
- **Paging** (observed): 20 items a page by default, at most 200, opaque base64 page tokens;
  ``GET /runs`` lists runs.
- **Runs** (observed): a new run has no ``state`` until the persistence agent reads a phase;
  ``state_history`` gains an entry with only ``update_time``. Then, one step per ``GET``, the
  states of :meth:`FakeKfp.script_next_run` (``None``: still no state). Parameters are checked
  against the pipeline's inputs (type, unknown names) with KFP's texts (observed). A native-
  mode run is refused with the 500 of a 2.17 backend (observed); its upload is accepted.
- **Recurring runs** (observed): validated as the server does, in its order: max concurrency
  1..10, the cron by robfig/cron v1.2.0 (:func:`draslice.kfp_ops.cron.robfig_parse`, which
  ``tests/kfp`` holds against the Go library), then the pipeline version (a missing one is a
  500), then the parameters. A 5-field cron and no trigger at all are accepted. Each creates a
  ScheduledWorkflow object (:attr:`State.scheduled_workflows`, read from KFP's source, its
  fields observed): ``spec.pipelineName`` is the version's name, the Workflow is a JSON string
  in ``spec.workflow.spec``, ``spec.enabled`` follows enable/disable, delete removes it.

Every request body is parsed strictly with the ``kfp-server-api`` models (:mod:`kfp_strict`): a
body the real server would refuse is answered 400 *and* recorded in :attr:`FakeKfp.violations`,
which the fixture turns into a test failure. Knobs for faults the real server does not make on
demand: :meth:`FakeKfp.fail`, :meth:`FakeKfp.answer` (raw bytes), :meth:`FakeKfp.echo` (a proxy
that echoes the request's headers), :meth:`FakeKfp.stall` (takes the request, never answers).
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import itertools
import json
import re
import ssl
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import kfp_server_api
import yaml

from draslice.kfp_ops.cron import RobfigError, robfig_parse
from draslice.tests.kfp_workflow import workflow as compile_workflow
from draslice.tests.kfpserver import kfp_strict as strict

API = "/apis/v2beta1"
POD_NAMESPACE = "kubeflow"  # the API server's own namespace: where single-user runs go
DEFAULT_SCRIPT = ("PENDING", "RUNNING", "RUNNING", "SUCCEEDED")
DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE = 20, 200
# gRPC code -> HTTP status, as grpc-gateway maps them
_HTTP = {2: 500, 3: 400, 5: 404, 6: 409, 7: 403, 9: 400, 10: 409, 13: 500, 14: 503, 16: 401}
_STATUS_TYPE = "type.googleapis.com/google.rpc.Status"
_serialize = kfp_server_api.ApiClient().sanitize_for_serialization


# --- errors, as KFP's util package makes them -----------------------------------------------

class KfpStatus(Exception):
    """A KFP ``util.UserError``: the wrapped message chain, the external message, the code."""

    def __init__(self, message: str, external: str, code: int) -> None:
        super().__init__(message)
        self.message, self.external, self.code = message, external, code

    def wrap(self, text: str) -> KfpStatus:
        return KfpStatus(f"{text}: {self.message}", self.external, self.code)

    def body(self) -> dict:
        return {"code": self.code, "message": self.message,
                "details": [{"@type": _STATUS_TYPE, "code": self.code,
                             "message": self.external}]}


def invalid_input(text: str) -> KfpStatus:
    return KfpStatus(f"Invalid input error: {text}", text, 3)


def not_found(kind: str, name: str) -> KfpStatus:
    return KfpStatus(f"ResourceNotFoundError: {kind} {name} not found", f"{kind} {name} not found",
                     5)


def internal(cause: KfpStatus, text: str) -> KfpStatus:
    return KfpStatus(f"InternalServerError: {text}: {cause.message}", "Internal Server Error", 13)


def already_exists(text: str) -> KfpStatus:
    return KfpStatus(f"Already exist error: {text}", text, 6)


_SRC = "/go/src/github.com/kubeflow/pipelines/backend"
_PKG = "github.com/kubeflow/pipelines/backend"
_GRPC = "/go/pkg/mod/google.golang.org/grpc@v1.73.0"
_HANDLER_FRAMES = {
    "run": [(f"{_PKG}/api/v2beta1/go_client._RunService_CreateRun_Handler.func1",
             f"{_SRC}/api/v2beta1/go_client/run_grpc.pb.go:261"),
            ("google.golang.org/grpc.getChainUnaryHandler.func1", f"{_GRPC}/server.go:1217"),
            ("main.apiServerInterceptor", f"{_SRC}/src/apiserver/interceptor.go:31"),
            ("google.golang.org/grpc.chainUnaryInterceptors.func1", f"{_GRPC}/server.go:1208"),
            (f"{_PKG}/api/v2beta1/go_client._RunService_CreateRun_Handler",
             f"{_SRC}/api/v2beta1/go_client/run_grpc.pb.go:263")],
    "job": [(f"{_PKG}/api/v2beta1/go_client._RecurringRunService_CreateRecurringRun_Handler.func1",
             f"{_SRC}/api/v2beta1/go_client/recurring_run_grpc.pb.go:205"),
            ("google.golang.org/grpc.getChainUnaryHandler.func1", f"{_GRPC}/server.go:1217"),
            ("main.apiServerInterceptor", f"{_SRC}/src/apiserver/interceptor.go:31"),
            ("google.golang.org/grpc.chainUnaryInterceptors.func1", f"{_GRPC}/server.go:1208"),
            (f"{_PKG}/api/v2beta1/go_client._RecurringRunService_CreateRecurringRun_Handler",
             f"{_SRC}/api/v2beta1/go_client/recurring_run_grpc.pb.go:207")],
}
_GRPC_FRAMES = [("google.golang.org/grpc.(*Server).processUnaryRPC", f"{_GRPC}/server.go:1431"),
                ("google.golang.org/grpc.(*Server).handleStream", f"{_GRPC}/server.go:1842"),
                ("google.golang.org/grpc.(*Server).serveStreams.func2.1",
                 f"{_GRPC}/server.go:1061"),
                ("runtime.goexit", "/usr/local/go/src/runtime/asm_amd64.s:1700")]
_WRAP = (f"{_PKG}/src/common/util.Wrap", f"{_SRC}/src/common/util/error.go:366")
# Where each wrap happens: (function, file:line) from the wrapping call down to the handler.
_CALLERS = {
    "template.RunWorkflow": (f"{_PKG}/src/apiserver/template.(*V2Spec).RunWorkflow",
                             f"{_SRC}/src/apiserver/template/v2_template.go:274"),
    "template.ScheduledWorkflow": (f"{_PKG}/src/apiserver/template.(*V2Spec).ScheduledWorkflow",
                                   f"{_SRC}/src/apiserver/template/v2_template.go:84"),
    "resource.CreateRun": (f"{_PKG}/src/apiserver/resource.(*ResourceManager).CreateRun",
                           f"{_SRC}/src/apiserver/resource/resource_manager.go:461"),
    "resource.CreateJob": (f"{_PKG}/src/apiserver/resource.(*ResourceManager).CreateJob",
                           f"{_SRC}/src/apiserver/resource/resource_manager.go:1016"),
    "server.createRun": (f"{_PKG}/src/apiserver/server.(*BaseRunServer).createRun",
                         f"{_SRC}/src/apiserver/server/run_server.go:118"),
    "server.CreateRun": (f"{_PKG}/src/apiserver/server.(*RunServer).CreateRun",
                         f"{_SRC}/src/apiserver/server/run_server.go:466"),
    "server.createJob": (f"{_PKG}/src/apiserver/server.(*BaseJobServer).createJob",
                         f"{_SRC}/src/apiserver/server/job_server.go:140"),
    "server.CreateRecurringRun": (f"{_PKG}/src/apiserver/server.(*JobServer).CreateRecurringRun",
                                  f"{_SRC}/src/apiserver/server/job_server.go:393"),
}
_STACKS = {  # the callers below each wrap, innermost first
    "run": ["template.RunWorkflow", "resource.CreateRun", "server.createRun", "server.CreateRun"],
    "job": ["template.ScheduledWorkflow", "resource.CreateJob", "server.createJob",
            "server.CreateRecurringRun"],
}


class GoError(Exception):
    """An error that is not a KFP ``UserError`` (the Argo compiler's), as pkg/errors formats
    its wraps with ``%+v``: the cause's text, then each wrap's message and stack trace."""

    def __init__(self, text: str, api: str) -> None:
        super().__init__(text)
        self.text, self.api = text, api

    def wrap(self, message: str, at: str) -> GoError:
        chain = _STACKS[self.api]
        frames = [_WRAP, *(_CALLERS[c] for c in chain[chain.index(at):]),
                  *_HANDLER_FRAMES[self.api], *_GRPC_FRAMES]
        stack = "".join(f"\n{function}\n\t{where}" for function, where in frames)
        return GoError(f"{self.text}\n{message}{stack}", self.api)

    def body(self) -> dict:
        message = f"Internal error: {self.text}"
        return {"code": 13, "message": message,
                "details": [{"@type": _STATUS_TYPE, "code": 2, "message": message}]}


# --- the server's state and knobs -------------------------------------------------------------

@dataclass
class Fault:
    method: str
    path: re.Pattern
    status: int
    message: str
    times: int
    body: bytes | None = None  # a raw answer instead of KFP's error shape
    content_type: str = "application/json"
    echo: str | None = None  # "error" or "field": answer with the request's headers
    filler: int = 0
    stall: bool = False


@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    headers: dict  # lower-case names
    body: bytes


@dataclass
class State:
    pipelines: dict = field(default_factory=dict)  # id -> V2beta1Pipeline
    versions: dict = field(default_factory=dict)  # pipeline id -> [V2beta1PipelineVersion]
    experiments: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)  # id -> [V2beta1Run, remaining script]
    recurring: dict = field(default_factory=dict)
    scheduled_workflows: dict = field(default_factory=dict)  # recurring run id -> SWF object
    order: dict = field(default_factory=dict)  # object id -> creation sequence (the sort key)


class FakeKfp:
    """The server's state and knobs; :meth:`start` / :meth:`stop` run it on a free port."""

    def __init__(self) -> None:
        self.state = State()
        self.lock = threading.Lock()
        self.requests: list[Recorded] = []
        self.violations: list[str] = []
        self.faults: list[Fault] = []
        self.required_token: str | None = None
        self.required_cookie: str | None = None
        self.default_page_size = DEFAULT_PAGE_SIZE
        self.max_page_size = MAX_PAGE_SIZE
        self.honor_filters = True  # False: answer lists unfiltered, like a server that ignores them
        self.multi_user = False
        self.scripts: list[tuple[str | None, ...]] = []
        self.released = threading.Event()  # set on stop: stalled requests end
        self._ids = itertools.count(1)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- knobs for tests -------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{self.scheme}://{host}:{port}"

    def fail(self, method: str, path_regex: str, status: int, message: str = "injected",
             times: int = 1) -> None:
        """Answer the next ``times`` matching requests with ``status`` and KFP's error shape."""
        self.faults.append(Fault(method, re.compile(path_regex), status, message, times))

    def answer(self, method: str, path_regex: str, body: bytes | str, status: int = 200,
               content_type: str = "application/json", times: int = 1) -> None:
        """Answer the next ``times`` matching requests with these raw bytes: what a server
        that is not KFP's API (or a broken proxy) sends back."""
        raw = body.encode() if isinstance(body, str) else body
        self.faults.append(Fault(method, re.compile(path_regex), status, "", times, raw,
                                 content_type))

    def echo(self, method: str, path_regex: str, status: int = 500, shape: str = "error",
             filler: int = 0, times: int = 1) -> None:
        """Answer with the request's headers echoed, after ``filler`` characters: as an error
        message (``shape="error"``, with ``status``), or, with status 200, as the value of a
        field of an object that is not the expected one (``shape="field"``)."""
        self.faults.append(Fault(method, re.compile(path_regex), status, "", times,
                                 echo=shape, filler=filler))

    def stall(self, method: str, path_regex: str, times: int = 1) -> None:
        """Take the next ``times`` matching requests and never answer them (until stop)."""
        self.faults.append(Fault(method, re.compile(path_regex), 0, "", times, stall=True))

    def script_next_run(self, *states: str | None) -> None:
        """States the next created run goes through, one per GET of it (None: no state)."""
        self.scripts.append(tuple(states))

    def new_id(self, kind: str) -> str:
        seq = next(self._ids)
        new = f"{kind}-{seq:04d}-{uuid.uuid4().hex[:6]}"
        self.state.order[new] = seq
        return new

    # --- lifecycle ---------------------------------------------------------------------
    def start(self, tls: tuple[str, str] | None = None) -> FakeKfp:
        """Serve on a free loopback port; ``tls=(certfile, keyfile)`` serves HTTPS."""
        fake = self
        self.scheme = "https" if tls else "http"

        class Handler(_Handler):
            server_state = fake

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.timeout = 5
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


# google.protobuf.Struct fields: protojson writes their values as they are, false and 0 too
_STRUCTS = {"pipeline_spec", "platform_spec", "parameters"}


def _protojson(doc):
    """``doc`` as protojson writes it without EmitUnpopulated: no null, empty, zero or false
    field (KFP 2.17 leaves them all out, its run's unset ``state`` included)."""
    if isinstance(doc, dict):
        out = {k: v if k in _STRUCTS else _protojson(v) for k, v in doc.items()}
        return {k: v for k, v in out.items()
                if v is not None and v is not False and v != "" and v != [] and v != {}
                and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0)}
    if isinstance(doc, list):
        return [_protojson(v) for v in doc]
    return doc


def _filter_predicates(fake: FakeKfp, raw: str | None) -> list[tuple[str, str, str]]:
    """(key, operation, value) of a protojson Filter (camelCase or snake_case, enum names or
    numbers, the way the real server reads it)."""
    if not raw:
        return []
    doc = json.loads(raw)
    ops = {1: "EQUALS", 2: "NOT_EQUALS", 9: "IS_SUBSTRING"}
    out = []
    for p in doc.get("predicates", []):
        op = p.get("operation")
        op = ops.get(op, op) if isinstance(op, int) else op
        value = p.get("string_value", p.get("stringValue"))
        if op not in ("EQUALS", "NOT_EQUALS", "IS_SUBSTRING") or value is None:
            raise invalid_input(f"unsupported filter predicate {p}")
        out.append((p.get("key"), op, value))
    return out if fake.honor_filters else []


def _matches(obj, predicates) -> bool:
    for key, op, value in predicates:
        have = getattr(obj, key, None) or ""
        ok = {"EQUALS": have == value, "NOT_EQUALS": have != value,
              "IS_SUBSTRING": value in have}[op]
        if not ok:
            return False
    return True


def _page(fake: FakeKfp, items: list, query: dict, key: str, id_field: str, what: str) -> dict:
    """One page of ``items`` (in creation order), KFP's way: ``page_size`` 0 means the
    default, more than the maximum means the maximum; the token is opaque base64 JSON."""
    try:
        size = int(query.get("page_size") or 0)
    except ValueError:
        raise invalid_input(f"invalid page_size {query.get('page_size')!r}") from None
    if size < 0:
        raise invalid_input(f'The page size should be greater than 0. Got "{size}"').wrap(
            f"Failed to list {what} due to error parsing the listing options")
    size = fake.default_page_size if size == 0 else min(size, fake.max_page_size)
    seq = lambda item: fake.state.order.get(getattr(item, id_field), 0)  # noqa: E731
    items = sorted(items, key=seq)
    token = query.get("page_token")
    if token:
        try:
            cursor = json.loads(base64.b64decode(token, validate=True))["SortByFieldValue"]
        except (ValueError, KeyError, TypeError):
            raise invalid_input("Invalid package token.").wrap(
                f"Failed to list {what} due to error parsing the listing options") from None
        items = [i for i in items if seq(i) >= cursor]
    chunk, rest = items[:size], items[size:]
    doc = {key: [_serialize(i) for i in chunk], "total_size": len(items)}
    if rest:
        doc["next_page_token"] = base64.b64encode(json.dumps({
            "SortByFieldName": "CreatedAtInSec", "KeyFieldName": "UUID",
            "SortByFieldValue": seq(rest[0]), "KeyFieldValue": getattr(rest[0], id_field),
            "IsDesc": False, "Filter": None}).encode()).decode()
    return doc


class _Handler(BaseHTTPRequestHandler):
    server_state: FakeKfp
    protocol_version = "HTTP/1.1"
    timeout = 10  # a stuck client cannot hold a server thread forever
    disable_nagle_algorithm = True  # headers and body go out at once, no 40 ms ACK waits

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    # --- plumbing ------------------------------------------------------------------------
    def _send(self, status: int, doc) -> None:
        self._send_raw(status, json.dumps(doc).encode(), "application/json")

    def _send_raw(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _echoed(self, fault: Fault) -> None:
        credentials_first = sorted(self.headers.items(),
                                   key=lambda kv: kv[0].lower() not in ("authorization", "cookie"))
        seen = "; ".join(f"{k}: {v}" for k, v in credentials_first)
        text = "x" * fault.filler + f"request headers: {seen}"
        if fault.echo == "field":
            return self._send(200, {"created_at": text, "echo": True})
        self._send(fault.status, {"code": 2, "message": text, "details": []})

    def _fault(self, method: str, path: str) -> bool:
        fake = self.server_state
        for fault in fake.faults:
            if fault.times > 0 and fault.method == method and fault.path.search(path):
                fault.times -= 1
                if fault.stall:
                    fake.released.wait()
                    self.close_connection = True
                elif fault.echo:
                    self._echoed(fault)
                elif fault.body is not None:
                    self._send_raw(fault.status, fault.body, fault.content_type)
                else:
                    self._send(fault.status, KfpStatus(fault.message, fault.message,
                                                       {400: 3, 403: 7, 404: 5, 409: 6}.get(
                                                           fault.status, 13)).body())
                return True
        return False

    def _handle(self, method: str) -> None:
        fake = self.server_state
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with fake.lock:
            fake.requests.append(Recorded(method, split.path, query,
                                          {k.lower(): v for k, v in self.headers.items()}, body))
        if self._fault(method, split.path):
            return
        with fake.lock:
            # A proxy in front (Istio, oauth2-proxy) refuses before KFP sees the request; KFP
            # itself authenticates no one in single-user mode. The texts are Envoy's jwt_authn.
            if fake.required_token is not None:
                sent = self.headers.get("Authorization")
                if sent != f"Bearer {fake.required_token}":
                    text = "Jwt is missing" if sent is None else "Jwt verification fails"
                    return self._send_raw(401, text.encode(), "text/plain")
            if fake.required_cookie is not None and \
                    fake.required_cookie not in (self.headers.get("Cookie") or ""):
                return self._send_raw(401, b"Unauthorized", "text/plain")
            if not split.path.startswith("/apis/"):  # Go's http.NotFound (observed)
                return self._send_raw(404, b"404 page not found\n", "text/plain; charset=utf-8")
            try:
                status, doc = _route(fake, method, split.path, query, body,
                                     self.headers.get("Content-Type", ""))
            except UploadError as err:
                return self._send(err.status, err.body())
            except (KfpStatus, GoError) as err:
                doc = err.body()
                return self._send(_HTTP.get(doc["code"], 500), doc)
            except strict.StrictError as err:
                fake.violations.append(f"{method} {split.path}: {err}")
                return self._send(400, invalid_input(f"invalid request body: {err}").body())
        self._send(status, _protojson(doc))

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


class UploadError(Exception):
    """An error of KFP's upload endpoints, plain HTTP handlers that answer
    ``{"error_message", "error_details"}`` with the status they choose (read)."""

    def __init__(self, status: int, error: KfpStatus) -> None:
        super().__init__(error.message)
        self.status, self.error = status, error

    def body(self) -> dict:
        return {"error_message": self.error.message, "error_details": self.error.message}


# --- request bodies ------------------------------------------------------------------------

def _json(body: bytes, typ: str):
    try:
        data = json.loads(body or b"null")
    except ValueError as err:
        raise strict.StrictError(f"body is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise strict.StrictError(f"body must be a JSON object for {typ}")
    return strict.parse(data, typ)


def _upload_file(body: bytes, content_type: str) -> bytes:
    if not content_type.startswith("multipart/form-data"):
        raise strict.StrictError(f"upload needs multipart/form-data, got {content_type!r}")
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    parts = {p.get_param("name", header="content-disposition"): p for p in msg.iter_parts()}
    if set(parts) != {"uploadfile"}:
        raise strict.StrictError(f"upload form fields must be exactly 'uploadfile', got "
                                 f"{sorted(parts)}")
    return parts["uploadfile"].get_payload(decode=True)


def _stored_spec(raw: bytes, wrap: str) -> dict:
    try:
        docs = [d for d in yaml.safe_load_all(raw) if d is not None]
    except yaml.YAMLError as err:
        raise UploadError(400, invalid_input(f"unable to decode yaml document: {err}").wrap(
            wrap)) from None
    if not docs:
        raise UploadError(400, invalid_input("no pipeline spec is provided").wrap(wrap))
    try:
        strict.check_pipeline_spec(docs[0])
    except strict.StrictError as err:
        raise UploadError(400, invalid_input(f"invalid v2 pipeline spec: {err}").wrap(
            wrap)) from None
    if len(docs) == 1:
        return docs[0]
    return {"pipeline_spec": docs[0], "platform_spec": docs[1]}


# --- what KFP's template package does with a spec at run time -------------------------------

_TYPE_ERRORS = {
    "NUMBER_DOUBLE": ((int, float), "input parameter {} requires type double or integer, but "
                                    "the parameter value is not of number value type"),
    "NUMBER_INTEGER": ((int, float), "input parameter {} requires type double or integer, but "
                                     "the parameter value is not of number value type"),
    "STRING": ((str,), "input parameter {} requires type string, but the input parameter is "
                       "not of string value type"),
    "BOOLEAN": ((bool,), "input parameter {} requires type bool, but the input parameter is "
                         "not of bool value type"),
    "LIST": ((list,), "input parameter {} requires type list, but the input parameter is not "
                      "of list value type"),
    "STRUCT": ((dict,), "input parameter {} requires type struct, but the input parameter is "
                        "not of struct value type"),
}


def _check_inputs(spec: dict, params: dict) -> None:
    """KFP's ``validatePipelineJobInputs``: each given input of its type, no unknown one
    (observed texts). Go walks maps in random order; here names go in sorted order."""
    inputs = (strict.split_spec(spec)[0].get("root", {}).get("inputDefinitions", {})
              .get("parameters", {}))
    for name in sorted(inputs):
        param = inputs[name]
        if name not in params:
            if not param.get("isOptional") and param.get("defaultValue") is None:
                raise invalid_input(f"parameter {name} is not optional, yet has neither "
                                    "default value nor user provided value")
            continue
        types, text = _TYPE_ERRORS[param.get("parameterType", "STRING")]
        value = params[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise invalid_input(text.format(name))
    extra = [name for name in sorted(params) if name not in inputs]
    if extra:
        raise invalid_input("parameter(s) provided are not required by pipeline: "
                            + ", ".join(extra))


def _dags(spec: dict) -> list[tuple[str, str, dict]]:
    """(DAG component, task name, task) in the order the compiler meets them: each DAG's
    tasks by name, a sub-DAG's tasks where it stands."""
    components = spec.get("components", {})
    out = []

    def walk(dag_name: str, tasks: dict) -> None:
        for task_name in sorted(tasks):
            task = tasks[task_name]
            ref = task.get("componentRef", {}).get("name", "")
            if "dag" in components.get(ref, {}):
                walk(ref, components[ref]["dag"].get("tasks", {}))
            else:
                out.append((dag_name, task_name, task))

    walk("root", spec.get("root", {}).get("dag", {}).get("tasks", {}))
    return out


def _compile(spec: dict, api: str) -> None:
    """What KFP 2.17.0's Argo compiler refuses: an executor's Kubernetes config that its
    released ``KubernetesExecutorConfig`` does not know (native mode's ``podResourceClaims``).
    The first line is the observed one; see :func:`kfp_strict.check_platform_spec` for the
    column."""
    pipeline, platform = strict.split_spec(spec)
    components = pipeline.get("components", {})
    for dag, task_name, task in _dags(pipeline):
        label = components.get(task["componentRef"]["name"], {}).get("executorLabel", "")
        problem = strict.executor_config_error(platform, label)
        if problem:
            error = GoError(f'compiling DAG "{dag}": compiling task "{task_name}": error creating '
                            f'executor for "{task_name}": failed to unmarshal kubernetes config: '
                            f"{problem}", api)
            at = "template.RunWorkflow" if api == "run" else "template.ScheduledWorkflow"
            raise error.wrap("Failed to compile job", at)


def _template(fake: FakeKfp, ref, spec: dict | None) -> tuple[dict, object | None]:
    """KFP's ``fetchTemplateFromPipelineSpec``: the spec of the referenced version (and the
    version; a pipeline id alone: its latest version), or the inline one, parsed."""
    if ref is not None and ref.pipeline_id and not ref.pipeline_version_id:
        versions = fake.state.versions.get(ref.pipeline_id)
        if not versions:
            raise not_found("Pipeline", ref.pipeline_id).wrap(
                "Failed to fetch a pipeline version and its manifest from pipeline "
                f"{ref.pipeline_id}").wrap(
                "Failed to fetch a template due to error retrieving pipeline version")
        return versions[-1].pipeline_spec, versions[-1]
    if ref is None or not ref.pipeline_version_id:
        if spec is not None:
            try:
                strict.check_pipeline_spec(strict.split_spec(spec)[0])
            except strict.StrictError as err:
                raise KfpStatus(f"InvalidInputError: invalid v2 pipeline spec: {err}",
                                f"invalid v2 pipeline spec: {err}", 3) from None
        return spec, None
    vid, pid = ref.pipeline_version_id, ref.pipeline_id
    found = [v for vs in fake.state.versions.values() for v in vs if v.pipeline_version_id == vid]
    if not found:
        raise not_found("PipelineVersion", vid).wrap(
            f"Failed to get a pipeline version with id {vid}").wrap(
            "Failed to fetch a pipeline version and its manifest from pipeline version "
            f"{vid}").wrap("Failed to fetch a template due to error retrieving pipeline version")
    version = found[0]
    if pid and version.pipeline_id != pid:
        raise invalid_input(f"Pipeline version {vid} belongs to pipeline {version.pipeline_id} "
                            f"(not {pid})").wrap(
            "Failed to fetch a template due to error retrieving pipeline version")
    return version.pipeline_spec, version


def _runtime_params(obj) -> dict:
    return dict((obj.runtime_config.parameters if obj.runtime_config else None) or {})


def _namespace(fake: FakeKfp, asked: str | None) -> str | None:
    """The namespace an object is kept in: single-user mode ignores the one asked for."""
    return (asked or None) if fake.multi_user else None


def _in_namespace(fake: FakeKfp, obj, ns: str | None) -> bool:
    return not fake.multi_user or ns is None or obj.namespace == ns


# --- routes --------------------------------------------------------------------------------

def _route(fake: FakeKfp, method: str, path: str, query: dict, body: bytes, ctype: str):
    m = lambda pattern: re.fullmatch(API + pattern, path)  # noqa: E731
    for pattern, verb, handler in _ROUTES:
        mm = m(pattern)
        if mm and method == verb:
            return handler(fake, query, body, ctype, *mm.groups())
    # grpc-gateway's answer for a path under /apis/ that no service has (read)
    raise KfpStatus("Not Found", "Not Found", 5)


def _healthz(fake, query, body, ctype):
    return 200, {"commit_sha": "2.17.0", "tag_name": "2.17.0", "multi_user": fake.multi_user,
                 "pipeline_store": "database"}


def _list_pipelines(fake, query, body, ctype):
    preds = _filter_predicates(fake, query.get("filter"))
    ns = query.get("namespace") or None
    items = [p for p in fake.state.pipelines.values()
             if _matches(p, preds) and _in_namespace(fake, p, ns)]
    return 200, _page(fake, items, query, "pipelines", "pipeline_id", "pipelines")


def _upload(fake, query, body, ctype):
    wrap = "Failed to create a pipeline and a pipeline version"
    raw = _upload_file(body, ctype)
    name = query.get("display_name") or query.get("name")
    if not name:
        raise UploadError(400, invalid_input("pipeline name is empty").wrap(wrap))
    ns = _namespace(fake, query.get("namespace"))
    if any(p.display_name == name and p.namespace == ns for p in fake.state.pipelines.values()):
        raise UploadError(409, already_exists(
            f"Failed to create a new pipeline. The name {name} already exist. Please specify a "
            "new name").wrap(wrap))
    spec = _stored_spec(raw, wrap)
    pid = fake.new_id("pipeline")
    pipeline = kfp_server_api.V2beta1Pipeline(
        pipeline_id=pid, display_name=name, name=name,
        description=query.get("description"), namespace=ns, created_at=_now())
    fake.state.pipelines[pid] = pipeline
    fake.state.versions[pid] = [kfp_server_api.V2beta1PipelineVersion(
        pipeline_id=pid, pipeline_version_id=fake.new_id("version"), display_name=name,
        name=name, description=query.get("description"), created_at=_now(),
        pipeline_spec=spec)]
    return 200, _serialize(pipeline)


def _upload_version(fake, query, body, ctype):
    wrap = "Failed to create a pipeline version"
    raw = _upload_file(body, ctype)
    pid = query.get("pipelineid")
    if pid not in fake.state.pipelines:
        raise UploadError(500, not_found("Pipeline", pid).wrap(wrap))
    name = query.get("display_name") or query.get("name")
    if not name:
        raise UploadError(400, invalid_input("pipeline version name is empty").wrap(wrap))
    if any(v.display_name == name for v in fake.state.versions[pid]):
        raise UploadError(409, already_exists(
            f"Failed to create a new pipeline version. The name {name} already exist. Please "
            "specify a new name").wrap(wrap))
    version = kfp_server_api.V2beta1PipelineVersion(
        pipeline_id=pid, pipeline_version_id=fake.new_id("version"), display_name=name,
        name=name, description=query.get("description"), created_at=_now(),
        pipeline_spec=_stored_spec(raw, wrap))
    fake.state.versions[pid].append(version)
    return 200, _serialize(version)


def _list_versions(fake, query, body, ctype, pid):
    preds = _filter_predicates(fake, query.get("filter"))
    items = [v for v in fake.state.versions.get(pid, []) if _matches(v, preds)]
    return 200, _page(fake, items, query, "pipeline_versions", "pipeline_version_id",
                      "pipeline versions")


def _get_version(fake, query, body, ctype, pid, vid):
    # the pipeline id in the path is not looked at (observed)
    found = [v for vs in fake.state.versions.values() for v in vs if v.pipeline_version_id == vid]
    if not found:
        raise not_found("PipelineVersion", vid).wrap(
            f"Failed to get a pipeline version with id {vid}").wrap(
            f"Failed to get a pipeline version {vid}")
    return 200, _serialize(found[0])


def _list_experiments(fake, query, body, ctype):
    preds = _filter_predicates(fake, query.get("filter"))
    ns = query.get("namespace") or None
    items = [e for e in fake.state.experiments.values()
             if _matches(e, preds) and _in_namespace(fake, e, ns)]
    return 200, _page(fake, items, query, "experiments", "experiment_id", "experiments")


def _create_experiment(fake, query, body, ctype):
    exp = _json(body, "V2beta1Experiment")
    if not exp.display_name:
        raise invalid_input("Experiment name is empty. Please specify a valid experiment "
                            "name").wrap("Failed to create an experiment")
    exp.experiment_id = fake.new_id("experiment")
    exp.namespace = _namespace(fake, exp.namespace)
    exp.created_at = _now()
    exp.storage_state = "AVAILABLE"
    fake.state.experiments[exp.experiment_id] = exp
    return 200, _serialize(exp)


def _experiment(fake, experiment_id: str | None):
    if not experiment_id:  # KFP puts such a run in its default experiment
        default = [e for e in fake.state.experiments.values() if e.display_name == "Default"]
        if default:
            return default[0]
        return fake.state.experiments.setdefault(
            "default", kfp_server_api.V2beta1Experiment(
                experiment_id="default", display_name="Default", storage_state="AVAILABLE",
                created_at=_now()))
    if experiment_id not in fake.state.experiments:
        raise not_found("Experiment", experiment_id).wrap(
            f"Failed to get experiment {experiment_id}")
    return fake.state.experiments[experiment_id]


def _create_run(fake, query, body, ctype):
    run = _json(body, "V2beta1Run")
    try:
        if not run.display_name:
            raise invalid_input("The run name is empty. Please specify a valid name")
        experiment = _experiment(fake, run.experiment_id)
        try:
            spec, _ = _template(fake, run.pipeline_version_reference, run.pipeline_spec)
        except KfpStatus as err:
            raise internal(err, "Failed to create a run due to error fetching manifest") from None
        try:
            try:
                _check_inputs(spec, _runtime_params(run))
            except KfpStatus as err:
                raise err.wrap("invalid pipeline job inputs") from None
            _compile(spec, "run")
        except KfpStatus as err:
            raise err.wrap("Failed to generate the ExecutionSpec") from None
        except GoError as err:
            raise err.wrap("Failed to generate the ExecutionSpec", "resource.CreateRun") from None
    except KfpStatus as err:
        raise err.wrap("Failed to create a new run") from None
    except GoError as err:
        raise err.wrap("Failed to create a new run", "server.CreateRun") from None
    run.run_id = fake.new_id("run")
    run.created_at = run.scheduled_at = _now()
    run.namespace = experiment.namespace if fake.multi_user else POD_NAMESPACE
    run.state = None  # until the persistence agent reports a phase (observed)
    run.state_history = [kfp_server_api.V2beta1RuntimeStatus(update_time=_now())]
    run.storage_state = "AVAILABLE"
    script = list(fake.scripts.pop(0) if fake.scripts else DEFAULT_SCRIPT)
    fake.state.runs[run.run_id] = [run, script]
    return 200, _serialize(run)


def _list_runs(fake, query, body, ctype):
    preds = _filter_predicates(fake, query.get("filter"))
    ns, exp = query.get("namespace") or None, query.get("experiment_id")
    items = [r for r, _ in fake.state.runs.values()
             if _matches(r, preds) and _in_namespace(fake, r, ns)
             and (exp is None or r.experiment_id == exp)]
    return 200, _page(fake, items, query, "runs", "run_id", "runs")


def _get_run(fake, query, body, ctype, run_id):
    if run_id not in fake.state.runs:
        raise not_found("Run", run_id).wrap(f"Failed to fetch run {run_id}").wrap(
            "Failed to get a run")
    run, script = fake.state.runs[run_id]
    if script:
        state = script.pop(0)
        if state != run.state:
            run.state = state
            run.state_history = [*(run.state_history or []),
                                 kfp_server_api.V2beta1RuntimeStatus(update_time=_now(),
                                                                     state=state)]
    if run.state is not None:
        task_state = {"PENDING": "PENDING", "RUNNING": "RUNNING"}.get(run.state, run.state)
        run.run_details = kfp_server_api.V2beta1RunDetails(task_details=[
            kfp_server_api.V2beta1PipelineTaskDetail(
                run_id=run.run_id, task_id=f"{run.run_id}-preflight", display_name="preflight",
                state=task_state)])
    if run.state in ("FAILED", "ERROR"):
        run.error = kfp_server_api.GoogleRpcStatus(code=2, message="task smoke failed")
    return 200, _serialize(run)


def _check_job(fake, rr) -> None:
    """``toModelJob``'s checks, in its order (observed texts)."""
    if not rr.display_name:
        raise internal(invalid_input("Recurring run's name cannot be empty"),
                       "Failed to convert a API recurring run to its internal representation")
    concurrency = int(rr.max_concurrency or 0)
    if not 1 <= concurrency <= 10:
        raise invalid_input("Max concurrency of a recurring run must be at least 1 and at most "
                            f"10. Received {concurrency}")
    trig = rr.trigger
    if trig is not None and trig.cron_schedule is not None and trig.cron_schedule.cron:
        try:
            robfig_parse(trig.cron_schedule.cron)
        except RobfigError as err:
            raise invalid_input("Schedule cron is not a supported format(https://godoc.org/"
                                f"github.com/robfig/cron). Error: {err}") from None
    if trig is not None and trig.periodic_schedule is not None and \
            trig.periodic_schedule.interval_second is not None and \
            int(trig.periodic_schedule.interval_second) < 1:
        raise invalid_input("Found invalid period schedule interval "
                            f"{int(trig.periodic_schedule.interval_second)}. Set at interval to "
                            "least 1 second")


def _create_recurring(fake, query, body, ctype):
    rr = _json(body, "V2beta1RecurringRun")
    try:
        _check_job(fake, rr)
    except KfpStatus as err:
        raise err.wrap("Failed to create a recurring run due to conversion error") from None
    try:
        experiment = _experiment(fake, rr.experiment_id)
        try:
            spec, version = _template(fake, rr.pipeline_version_reference, rr.pipeline_spec)
        except KfpStatus as err:
            raise internal(err, "Failed to create a recurring run with an invalid pipeline spec "
                                "manifest") from None
        if spec is None:
            raise GoError("Cannot create a job with an empty pipeline ID", "job")
        try:
            try:
                _check_inputs(spec, _runtime_params(rr))
            except KfpStatus as err:
                raise err.wrap("invalid pipeline job inputs") from None
            _compile(spec, "job")
        except KfpStatus as err:
            raise err.wrap("Failed to create a recurring run during scheduled workflow "
                           "creation") from None
        except GoError as err:
            raise err.wrap("Failed to create a recurring run during scheduled workflow creation",
                           "resource.CreateJob") from None
    except KfpStatus as err:
        raise err.wrap("Failed to create a recurring run") from None
    except GoError as err:
        raise err.wrap("Failed to create a recurring run", "server.CreateRecurringRun") from None
    rr.recurring_run_id = fake.new_id("recurring")
    rr.mode = rr.mode or "DISABLE"
    rr.status = "ENABLED" if rr.mode == "ENABLE" else "DISABLED"
    rr.max_concurrency = str(rr.max_concurrency)
    trig = rr.trigger
    if trig is not None and trig.periodic_schedule is not None:
        trig.periodic_schedule.interval_second = str(trig.periodic_schedule.interval_second)
    rr.namespace = experiment.namespace if fake.multi_user else POD_NAMESPACE
    rr.created_at = rr.updated_at = _now()
    fake.state.recurring[rr.recurring_run_id] = rr
    fake.state.scheduled_workflows[rr.recurring_run_id] = _scheduled_workflow(rr, spec, version)
    return 200, _serialize(rr)


def _scheduled_workflow(rr, spec: dict, version) -> dict:
    """The ScheduledWorkflow KFP's ``V2Spec.ScheduledWorkflow`` makes for ``rr`` (read; the
    fields the issue observed: pipelineName is the version's name, the Workflow a JSON
    string)."""
    pipeline, platform = strict.split_spec(spec)
    params = _runtime_params(rr)
    trig = rr.trigger
    trigger = {}
    if trig is not None and trig.cron_schedule is not None:
        trigger = {"cronSchedule": {"cron": trig.cron_schedule.cron}}
    elif trig is not None and trig.periodic_schedule is not None:
        trigger = {"periodicSchedule": {
            "intervalSecond": int(trig.periodic_schedule.interval_second)}}
    ref = rr.pipeline_version_reference
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "ScheduledWorkflow",
            "metadata": {"name": re.sub(r"[^a-z0-9-]", "-", rr.display_name.lower())[:50],
                         "namespace": rr.namespace or POD_NAMESPACE},
            "spec": {"enabled": rr.mode == "ENABLE", "maxConcurrency": int(rr.max_concurrency),
                     "noCatchup": bool(rr.no_catchup), "trigger": trigger,
                     "workflow": {"parameters": [{"name": k, "value": json.dumps(v)}
                                                 for k, v in sorted(params.items())],
                                  "spec": json.dumps(compile_workflow([pipeline, platform],
                                                                      params))},
                     "experimentId": rr.experiment_id,
                     "pipelineId": ref.pipeline_id if ref else None,
                     "pipelineName": version.display_name if version else None,
                     "pipelineVersionId": ref.pipeline_version_id if ref else None,
                     "serviceAccount": rr.service_account or "pipeline-runner"}}


def _list_recurring(fake, query, body, ctype):
    preds = _filter_predicates(fake, query.get("filter"))
    ns, exp = query.get("namespace") or None, query.get("experiment_id")
    items = [r for r in fake.state.recurring.values()
             if _matches(r, preds) and (exp is None or r.experiment_id == exp)
             and _in_namespace(fake, r, ns)]
    return 200, _page(fake, items, query, "recurringRuns", "recurring_run_id", "recurring runs")


def _job(fake, rid: str, wrap: str):
    if rid not in fake.state.recurring:
        raise not_found("Job", rid).wrap(wrap) if wrap else not_found("Job", rid)
    return fake.state.recurring[rid]


def _get_recurring(fake, query, body, ctype, rid):
    try:
        return 200, _serialize(_job(fake, rid, ""))
    except KfpStatus as err:
        raise err.wrap("Failed to fetch a recurring run") from None


def _toggle(fake, rid: str, enable: bool):
    verb = "enable" if enable else "disable"
    try:
        rr = _job(fake, rid, f"Failed to change recurring run's mode to enable:"
                             f"{'true' if enable else 'false'}. Check if recurring run {rid} "
                             "exists")
    except KfpStatus as err:
        raise err.wrap(f"Failed to {verb} a recurring run") from None
    rr.mode = "ENABLE" if enable else "DISABLE"
    rr.status = "ENABLED" if enable else "DISABLED"
    rr.updated_at = _now()
    fake.state.scheduled_workflows[rid]["spec"]["enabled"] = enable
    return 200, {}


def _enable(fake, query, body, ctype, rid):
    return _toggle(fake, rid, True)


def _disable(fake, query, body, ctype, rid):
    return _toggle(fake, rid, False)


def _delete_recurring(fake, query, body, ctype, rid):
    try:
        _job(fake, rid, f"Failed to delete a recurring run {rid} as it does not exist")
    except KfpStatus as err:
        raise err.wrap("Failed to delete a recurring run") from None
    del fake.state.recurring[rid]
    del fake.state.scheduled_workflows[rid]  # the Workflows it made stay (observed)
    return 200, {}


_ROUTES = [
    ("/healthz", "GET", _healthz),
    ("/pipelines", "GET", _list_pipelines),
    ("/pipelines/upload", "POST", _upload),
    ("/pipelines/upload_version", "POST", _upload_version),
    (r"/pipelines/([^/]+)/versions", "GET", _list_versions),
    (r"/pipelines/([^/]+)/versions/([^/]+)", "GET", _get_version),
    ("/experiments", "GET", _list_experiments),
    ("/experiments", "POST", _create_experiment),
    ("/runs", "POST", _create_run),
    ("/runs", "GET", _list_runs),
    (r"/runs/([^/:]+)", "GET", _get_run),
    ("/recurringruns", "POST", _create_recurring),
    ("/recurringruns", "GET", _list_recurring),
    (r"/recurringruns/([^/:]+)", "GET", _get_recurring),
    (r"/recurringruns/([^/:]+):enable", "POST", _enable),
    (r"/recurringruns/([^/:]+):disable", "POST", _disable),
    (r"/recurringruns/([^/:]+)", "DELETE", _delete_recurring),
]
