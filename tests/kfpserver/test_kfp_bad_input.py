"""Bad input and answers that are not KFP's: one line, the documented exit code, nothing sent
that would fail later, and no secret in any output or log (README: 2 bad input, 10 any
other server error)."""

from __future__ import annotations

import pytest

from draslice.components.image import DEFAULT_TRAINER_IMAGE

TOKEN = "tok-echoed-7c6b5a-SECRET"


def _one_error_line(res, code: int, *needles: str) -> str:
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.output
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def _sent(fake, method: str) -> list[str]:
    return [r.path for r in fake.requests if r.method == method]


# --- answers that are not the KFP API's ------------------------------------------------------

@pytest.mark.parametrize(("body", "ctype", "words"), [
    ("<html><body>Welcome to nginx!</body></html>", "text/html",
     "did not answer with JSON (HTTP 200, 43 characters of text/html: '<html><body>Welcome"),
    ('{"items": [], "kind": "List"}', "application/json",
     "the answer has none of the fields of a ListRecurringRunsResponse (it has items, kind)"),
    ("[]", "application/json", "the answer is list, not a ListRecurringRunsResponse object"),
    ('{"recurringRuns": [{"display_name": "draslice-x"}]}', "application/json",
     "recurringRuns[0] is a RecurringRun without recurring_run_id"),
    ('{"recurringRuns": {"a": 1}}', "application/json", "recurringRuns is dict, not a list"),
])
def test_schedule_list_on_an_answer_that_is_not_kfps_is_an_error(cli, fake_kfp, body, ctype,
                                                                 words):
    fake_kfp.answer("GET", r"/recurringruns$", body, content_type=ctype)
    res = cli("schedule", "list")
    _one_error_line(res, 10, "listing schedules:", words, "Check --host")
    assert "no schedules" not in res.output


def test_an_empty_answer_is_kfps_empty_list(cli, fake_kfp):
    """KFP leaves empty fields out: ``{}`` is its answer for no schedules."""
    fake_kfp.answer("GET", r"/recurringruns$", "{}")
    res = cli("schedule", "list")
    assert res.exit_code == 0 and res.output == "no schedules\n"


@pytest.mark.parametrize(("path", "body", "words"), [
    # the pipeline list names ours without an id: kfp.Client would later raise
    # "ValueError: Either pipeline_id or pipeline_name is required"
    (r"/pipelines$", '{"pipelines": [{"display_name": "draslice-sft-mig-1g-6gb"}]}',
     "pipelines[0] is a Pipeline without pipeline_id"),
    (r"/pipelines$", "OK", "did not answer with JSON (HTTP 200, 2 characters of "
                           "application/json: 'OK')"),
    (r"/pipelines/upload$", '{"display_name": "x"}', "the answer is a Pipeline without "
                                                      "pipeline_id"),
])
def test_upload_on_an_unexpected_answer_is_an_error(cli, fake_kfp, path, body, words):
    fake_kfp.answer("GET" if "upload" not in path else "POST", path, body)
    res = cli("upload")
    _one_error_line(res, 10, "uploading draslice-sft-mig-1g-6gb:", words)
    assert "ValueError" not in res.output
    assert not fake_kfp.state.versions or "upload" in path


# --- secrets ---------------------------------------------------------------------------------

def test_a_token_echoed_into_a_malformed_answer_is_redacted_everywhere(cli, fake_kfp,
                                                                       all_logs):
    fake_kfp.required_token = TOKEN
    fake_kfp.answer("GET", r"/recurringruns$", f"bad gateway; you sent Bearer {TOKEN}",
                    content_type="text/plain")
    res = cli("schedule", "list", env={"KFP_TOKEN": TOKEN})
    line = _one_error_line(res, 10, "<redacted>")
    assert TOKEN not in res.output and TOKEN not in line
    assert TOKEN not in all_logs.text
    assert all(TOKEN not in r.getMessage() for r in all_logs.records)


def test_the_debug_log_of_answers_is_scrubbed_too(fake_kfp, all_logs, monkeypatch):
    """kfp_server_api logs every answer's body at DEBUG (its Configuration.debug)."""
    import logging

    from draslice.kfp_ops import KfpConnection, connect

    monkeypatch.setenv("MY_TOKEN", TOKEN)
    fake_kfp.required_token = TOKEN
    connect(KfpConnection(host=fake_kfp.url, token_env="MY_TOKEN"))
    rest = logging.getLogger("kfp_server_api.rest")
    rest.setLevel(logging.DEBUG)  # what Configuration.debug = True does
    rest.debug("response body: %s", f"echo {TOKEN}")
    assert "response body: echo <redacted>" in all_logs.text and TOKEN not in all_logs.text


def test_a_password_in_host_is_refused_and_never_printed(cli, fake_kfp, all_logs):
    host = fake_kfp.url.replace("://", "://alice:PASSW0RD-x@")
    res = cli("schedule", "list", "--host", host)
    _one_error_line(res, 2, "invalid --host='http://<credentials>@127.0.0.1:",
                    "must not carry credentials", "--token-env")
    assert "PASSW0RD" not in res.output and "PASSW0RD" not in all_logs.text
    assert "alice" not in res.output
    assert fake_kfp.requests == []


# --- bad input, refused before anything is sent ----------------------------------------------

def test_a_binary_variant_file_is_one_line(cli, fake_kfp, tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff binary")
    res = cli("upload", "--variant", str(path))
    _one_error_line(res, 2, f"invalid --variant='{path}': not a text file (byte 0 is 0x89")
    assert fake_kfp.requests == []


def test_a_variant_file_that_is_not_yaml_names_the_line(cli, fake_kfp, tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text("pipelineInfo:\n  name: [x,\nroot: {}\n")
    res = cli("upload", "--variant", str(path))
    _one_error_line(res, 2, f"invalid --variant='{path}': not valid YAML",
                    "(line 4 column 1: expected ','")
    assert fake_kfp.requests == []


@pytest.mark.parametrize(("args", "words"), [
    (("submit", "--param", "steps=-5"), "invalid --param steps=-5: must be >= 1"),
    (("submit", "--upload", "--param", "lora_r=0"), "invalid --param lora_r=0"),
    (("submit", "--variant", "canary.policy.mig-1g-6gb", "--param", "device=tpu"),
     "invalid --param device='tpu'"),
    # the finetune preset's warmup (10 steps) does not fit 5 steps
    (("submit", "--variant", "finetune.policy.mig-1g-6gb", "--param", "steps=5"),
     "invalid --param warmup_steps=10: must be in [0, steps=5) (the pipeline's default; set "
     "it too with --param warmup_steps=VALUE)"),
    (("schedule", "create", "--variant", "sft.policy.mig-1g-6gb", "--param",
      "learning_rate=-1"), "invalid --param learning_rate=-1.0: must be > 0"),
    (("schedule", "create", "--variant", "canary.policy.mig-1g-6gb", "--param",
      "on_missing_dra=maybe"), "invalid --param on_missing_dra='maybe': must be one of skip, fail"),
    (("submit", "--variant", "sft.policy.mig-1g-6gb", "--param", "precision=fp8"),
     "invalid --param precision='fp8': must be one of"),
])
def test_params_are_checked_against_the_knobs_ranges_before_sending(cli, fake_kfp, args, words):
    res = cli(*args)
    _one_error_line(res, 2, words)
    assert _sent(fake_kfp, "POST") == [] and _sent(fake_kfp, "GET") == []


def test_params_in_range_are_sent(cli, fake_kfp):
    res = cli("submit", "--variant", "finetune.policy.mig-1g-6gb", "--param", "steps=20",
              "--param", "warmup_steps=2")
    assert res.exit_code == 0, res.output
    (run,) = fake_kfp.state.runs.values()
    assert run[0].runtime_config.parameters["steps"] == 20


# --- the default trainer image ---------------------------------------------------------------

def test_upload_and_submit_warn_once_about_the_default_image(cli, fake_kfp):
    for args in (("upload", "--all"), ("submit",)):
        res = cli(*args)
        assert res.exit_code == 0, res.output
        warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1, res.stderr
        assert DEFAULT_TRAINER_IMAGE in warnings[0] and "draslice compile --image" in warnings[0]


def test_no_warning_for_a_pipeline_on_your_image(cli, fake_kfp, tmp_path):
    from click.testing import CliRunner

    from draslice.cli import main

    out = tmp_path / "mine"
    compiled = CliRunner().invoke(main, ["compile", "--template", "mig-1g-6gb", "--kind",
                                         "canary", "--image", "registry.example.com/t:1",
                                         "--out", str(out)])
    assert compiled.exit_code == 0, compiled.output
    res = cli("upload", "--variant", str(out / "canary.policy.mig-1g-6gb.yaml"))
    assert res.exit_code == 0 and "warning" not in res.output, res.output


# --- answers that are not text; files that name what they do not define ----------------------

JUNK = b"\x89PNG\r\n\x1a\n\x00\xff\xfe\xc3\x28 binary junk"


@pytest.mark.parametrize(("args", "method", "path", "action"), [
    (("upload",), "GET", r"/pipelines$", "uploading draslice-sft-mig-1g-6gb"),
    (("schedule", "list"), "GET", r"/recurringruns$", "listing schedules"),
])
def test_a_binary_answer_is_one_line(cli, fake_kfp, args, method, path, action):
    fake_kfp.answer(method, path, JUNK, content_type="application/octet-stream")
    res = cli(*args)
    line = _one_error_line(res, 10, f"{action}: the server at {fake_kfp.url} did not answer "
                                    f"with JSON (HTTP 200, {len(JUNK)} bytes of "
                                    "application/octet-stream that are not text)")
    assert "UnicodeDecodeError" not in res.output and "Check --host" in line


def test_a_binary_error_answer_is_one_line_too(cli, fake_kfp):
    fake_kfp.answer("POST", r"/pipelines/upload$", JUNK, status=502,
                    content_type="application/octet-stream")
    res = cli("upload")
    _one_error_line(res, 10, "uploading draslice-sft-mig-1g-6gb:", "answered HTTP 502")
    assert "UnicodeDecodeError" not in res.output


@pytest.mark.parametrize(("edit", "words"), [
    (lambda spec: spec["root"]["dag"]["tasks"]["preflight"]["componentRef"].update(
        name="comp-missing"),
     "task 'preflight' of root uses component 'comp-missing', which the file does not define "
     "(it defines comp-condition-1, comp-preflight, comp-smoke)"),
    (lambda spec: spec["components"]["comp-smoke"].update(executorLabel="exec-gone"),
     "component 'comp-smoke' runs executor 'exec-gone', which the file does not define"),
    (lambda spec: spec["components"]["comp-condition-1"]["dag"]["tasks"]["smoke"].update(
        dependentTasks=["nope"]),
     "task 'smoke' of comp-condition-1 depends on task 'nope', which comp-condition-1 does not "
     "have"),
    (lambda spec: spec.pop("deploymentSpec"),
     "KFP's SDK cannot load it as a pipeline: no 'deploymentSpec' section"),
    (lambda spec: spec["root"].update(bogus=1),
     "KFP's SDK cannot load it as a pipeline: Failed to parse root field"),
])
def test_a_compiled_file_that_names_what_it_does_not_define_is_refused(cli, fake_kfp, compiled,
                                                                       tmp_path, edit, words):
    import yaml

    docs = list(yaml.safe_load_all((compiled / "canary.policy.mig-1g-6gb.yaml").read_text()))
    edit(docs[0])
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    for command in (("upload",), ("submit",), ("schedule", "create")):
        res = cli(*command, "--variant", str(path))
        _one_error_line(res, 2, f"invalid --variant='{path}': {words}")
    assert fake_kfp.requests == []
