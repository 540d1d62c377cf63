"""``draslice submit`` against the fake KFP server: parameters, experiments, waiting, exit
codes, and the native-mode rejection of a KFP 2.17 backend."""

from __future__ import annotations

import json
import re

import pytest

from draslice.kfp_ops import KfpConnection, NativeClaimsRejected, connect, resolve_package
from draslice.kfp_ops import submit as api_submit
from draslice.kfp_ops import wait as api_wait
from draslice.kfp_ops.errors import RunNotFinished


def _posted_runs(fake):
    return [json.loads(r.body) for r in fake.requests if r.method == "POST"
            and r.path.endswith("/runs")]


@pytest.mark.parametrize(
    ("states", "final", "code"),
    [
        (("PENDING", "RUNNING", "SUCCEEDED"), "SUCCEEDED", 0),
        (("PENDING", "RUNNING", "RUNNING", "FAILED"), "FAILED", 1),
        (("RUNNING", "CANCELING", "CANCELED"), "CANCELED", 5),
        (("RUNNING", "ERROR"), "ERROR", 1),
    ],
)
def test_wait_follows_states_to_the_final_one_and_exits_with_its_code(
    cli, fake_kfp, states, final, code
):
    fake_kfp.script_next_run(*states)
    res = cli("submit", "--variant", "canary.policy.mig-1g-6gb", "--wait", "--poll", "0.01")
    assert res.exit_code == code, res.output
    seen = re.findall(r"run (\w+)$", res.output, re.M)
    assert seen == [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]
    assert f"final     {final}" in res.output
    assert "task preflight:" in res.output
    if final == "FAILED":
        assert "task smoke failed" in res.output


def test_submit_types_params_and_gets_or_creates_the_experiment(cli, fake_kfp):
    args = ("submit", "--variant", "sft.policy.mig-1g-6gb", "--experiment", "nightly",
            "--param", "steps=60", "--param", "learning_rate=0.001",
            "--param", "on_missing_dra=fail", "--service-account", "pipeline-runner",
            "--run-name", "my run")
    first = cli(*args)
    assert first.exit_code == 0, first.output
    assert cli(*args).exit_code == 0
    assert [e.display_name for e in fake_kfp.state.experiments.values()] == ["nightly"]
    body = _posted_runs(fake_kfp)[0]
    assert body["runtime_config"]["parameters"] == {
        "steps": 60, "learning_rate": 0.001, "on_missing_dra": "fail"}
    assert body["service_account"] == "pipeline-runner"
    assert body["display_name"] == "my run"
    assert "pipeline_spec" in body and "pipeline_version_reference" not in body
    assert re.search(r"^UI +http://127\.0\.0\.1:\d+/#/runs/details/run-", first.output, re.M)


def test_unknown_param_is_refused_with_the_valid_keys_before_sending(cli, fake_kfp):
    res = cli("submit", "--variant", "canary.policy.mig-1g-6gb", "--param", "stepz=3")
    assert res.exit_code == 2
    assert "stepz" in res.output and "device (str)" in res.output
    assert "on_missing_dra (str)" in res.output
    assert not _posted_runs(fake_kfp)


def test_badly_typed_param_names_the_expected_type(cli, fake_kfp):
    res = cli("submit", "--variant", "sft.policy.mig-1g-6gb", "--param", "steps=many")
    assert res.exit_code == 2
    assert "--param steps='many'" in res.output and "an integer" in res.output
    assert not _posted_runs(fake_kfp)


def test_upload_then_run_the_version(cli, fake_kfp):
    res = cli("submit", "--variant", "canary.policy.shared-gpu-timeslice", "--upload",
              "--param", "device=cpu")
    assert res.exit_code == 0, res.output
    body = _posted_runs(fake_kfp)[0]
    ref = body["pipeline_version_reference"]
    pid = ref["pipeline_id"]
    assert ref["pipeline_version_id"] == fake_kfp.state.versions[pid][-1].pipeline_version_id
    assert "pipeline_spec" not in body
    # run again from the ids alone: inputs come from the version the server stored
    res2 = cli("submit", "--pipeline-id", pid, "--version-id", ref["pipeline_version_id"],
               "--param", "nope=1")
    assert res2.exit_code == 2 and "nope" in res2.output and "device" in res2.output


def test_native_mode_rejected_by_a_217_backend_says_why(cli, fake_kfp):
    res = cli("submit", "--variant", "sft.native.mig-1g-6gb")
    assert res.exit_code == NativeClaimsRejected.exit_code, res.output
    out = res.output
    assert "podResourceClaims" in out and "kubeflow/pipelines#14243" in out
    assert "policy" in out and "sft.policy.mig-1g-6gb" in out
    assert "Traceback" not in out


def test_native_mode_upload_is_accepted_but_the_run_is_not(cli, fake_kfp):
    up = cli("upload", "--variant", "sft.native.mig-1g-6gb")
    assert up.exit_code == 0, up.output
    res = cli("submit", "--variant", "sft.native.mig-1g-6gb", "--upload")
    assert res.exit_code == NativeClaimsRejected.exit_code
    assert "unknown field" in res.output


def test_wrong_version_id_is_a_clear_404(cli, fake_kfp):
    up = cli("upload", "--variant", "canary.policy.mig-1g-6gb")
    pid = re.search(r"id=(\S+)", up.output).group(1)
    res = cli("submit", "--pipeline-id", pid, "--version-id", "no-such-version")
    assert res.exit_code == 9
    assert "404 Not Found" in res.output and "no-such-version" in res.output


def test_python_api_wait_times_out_and_says_the_run_goes_on(fake_kfp):
    fake_kfp.script_next_run(*["RUNNING"] * 50)
    session = connect(KfpConnection(host=fake_kfp.url))
    run = api_submit(session, resolve_package("canary.policy.mig-1g-6gb"),
                     params={"device": "cpu"})
    ticks = iter(range(0, 1000, 10))
    with pytest.raises(RunNotFinished, match="still RUNNING after 30s"):
        api_wait(session, run.run_id, timeout_s=30, clock=lambda: next(ticks),
                 sleep=lambda s: None)


def test_python_api_cancel_is_final_unlike_wait_for_run_completion(fake_kfp):
    fake_kfp.script_next_run("RUNNING", "CANCELED")
    session = connect(KfpConnection(host=fake_kfp.url))
    run = api_submit(session, resolve_package("canary.policy.mig-1g-6gb"))
    lines: list[str] = []
    outcome = api_wait(session, run.run_id, poll_s=0, progress=lines.append)
    assert (outcome.state, outcome.exit_code, outcome.succeeded) == ("CANCELED", 5, False)
    assert any("CANCELED" in line for line in lines)


# --- what KFP 2.17.0 really answers (issue 36); single-user mode ---------------------------

RUN_NAME = r"draslice-canary-mig-1g-6gb \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"


def test_a_run_without_state_is_pending_and_times_out_with_exit_6(cli, fake_kfp):
    fake_kfp.script_next_run(*[None] * 500)
    res = cli("submit", "--variant", "canary.policy.mig-1g-6gb", "--wait", "--timeout", "1",
              "--poll", "0.05")
    assert res.exit_code == 6, res.output
    assert "run PENDING (the server reports no state yet)" in res.output
    assert "still PENDING (the server reports no state yet) after 1s" in res.output
    assert "UNSPECIFIED" not in res.output


def test_a_version_of_another_pipeline_is_refused_naming_both(cli, fake_kfp):
    first = cli("upload", "--variant", "canary.policy.mig-1g-6gb")
    other = cli("upload", "--variant", "canary.policy.shared-gpu-timeslice")
    pid, vid = re.search(r"id=(\S+)[\s\S]*?id=(\S+)", first.output).groups()
    other_pid = re.search(r"id=(\S+)", other.output).group(1)
    res = cli("submit", "--pipeline-id", other_pid, "--version-id", vid)
    assert res.exit_code == 2, res.output
    assert f"invalid --version-id='{vid}': belongs to pipeline {pid}, not to --pipeline-id " \
           f"{other_pid}" in res.output
    assert not _posted_runs(fake_kfp)


@pytest.mark.parametrize("how", ["package", "upload", "ids"])
def test_the_run_is_named_after_the_pipeline_whichever_way_it_is_made(cli, fake_kfp, how):
    """submit --help: [default: '<pipeline name> <UTC time>']."""
    args = ["submit", "--variant", "canary.policy.mig-1g-6gb"]
    if how == "upload":
        args.append("--upload")
    if how == "ids":
        up = cli("upload", "--variant", "canary.policy.mig-1g-6gb")
        pid, vid = re.search(r"id=(\S+)[\s\S]*?id=(\S+)", up.output).groups()
        args = ["submit", "--pipeline-id", pid, "--version-id", vid]
    res = cli(*args)
    assert res.exit_code == 0, res.output
    (body,) = _posted_runs(fake_kfp)
    assert re.fullmatch(RUN_NAME, body["display_name"]), body["display_name"]
    assert re.search(rf"^run +{RUN_NAME}  id=", res.output, re.M)


def test_native_mode_shows_the_servers_first_line_and_the_rest_with_verbose(cli, fake_kfp):
    res = cli("submit", "--variant", "sft.native.mig-1g-6gb")
    assert res.exit_code == NativeClaimsRejected.exit_code, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert line.endswith('Server said: Internal error: compiling DAG "comp-condition-1": '
                         'compiling task "finetune": error creating executor for "finetune": '
                         'failed to unmarshal kubernetes config: proto: (line 1:2): unknown '
                         'field "podResourceClaims"')
    assert "/go/src/" not in res.output and "Failed to compile job" not in res.output
    verbose = cli("submit", "--variant", "sft.native.mig-1g-6gb", "--verbose")
    assert verbose.exit_code == NativeClaimsRejected.exit_code
    after = verbose.output.split(line.removeprefix("error: "), 1)[1]
    assert "\nFailed to compile job\n" in after and "/go/src/github.com/kubeflow/" in after


def test_every_server_error_is_its_first_line(cli, fake_kfp):
    fake_kfp.fail("POST", r"/runs$", 500, "Failed to create a new run: db is down\n"
                                          "github.com/kubeflow/pipelines/backend/x.Y\n\t/go/x.go:1")
    res = cli("submit", "--variant", "canary.policy.mig-1g-6gb")
    assert res.exit_code == 10
    assert res.output.rstrip().endswith("HTTP 500 Internal Server Error: Failed to create a new "
                                        "run: db is down")
    assert "/go/x.go" not in res.output


@pytest.mark.parametrize("param", ["on_missing_dra=maybe", "on_missing_dra=FAIL"])
def test_a_parameter_with_choices_is_checked_before_sending(cli, fake_kfp, param):
    res = cli("submit", "--variant", "canary.policy.mig-1g-6gb", "--param", param)
    assert res.exit_code == 2, res.output
    assert f"invalid --param on_missing_dra='{param.partition('=')[2]}': must be one of skip, " \
           "fail" in res.output
    assert fake_kfp.requests == []
