"""The fake server itself must refuse what the real one refuses, or the other tests prove
nothing: strict body parsing, paging, errors in KFP's shape."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.kfpserver import kfp_strict


def _post(url: str, doc) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


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
    status, body = _post(fake_kfp.url + "/apis/v2beta1/experiments", doc)
    assert status == 400 and body["code"] == 3 and says in body["message"]
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


def test_native_platform_spec_fails_like_a_217_backend():
    """KFP's compiler wording around Go protojson's (see check_platform_spec for the sources)."""
    expected = (r'failed to unmarshal kubernetes spec for component "exec-smoke": '
                r'proto: \(line 1:2\): unknown field "podResourceClaims"')
    with pytest.raises(kfp_strict.StrictError, match=expected):
        kfp_strict.check_platform_spec({"platforms": {"kubernetes": {"deploymentSpec": {
            "executors": {"exec-smoke": {"podResourceClaims": [
                {"resourceClaimTemplateName": "mig-1g-6gb"}]}}}}}})


def test_unknown_routes_and_ids_are_404_in_kfps_error_shape(fake_kfp):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(fake_kfp.url + "/apis/v2beta1/runs/nope", timeout=10)
    assert err.value.code == 404
    body = json.loads(err.value.read())
    assert set(body) == {"error", "code", "message", "details"} and body["code"] == 5
