"""The test server must answer as KFP 2.17.0 does, or the other tests prove nothing: raw HTTP
against it, with the statuses, body shapes and texts a real 2.17.0 API server gave (issue 36;
ids aside). Single-user mode unless a test says multi-user."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from draslice.tests.kfpserver import kfp_strict
from draslice.tests.kfpserver.kfp_fake_server import FakeKfp

REPO = Path(__file__).resolve().parents[2]
API = "/apis/v2beta1"
STATUS = "type.googleapis.com/google.rpc.Status"


def _call(fake, method: str, path: str, doc=None, raw: bytes | None = None,
          headers: dict | None = None) -> tuple[int, str, bytes]:
    data = raw if raw is not None else (None if doc is None else json.dumps(doc).encode())
    req = urllib.request.Request(fake.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


def _json(fake, method: str, path: str, doc=None) -> tuple[int, dict]:
    status, _, body = _call(fake, method, path, doc)
    return status, json.loads(body)


def _kfp_error(body: dict, code: int, message: str) -> None:
    """KFP's error shape: code, message, details holding one google.rpc.Status; no 'error'."""
    assert set(body) == {"code", "message", "details"}, body
    assert body["code"] == code and body["message"] == message, body
    (detail,) = body["details"]
    assert detail["@type"] == STATUS and set(detail) == {"@type", "code", "message"}


def _upload(fake, variant: str, name: str, query: str = "") -> dict:
    text = (REPO / "compiled" / f"{variant}.yaml").read_bytes()
    boundary = "draslice-test-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"uploadfile\"; "
            f"filename=\"p.yaml\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode() \
        + text + f"\r\n--{boundary}--\r\n".encode()
    status, _, answer = _call(fake, "POST", f"{API}/pipelines/upload?name={name}{query}",
                              raw=body, headers={"Content-Type":
                                                 f"multipart/form-data; boundary={boundary}"})
    assert status == 200, answer
    pipeline = json.loads(answer)
    (version,) = fake.state.versions[pipeline["pipeline_id"]]
    return {"pipeline_id": pipeline["pipeline_id"], "version_id": version.pipeline_version_id}


def _experiment(fake) -> str:
    status, exp = _json(fake, "POST", f"{API}/experiments", {"display_name": "e"})
    assert status == 200
    return exp["experiment_id"]


def _run(fake, ids: dict, params: dict | None = None, **extra) -> tuple[int, dict]:
    doc = {"display_name": "r", "experiment_id": _experiment(fake),
           "pipeline_version_reference": {"pipeline_id": ids["pipeline_id"],
                                          "pipeline_version_id": ids["version_id"]},
           **extra}
    if params is not None:
        doc["runtime_config"] = {"parameters": params}
    return _json(fake, "POST", f"{API}/runs", doc)


def _recurring(fake, ids: dict | None, cron: str | None = "0 0 2 * * *",
               **extra) -> tuple[int, dict]:
    doc = {"display_name": "draslice-x", "experiment_id": _experiment(fake), "mode": "ENABLE",
           "max_concurrency": 1, **extra}
    if cron is not None:
        doc["trigger"] = {"cron_schedule": {"cron": cron}}
    if ids is not None:
        doc["pipeline_version_reference"] = {"pipeline_id": ids["pipeline_id"],
                                             "pipeline_version_id": ids["version_id"]}
    return _json(fake, "POST", f"{API}/recurringruns", doc)


# --- request bodies are parsed as strictly as the real server parses them --------------------

@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"display_nam": "x"}, "unknown field 'display_nam'"),
        ({"display_name": 3}, "expected a string"),
        ({"display_name": "x", "storage_state": "GONE"}, "is not one of"),
        ({"display_name": "x", "created_at": "yesterday"}, "not an RFC 3339 time"),
    ],
)
def test_malformed_bodies_are_400_and_recorded(fake_kfp, doc, says):
    status, body = _json(fake_kfp, "POST", f"{API}/experiments", doc)
    assert status == 400 and body["code"] == 3 and says in body["message"]
    assert "error" not in body
    assert len(fake_kfp.violations) == 1 and says in fake_kfp.violations[0]
    fake_kfp.violations.clear()  # expected here; the fixture fails any other test on them


def test_nested_models_are_checked_too():
    run = {"display_name": "r", "experiment_id": "e",
           "runtime_config": {"parameters": {"a": 1}, "pipelineRoot": "gs://x"}}
    with pytest.raises(kfp_strict.StrictError, match=r"\$\.runtime_config: unknown field"):
        kfp_strict.check(run, "V2beta1Run")
    rr = {"trigger": {"cron_schedule": {"cron": "0 0 2 * * *"}}, "max_concurrency": 2,
          "mode": "ENABLE"}
    kfp_strict.check(rr, "V2beta1RecurringRun")  # int64 as a JSON number, like protojson


# --- fact 7: error bodies and texts; Go's plain 404 outside /apis/ ----------------------------

def test_not_found_texts_are_kfps(fake_kfp):
    status, body = _json(fake_kfp, "GET", f"{API}/pipelines/p/versions/v-nope")
    assert status == 404
    _kfp_error(body, 5, "Failed to get a pipeline version v-nope: Failed to get a pipeline "
                        "version with id v-nope: ResourceNotFoundError: PipelineVersion v-nope "
                        "not found")
    assert body["details"][0]["message"] == "PipelineVersion v-nope not found"
    status, body = _json(fake_kfp, "GET", f"{API}/recurringruns/rr-nope")
    assert status == 404
    _kfp_error(body, 5, "Failed to fetch a recurring run: ResourceNotFoundError: Job rr-nope "
                        "not found")
    status, body = _json(fake_kfp, "GET", f"{API}/runs/run-nope")
    assert status == 404
    _kfp_error(body, 5, "Failed to get a run: Failed to fetch run run-nope: "
                        "ResourceNotFoundError: Run run-nope not found")


def test_a_wrong_path_prefix_is_gos_plain_text_404(fake_kfp):
    status, ctype, body = _call(fake_kfp, "GET", "/not-kfp/apis/v2beta1/healthz")
    assert (status, body) == (404, b"404 page not found\n")
    assert ctype.startswith("text/plain")


# --- fact 3: a version of another pipeline -----------------------------------------------------

def test_a_version_is_found_under_any_pipeline_id_and_the_run_then_fails(fake_kfp):
    ids = _upload(fake_kfp, "canary.policy.mig-1g-6gb", "a")
    other = _upload(fake_kfp, "canary.policy.shared-gpu-timeslice", "b")
    vid, pid = ids["version_id"], ids["pipeline_id"]
    status, version = _json(fake_kfp, "GET", f"{API}/pipelines/{other['pipeline_id']}/versions/"
                                             f"{vid}")
    assert status == 200 and version["pipeline_id"] == pid
    status, body = _run(fake_kfp, {"pipeline_id": other["pipeline_id"], "version_id": vid})
    assert status == 500
    _kfp_error(body, 13, "Failed to create a new run: InternalServerError: Failed to create a "
                         "run due to error fetching manifest: Failed to fetch a template due to "
                         "error retrieving pipeline version: Invalid input error: Pipeline "
                         f"version {vid} belongs to pipeline {pid} (not {other['pipeline_id']})")
    assert not fake_kfp.state.runs


# --- facts 1, 2, 5: runs ----------------------------------------------------------------------

def test_a_new_run_has_no_state_until_the_persistence_agent_reports_one(fake_kfp):
    ids = _upload(fake_kfp, "canary.policy.mig-1g-6gb", "a")
    fake_kfp.script_next_run(None, "RUNNING")
    status, run = _run(fake_kfp, ids)
    assert status == 200 and "state" not in run
    (entry,) = run["state_history"]
    assert set(entry) == {"update_time"}
    status, got = _json(fake_kfp, "GET", f"{API}/runs/{run['run_id']}")
    assert status == 200 and "state" not in got
    assert _json(fake_kfp, "GET", f"{API}/runs/{run['run_id']}")[1]["state"] == "RUNNING"


@pytest.mark.parametrize(("params", "message"), [
    ({"steps": "60"}, "Failed to create a new run: Failed to generate the ExecutionSpec: invalid "
                      "pipeline job inputs: Invalid input error: input parameter steps requires "
                      "type double or integer, but the parameter value is not of number value "
                      "type"),
    ({"stepz": 3}, "Failed to create a new run: Failed to generate the ExecutionSpec: invalid "
                   "pipeline job inputs: Invalid input error: parameter(s) provided are not "
                   "required by pipeline: stepz"),
])
def test_run_parameters_are_checked_with_kfps_texts(fake_kfp, params, message):
    ids = _upload(fake_kfp, "sft.policy.mig-1g-6gb", "a")
    status, body = _run(fake_kfp, ids, params)
    assert status == 400
    _kfp_error(body, 3, message)
    assert not fake_kfp.state.runs


def test_a_native_mode_run_is_the_500_of_a_217_backend(fake_kfp):
    ids = _upload(fake_kfp, "sft.native.mig-1g-6gb", "a")  # the upload is accepted
    status, body = _run(fake_kfp, ids)
    assert status == 500
    assert set(body) == {"code", "message", "details"} and body["code"] == 13
    (detail,) = body["details"]
    assert (detail["@type"], detail["code"]) == (STATUS, 2)
    message = body["message"]
    lines = message.split("\n")
    assert lines[0] == ('Internal error: compiling DAG "comp-condition-1": compiling task '
                        '"finetune": error creating executor for "finetune": failed to '
                        'unmarshal kubernetes config: proto: (line 1:2): unknown field '
                        '"podResourceClaims"')
    for wrap in ("Failed to compile job", "Failed to generate the ExecutionSpec",
                 "Failed to create a new run"):
        assert f"\n{wrap}\n" in message
    assert message.index("compile job") < message.index("ExecutionSpec") < message.index(
        "a new run")
    frames = [ln for ln in lines if ln.startswith("\t/go/src/github.com/kubeflow/pipelines/")]
    assert len(lines) >= 80 and len(frames) >= 20  # 85 lines on the real one
    assert not fake_kfp.state.runs


# --- fact 8: paging -----------------------------------------------------------------------------

def test_lists_page_by_20_at_most_200_with_opaque_tokens(fake_kfp):
    exp = _experiment(fake_kfp)
    for i in range(1, 230):
        assert _json(fake_kfp, "POST", f"{API}/experiments", {"display_name": f"e{i}"})[0] == 200
    status, page = _json(fake_kfp, "GET", f"{API}/experiments")
    assert status == 200 and len(page["experiments"]) == 20 and page["total_size"] == 230
    assert page["experiments"][0]["experiment_id"] == exp
    token = page["next_page_token"]
    assert not token.isdigit() and json.loads(base64.b64decode(token))
    status, big = _json(fake_kfp, "GET", f"{API}/experiments?page_size=1000")
    assert len(big["experiments"]) == 200
    seen, token = [], ""
    while True:
        _, page = _json(fake_kfp, "GET", f"{API}/experiments?page_size=200&page_token={token}")
        seen += [e["experiment_id"] for e in page["experiments"]]
        token = page.get("next_page_token", "")
        if not token:
            break
    assert len(seen) == len(set(seen)) == 230


def test_runs_can_be_listed(fake_kfp):
    ids = _upload(fake_kfp, "canary.policy.mig-1g-6gb", "a")
    _, run = _run(fake_kfp, ids)
    status, listed = _json(fake_kfp, "GET", f"{API}/runs")
    assert status == 200 and [r["run_id"] for r in listed["runs"]] == [run["run_id"]]


# --- fact 6: namespace --------------------------------------------------------------------------

def test_single_user_mode_ignores_namespace(fake_kfp):
    _upload(fake_kfp, "canary.policy.mig-1g-6gb", "a", "&namespace=team-a")
    status, body = _json(fake_kfp, "GET", f"{API}/pipelines?namespace=team-b")
    assert status == 200 and [p["display_name"] for p in body["pipelines"]] == ["a"]
    assert "namespace" not in body["pipelines"][0]


def test_multi_user_mode_keeps_and_filters_namespaces():
    fake = FakeKfp()
    fake.multi_user = True
    fake.start()
    try:
        _upload(fake, "canary.policy.mig-1g-6gb", "a", "&namespace=team-a")
        assert _json(fake, "GET", f"{API}/pipelines?namespace=team-b")[1] == {}
        (listed,) = _json(fake, "GET", f"{API}/pipelines?namespace=team-a")[1]["pipelines"]
        assert listed["namespace"] == "team-a"
        assert _json(fake, "GET", f"{API}/healthz")[1]["multi_user"] is True
    finally:
        fake.stop()


# --- fact 4: recurring runs, validated as the server does -------------------------------------

def test_a_five_field_cron_and_no_trigger_are_accepted(fake_kfp):
    ids = _upload(fake_kfp, "canary.policy.mig-1g-6gb", "a")
    assert _recurring(fake_kfp, ids, "0 2 * * *")[0] == 200
    assert _recurring(fake_kfp, ids, None)[0] == 200


@pytest.mark.parametrize(("overrides", "status", "message"), [
    ({"cron": "0 0 25 * * *"}, 400,
     "Failed to create a recurring run due to conversion error: Invalid input error: Schedule "
     "cron is not a supported format(https://godoc.org/github.com/robfig/cron). Error: End of "
     "range (25) above maximum (23): 25"),
    ({"max_concurrency": 11}, 400,
     "Failed to create a recurring run due to conversion error: Invalid input error: Max "
     "concurrency of a recurring run must be at least 1 and at most 10. Received 11"),
    ({"max_concurrency": 0}, 400,
     "Failed to create a recurring run due to conversion error: Invalid input error: Max "
     "concurrency of a recurring run must be at least 1 and at most 10. Received 0"),
    ({"runtime_config": {"parameters": {"stepz": 3}}}, 400,
     "Failed to create a recurring run: Failed to create a recurring run during scheduled "
     "workflow creation: invalid pipeline job inputs: Invalid input error: parameter(s) "
     "provided are not required by pipeline: stepz"),
])
def test_recurring_runs_are_refused_with_kfps_texts(fake_kfp, overrides, status, message):
    ids = _upload(fake_kfp, "canary.policy.mig-1g-6gb", "a")
    cron = overrides.pop("cron", "0 0 2 * * *")
    got, body = _recurring(fake_kfp, ids, cron, **overrides)
    assert got == status
    _kfp_error(body, 3, message)
    assert not fake_kfp.state.recurring


def test_a_recurring_run_of_a_missing_version_is_a_500(fake_kfp):
    ids = _upload(fake_kfp, "canary.policy.mig-1g-6gb", "a")
    status, body = _recurring(fake_kfp, {**ids, "version_id": "v-gone"})
    assert status == 500
    assert body["code"] == 13 and body["message"].startswith(
        "Failed to create a recurring run: InternalServerError: Failed to create a recurring run "
        "with an invalid pipeline spec manifest: ")
    assert body["message"].endswith("ResourceNotFoundError: PipelineVersion v-gone not found")


def test_max_concurrency_is_checked_before_the_cron(fake_kfp):
    """KFP's toModelJob checks them in this order; a body with both wrong names the first."""
    ids = _upload(fake_kfp, "canary.policy.mig-1g-6gb", "a")
    _, body = _recurring(fake_kfp, ids, "bad", max_concurrency=11)
    assert "Max concurrency" in body["message"]


# --- fact 9: the ScheduledWorkflow ----------------------------------------------------------

def test_the_scheduled_workflow_follows_the_recurring_run(fake_kfp):
    ids = _upload(fake_kfp, "canary.policy.mig-1g-6gb", "a")
    _, rr = _recurring(fake_kfp, ids, "0 0 2 * * *", no_catchup=True)
    rid = rr["recurring_run_id"]
    swf = fake_kfp.state.scheduled_workflows[rid]["spec"]
    assert swf["trigger"] == {"cronSchedule": {"cron": "0 0 2 * * *"}}
    assert (swf["maxConcurrency"], swf["noCatchup"], swf["enabled"]) == (1, True, True)
    (version,) = fake_kfp.state.versions[ids["pipeline_id"]]
    assert swf["pipelineName"] == version.display_name
    assert json.loads(swf["workflow"]["spec"])["kind"] == "Workflow"
    assert _call(fake_kfp, "POST", f"{API}/recurringruns/{rid}:disable")[0] == 200
    assert fake_kfp.state.scheduled_workflows[rid]["spec"]["enabled"] is False
    assert _call(fake_kfp, "POST", f"{API}/recurringruns/{rid}:enable")[0] == 200
    assert fake_kfp.state.scheduled_workflows[rid]["spec"]["enabled"] is True
    assert _call(fake_kfp, "DELETE", f"{API}/recurringruns/{rid}")[0] == 200
    assert rid not in fake_kfp.state.scheduled_workflows


# --- the native rejection's Go text, against the compiled files -----------------------------

def test_native_platform_spec_fails_like_a_217_backend():
    """KFP's compiler wording around Go protojson's (see executor_config_error)."""
    expected = (r'error creating executor for "exec-smoke": failed to unmarshal kubernetes '
                r'config: proto: \(line 1:2\): unknown field "podResourceClaims"')
    with pytest.raises(kfp_strict.StrictError, match=expected):
        kfp_strict.check_platform_spec({"platforms": {"kubernetes": {"deploymentSpec": {
            "executors": {"exec-smoke": {"podResourceClaims": [
                {"resourceClaimTemplateName": "mig-1g-6gb"}]}}}}}})


def test_unknown_routes_under_apis_are_grpc_gateways_404(fake_kfp):
    status, body = _json(fake_kfp, "GET", f"{API}/nothing/here")
    assert status == 404 and body["code"] == 5 and "error" not in body


def test_upload_errors_are_the_upload_handlers_shape(fake_kfp):
    """KFP's upload endpoints are plain HTTP handlers: {error_message, error_details}."""
    _upload(fake_kfp, "canary.policy.mig-1g-6gb", "a")
    status, _, answer = _call(
        fake_kfp, "POST", f"{API}/pipelines/upload?name=a",
        raw=b"--b\r\nContent-Disposition: form-data; name=\"uploadfile\"; filename=\"p\"\r\n\r\n"
            b"x: 1\r\n--b--\r\n", headers={"Content-Type": "multipart/form-data; boundary=b"})
    body = json.loads(answer)
    assert status == 409 and set(body) == {"error_message", "error_details"}
    assert "already exist" in body["error_message"]
