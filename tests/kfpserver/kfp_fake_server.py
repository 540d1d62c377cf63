"""A small KFP ``v2beta1`` API server on 127.0.0.1 for the upload/submit/schedule tests.

A stand-in, not KFP: KFP's own API server (Go, ``github.com/kubeflow/pipelines``) cannot be had
on these machines, because the Go module proxy refuses that module at every version
(``make kfp-backend`` shows the refusal; docs/kfp.md). Issue 13 keeps this fake only for the
faults a real server does not produce on demand (a 500, a slow or cut connection, paging edge
cases); the ordinary upload/run/schedule tests move to KFP's own server once it can be built.
Until then every behaviour here that stands for KFP's is one read from KFP's source, not one
observed, and docs/kfp.md lists which.

It keeps state (pipelines, versions, experiments, runs, recurring runs), pages every list,
answers errors the way the real server does (``{"error", "code", "message", "details"}``),
and parses every request body strictly with the ``kfp-server-api`` models (:mod:`kfp_strict`):
a body the real server would refuse is answered 400 *and* recorded in :attr:`violations`,
which the fixture turns into a test failure. Runs step through a script of states, one step
per ``GET``, so ``--wait`` sees PENDING -> RUNNING -> a final state.
"""

from __future__ import annotations

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

from tests.kfpserver import kfp_strict as strict

API = "/apis/v2beta1"
DEFAULT_SCRIPT = ("PENDING", "RUNNING", "RUNNING", "SUCCEEDED")
_GRPC = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 500: 13}
_serialize = kfp_server_api.ApiClient().sanitize_for_serialization


@dataclass
class Fault:
    method: str
    path: re.Pattern
    status: int
    message: str
    times: int
    body: bytes | None = None  # a raw answer instead of KFP's error shape
    content_type: str = "application/json"


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
        self.max_page_size = 100
        self.honor_filters = True  # False: answer lists unfiltered, like a server that ignores them
        self.multi_user = False
        self.scripts: list[tuple[str, ...]] = []
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
        """Answer the next ``times`` matching requests with ``status``."""
        self.faults.append(Fault(method, re.compile(path_regex), status, message, times))

    def answer(self, method: str, path_regex: str, body: bytes | str, status: int = 200,
               content_type: str = "application/json", times: int = 1) -> None:
        """Answer the next ``times`` matching requests with these raw bytes: what a server
        that is not KFP's API (or a broken proxy) sends back."""
        raw = body.encode() if isinstance(body, str) else body
        self.faults.append(Fault(method, re.compile(path_regex), status, "", times, raw,
                                 content_type))

    def script_next_run(self, *states: str) -> None:
        """States the next created run goes through, one per GET of it."""
        self.scripts.append(tuple(states))

    def new_id(self, kind: str) -> str:
        return f"{kind}-{next(self._ids):04d}-{uuid.uuid4().hex[:6]}"

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
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _predicates(fake: FakeKfp, raw: str | None) -> list[tuple[str, str, str]]:
    preds = _filter_predicates(raw)
    return preds if fake.honor_filters else []


def _filter_predicates(raw: str | None) -> list[tuple[str, str, str]]:
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
            raise ApiError(400, f"unsupported filter predicate {p}")
        out.append((p.get("key"), op, value))
    return out


def _matches(obj, predicates) -> bool:
    for key, op, value in predicates:
        have = getattr(obj, key, None) or ""
        ok = {"EQUALS": have == value, "NOT_EQUALS": have != value,
              "IS_SUBSTRING": value in have}[op]
        if not ok:
            return False
    return True


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

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": message, "code": _GRPC.get(status, 2), "message": message,
                            "details": []})

    def _handle(self, method: str) -> None:
        fake = self.server_state
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with fake.lock:
            fake.requests.append(Recorded(method, split.path, query,
                                         {k.lower(): v for k, v in self.headers.items()}, body))
            for fault in fake.faults:
                if fault.times > 0 and fault.method == method and fault.path.search(split.path):
                    fault.times -= 1
                    if fault.body is not None:
                        return self._send_raw(fault.status, fault.body, fault.content_type)
                    return self._error(fault.status, fault.message)
            if fake.required_token is not None and \
                    self.headers.get("Authorization") != f"Bearer {fake.required_token}":
                return self._error(401, "Unauthorized: missing or invalid bearer token")
            if fake.required_cookie is not None and \
                    fake.required_cookie not in (self.headers.get("Cookie") or ""):
                return self._error(401, "Unauthorized: no session cookie")
            try:
                status, doc = _route(fake, method, split.path, query, body,
                                     self.headers.get("Content-Type", ""))
            except ApiError as err:
                return self._error(err.status, err.message)
            except strict.StrictError as err:
                fake.violations.append(f"{method} {split.path}: {err}")
                return self._error(400, f"invalid request body: {err}")
        self._send(status, doc)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


def _json(body: bytes, typ: str):
    try:
        data = json.loads(body or b"null")
    except ValueError as err:
        raise strict.StrictError(f"body is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise strict.StrictError(f"body must be a JSON object for {typ}")
    return strict.parse(data, typ)


def _page(items: list, query: dict, key: str, max_size: int) -> dict:
    size = int(query.get("page_size") or 0) or max_size
    size = min(size, max_size)
    start = int(query.get("page_token") or 0)
    chunk = items[start:start + size]
    nxt = start + size
    return {key: [_serialize(i) for i in chunk], "total_size": len(items),
            "next_page_token": str(nxt) if nxt < len(items) else ""}


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


def _stored_spec(raw: bytes) -> dict:
    try:
        docs = [d for d in yaml.safe_load_all(raw) if d is not None]
    except yaml.YAMLError as err:
        raise ApiError(400, f"invalid pipeline YAML: {err}") from None
    if not docs:
        raise ApiError(400, "empty pipeline file")
    try:
        strict.check_pipeline_spec(docs[0])
    except strict.StrictError as err:
        raise ApiError(400, f"Failed to upload pipeline: {err}") from None
    if len(docs) == 1:
        return docs[0]
    return {"pipeline_spec": docs[0], "platform_spec": docs[1]}


def _check_run_spec(spec: dict) -> None:
    pipeline, platform = strict.split_spec(spec)
    try:
        strict.check_pipeline_spec(pipeline)
        strict.check_platform_spec(platform)
    except strict.StrictError as err:
        raise ApiError(400, f"Failed to create a new run: {err}") from None


def _require(cond, status: int, message: str) -> None:
    if not cond:
        raise ApiError(status, message)


def _route(fake: FakeKfp, method: str, path: str, query: dict, body: bytes, ctype: str):
    s = fake.state
    m = lambda pattern: re.fullmatch(API + pattern, path)  # noqa: E731
    ns = query.get("namespace") or None

    if method == "GET" and m("/healthz"):
        return 200, _serialize(kfp_server_api.V2beta1GetHealthzResponse(
            multi_user=fake.multi_user, pipeline_store="database"))

    # --- pipelines --------------------------------------------------------------------
    if method == "GET" and m("/pipelines"):
        preds = _predicates(fake, query.get("filter"))
        items = [p for p in s.pipelines.values()
                 if _matches(p, preds) and (ns is None or p.namespace == ns)]
        return 200, _page(items, query, "pipelines", fake.max_page_size)
    if method == "POST" and m("/pipelines/upload"):
        raw = _upload_file(body, ctype)
        name = query.get("display_name") or query.get("name")
        _require(name, 400, "pipeline name is required")
        _require(not any(p.display_name == name and p.namespace == ns
                         for p in s.pipelines.values()), 409,
                 f"Failed to create a pipeline: AlreadyExistsError: pipeline {name} exists")
        spec = _stored_spec(raw)
        pid = fake.new_id("pipeline")
        pipeline = kfp_server_api.V2beta1Pipeline(
            pipeline_id=pid, display_name=name, name=name,
            description=query.get("description"), namespace=ns, created_at=_now())
        s.pipelines[pid] = pipeline
        s.versions[pid] = [kfp_server_api.V2beta1PipelineVersion(
            pipeline_id=pid, pipeline_version_id=fake.new_id("version"), display_name=name,
            name=name, description=query.get("description"), created_at=_now(),
            pipeline_spec=spec)]
        return 200, _serialize(pipeline)
    if method == "POST" and m("/pipelines/upload_version"):
        raw = _upload_file(body, ctype)
        pid = query.get("pipelineid")
        _require(pid in s.pipelines, 404, f"Pipeline {pid} not found")
        name = query.get("display_name") or query.get("name")
        _require(name, 400, "pipeline version name is required")
        _require(not any(v.display_name == name for v in s.versions[pid]), 409,
                 f"Failed to create a pipeline version: AlreadyExistsError: {name}")
        version = kfp_server_api.V2beta1PipelineVersion(
            pipeline_id=pid, pipeline_version_id=fake.new_id("version"), display_name=name,
            name=name, description=query.get("description"), created_at=_now(),
            pipeline_spec=_stored_spec(raw))
        s.versions[pid].append(version)
        return 200, _serialize(version)
    mm = m(r"/pipelines/([^/]+)/versions")
    if method == "GET" and mm:
        pid = mm.group(1)
        _require(pid in s.pipelines, 404, f"Pipeline {pid} not found")
        preds = _predicates(fake, query.get("filter"))
        items = [v for v in s.versions[pid] if _matches(v, preds)]
        return 200, _page(items, query, "pipeline_versions", fake.max_page_size)
    mm = m(r"/pipelines/([^/]+)/versions/([^/]+)")
    if method == "GET" and mm:
        found = [v for v in s.versions.get(mm.group(1), [])
                 if v.pipeline_version_id == mm.group(2)]
        _require(found, 404, f"PipelineVersion {mm.group(2)} not found")
        return 200, _serialize(found[0])

    # --- experiments ----------------------------------------------------------------------
    if method == "GET" and m("/experiments"):
        preds = _predicates(fake, query.get("filter"))
        items = [e for e in s.experiments.values()
                 if _matches(e, preds) and (ns is None or e.namespace == ns)]
        return 200, _page(items, query, "experiments", fake.max_page_size)
    if method == "POST" and m("/experiments"):
        exp = _json(body, "V2beta1Experiment")
        _require(exp.display_name, 400, "experiment display_name is required")
        _require(not exp.experiment_id, 400, "experiment_id is set by the server")
        exp.experiment_id = fake.new_id("experiment")
        exp.namespace = exp.namespace or None
        exp.created_at = _now()
        exp.storage_state = "AVAILABLE"
        s.experiments[exp.experiment_id] = exp
        return 200, _serialize(exp)

    # --- runs -----------------------------------------------------------------------------
    if method == "POST" and m("/runs"):
        run = _json(body, "V2beta1Run")
        _require(run.display_name, 400, "run display_name is required")
        _require(run.experiment_id in s.experiments, 404,
                 f"Experiment {run.experiment_id} not found")
        spec = run.pipeline_spec
        ref = run.pipeline_version_reference
        _require((spec is None) != (ref is None), 400,
                 "exactly one of pipeline_spec and pipeline_version_reference")
        if ref is not None:
            found = [v for v in s.versions.get(ref.pipeline_id, [])
                     if v.pipeline_version_id == ref.pipeline_version_id]
            _require(found, 404, f"PipelineVersion {ref.pipeline_version_id} not found")
            spec = found[0].pipeline_spec
        _check_run_spec(spec)
        inputs = (strict.split_spec(spec)[0].get("root", {}).get("inputDefinitions", {})
                  .get("parameters", {}))
        params = (run.runtime_config.parameters if run.runtime_config else None) or {}
        unknown = sorted(set(params) - set(inputs))
        _require(not unknown, 400, f"unknown pipeline parameters {unknown}")
        run.run_id = fake.new_id("run")
        run.created_at = _now()
        run.state = "PENDING"
        script = list(fake.scripts.pop(0) if fake.scripts else DEFAULT_SCRIPT)
        s.runs[run.run_id] = [run, script]
        return 200, _serialize(run)
    mm = m(r"/runs/([^/:]+)")
    if method == "GET" and mm:
        _require(mm.group(1) in s.runs, 404, f"Run {mm.group(1)} not found")
        run, script = s.runs[mm.group(1)]
        if script:
            run.state = script.pop(0)
        task_state = {"PENDING": "PENDING", "RUNNING": "RUNNING"}.get(run.state, run.state)
        run.run_details = kfp_server_api.V2beta1RunDetails(task_details=[
            kfp_server_api.V2beta1PipelineTaskDetail(
                run_id=run.run_id, task_id=f"{run.run_id}-preflight", display_name="preflight",
                state=task_state)])
        if run.state in ("FAILED", "ERROR"):
            run.error = kfp_server_api.GoogleRpcStatus(code=2, message="task smoke failed")
        return 200, _serialize(run)

    # --- recurring runs ------------------------------------------------------------------
    if method == "POST" and m("/recurringruns"):
        rr = _json(body, "V2beta1RecurringRun")
        _require(rr.display_name, 400, "recurring run display_name is required")
        _require(rr.experiment_id in s.experiments, 404,
                 f"Experiment {rr.experiment_id} not found")
        ref = rr.pipeline_version_reference
        _require(ref is not None or rr.pipeline_spec is not None, 400, "no pipeline")
        if ref is not None:
            _require(any(v.pipeline_version_id == ref.pipeline_version_id
                         for v in s.versions.get(ref.pipeline_id, [])), 404,
                     f"PipelineVersion {ref.pipeline_version_id} not found")
        trig = rr.trigger
        _require(trig is not None and ((trig.cron_schedule is None)
                                       != (trig.periodic_schedule is None)), 400,
                 "exactly one of cron_schedule and periodic_schedule")
        if trig.cron_schedule is not None:
            _require(len(trig.cron_schedule.cron.split()) == 6
                     or trig.cron_schedule.cron.startswith("@"), 400,
                     f"invalid cron {trig.cron_schedule.cron!r}: expected 6 fields")
        _require(rr.mode in ("ENABLE", "DISABLE"), 400, "mode must be ENABLE or DISABLE")
        _require(1 <= int(rr.max_concurrency or 1) <= 10, 400,
                 "max_concurrency must be within [1, 10]")
        rr.recurring_run_id = fake.new_id("recurring")
        rr.status = "ENABLED" if rr.mode == "ENABLE" else "DISABLED"
        rr.max_concurrency = str(rr.max_concurrency or 1)
        if trig.periodic_schedule is not None:
            trig.periodic_schedule.interval_second = str(trig.periodic_schedule.interval_second)
        rr.namespace = s.experiments[rr.experiment_id].namespace
        rr.created_at = rr.updated_at = _now()
        s.recurring[rr.recurring_run_id] = rr
        return 200, _serialize(rr)
    if method == "GET" and m("/recurringruns"):
        preds = _predicates(fake, query.get("filter"))
        exp = query.get("experiment_id")
        items = [r for r in s.recurring.values()
                 if _matches(r, preds) and (exp is None or r.experiment_id == exp)
                 and (ns is None or r.namespace == ns)]
        return 200, _page(items, query, "recurringRuns", fake.max_page_size)
    mm = m(r"/recurringruns/([^/:]+)(:enable|:disable)?")
    if mm:
        rid, action = mm.group(1), mm.group(2)
        _require(rid in s.recurring, 404, f"RecurringRun {rid} not found")
        rr = s.recurring[rid]
        if method == "GET" and not action:
            return 200, _serialize(rr)
        if method == "POST" and action:
            _require(not body.strip() or json.loads(body) == {}, 400, "unexpected body")
            rr.mode = "ENABLE" if action == ":enable" else "DISABLE"
            rr.status = "ENABLED" if action == ":enable" else "DISABLED"
            return 200, {}
        if method == "DELETE" and not action:
            del s.recurring[rid]
            return 200, {}
    raise ApiError(404, f"Not Found: {method} {path}")
