"""``draslice schedule`` against the fake KFP server, and the cron rules it checks first."""

from __future__ import annotations

import json

import pytest

from draslice.errors import InvalidParameter
from draslice.kfp_ops import parse_interval, to_kfp_cron


def _posted(fake):
    return [json.loads(r.body) for r in fake.requests
            if r.method == "POST" and r.path.endswith("/recurringruns")]


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ("0 2 * * *", "0 0 2 * * *"),
        ("*/15 9-17 * * MON-FRI", "0 */15 9-17 * * MON-FRI"),
        ("30 3 1,15 JAN,jul ?", "0 30 3 1,15 JAN,jul ?"),
        ("0 0 2 * * *", "0 0 2 * * *"),
        ("@daily", "@daily"),
    ],
)
def test_cron_is_converted_to_kfps_six_fields(given, sent):
    assert to_kfp_cron(given) == sent


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("0 2 * *", "has 4 fields"),
        ("61 2 * * *", "minute field: 61 is outside 0-59"),
        ("0 24 * * *", "hour field: 24 is outside 0-23"),
        ("0 2 0 * *", "day-of-month field: 0 is outside 1-31"),
        ("0 2 * 13 *", "month field: 13 is outside 1-12"),
        ("0 2 * * 7", "day-of-week field: 7 is outside 0-6"),
        ("0 2 * * FUNDAY", "is not a number or one of SUN"),
        ("*/0 2 * * *", "step '0' must be a positive number"),
        ("0 5-2 * * *", "runs backwards"),
        ("? 2 * * *", "'?' is only allowed"),
    ],
)
def test_bad_cron_names_the_field(bad, says):
    with pytest.raises(InvalidParameter, match=says.replace("?", r"\?").replace("*", r"\*")):
        to_kfp_cron(bad)


def test_intervals():
    assert [parse_interval(x) for x in ("90", "30m", "6h", "1d")] == [90, 1800, 21600, 86400]
    for bad in ("30", "6 hours", "h"):
        with pytest.raises(InvalidParameter):
            parse_interval(bad)


def test_default_is_a_nightly_canary_per_template(cli, fake_kfp):
    res = cli("schedule", "create")
    assert res.exit_code == 0, res.output
    bodies = _posted(fake_kfp)
    assert sorted(b["display_name"] for b in bodies) == [
        "draslice-canary-mig-1g-6gb-nightly", "draslice-canary-shared-gpu-timeslice-nightly"]
    for b in bodies:
        assert b["trigger"]["cron_schedule"]["cron"] == "0 0 2 * * *"
        assert b["mode"] == "ENABLE" and b["no_catchup"] is True
        assert int(b["max_concurrency"]) == 1
        ref = b["pipeline_version_reference"]
        versions = fake_kfp.state.versions[ref["pipeline_id"]]
        assert ref["pipeline_version_id"] == versions[-1].pipeline_version_id
    # idempotent: a second create keeps both schedules and sends nothing new
    again = cli("schedule", "create")
    assert again.exit_code == 0 and again.output.count("exists") == 2
    assert len(_posted(fake_kfp)) == 2


def test_interval_window_concurrency_catchup_and_disabled(cli, fake_kfp):
    res = cli("schedule", "create", "--variant", "canary.policy.mig-1g-6gb", "--every", "6h",
              "--max-concurrency", "3", "--catchup", "--start", "2026-12-01T00:00:00Z",
              "--end", "2027-01-01T00:00:00+01:00", "--disabled", "--param", "device=cpu",
              "--name", "canary-6h")
    assert res.exit_code == 0, res.output
    (b,) = _posted(fake_kfp)
    assert b["display_name"] == "draslice-canary-6h"
    periodic = b["trigger"]["periodic_schedule"]
    assert int(periodic["interval_second"]) == 21600
    assert periodic["start_time"] == "2026-12-01T00:00:00Z"
    assert periodic["end_time"] == "2026-12-31T23:00:00Z"
    assert int(b["max_concurrency"]) == 3 and b["no_catchup"] is False
    assert b["mode"] == "DISABLE"
    assert b["runtime_config"]["parameters"] == {"device": "cpu"}
    assert "disabled" in res.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--cron", "0 25 * * *"), "hour field: 25"),
        (("--cron", "0 2 * * *", "--every", "1h"), "choose one"),
        (("--max-concurrency", "11"), "1 to 10"),
        (("--start", "2027-01-02", "--end", "2027-01-01"), "must be after --start"),
        (("--start", "tomorrow"), "ISO 8601"),
        (("--param", "steps=3"), "no such input"),
    ],
)
def test_invalid_schedules_are_refused_before_sending(cli, fake_kfp, args, says):
    res = cli("schedule", "create", "--variant", "canary.policy.mig-1g-6gb", *args)
    assert res.exit_code == 2, res.output
    assert says in res.output
    assert not _posted(fake_kfp)


def test_list_disable_enable_delete(cli, fake_kfp):
    assert cli("schedule", "create").exit_code == 0
    # somebody else's schedule on the same server is not ours
    exp = next(iter(fake_kfp.state.experiments))
    import kfp_server_api
    fake_kfp.state.recurring["other"] = kfp_server_api.V2beta1RecurringRun(
        recurring_run_id="other", display_name="team-etl", experiment_id=exp, mode="ENABLE",
        status="ENABLED", max_concurrency="1", trigger=kfp_server_api.V2beta1Trigger(
            cron_schedule=kfp_server_api.V2beta1CronSchedule(cron="0 0 * * * *")))
    fake_kfp.max_page_size = 1  # list must walk every page

    listed = cli("schedule", "list")
    assert listed.exit_code == 0
    assert listed.output.count("enabled ") == 2 and "team-etl" not in listed.output
    assert "team-etl" in cli("schedule", "list", "--all").output

    name = "draslice-canary-mig-1g-6gb-nightly"
    off = cli("schedule", "disable", name)
    assert off.exit_code == 0 and "disabled" in off.output
    rid = next(r.recurring_run_id for r in fake_kfp.state.recurring.values()
               if r.display_name == name)
    assert fake_kfp.state.recurring[rid].status == "DISABLED"
    assert cli("schedule", "enable", rid).exit_code == 0
    assert fake_kfp.state.recurring[rid].status == "ENABLED"

    gone = cli("schedule", "delete", name)
    assert gone.exit_code == 0 and rid in gone.output
    assert rid not in fake_kfp.state.recurring
    missing = cli("schedule", "delete", name)
    assert missing.exit_code == 9 and "404" in missing.output


def test_replace_moves_a_schedule_to_the_new_version(cli, fake_kfp, compiled):
    assert cli("schedule", "create", "--variant", "canary.policy.mig-1g-6gb").exit_code == 0
    path = compiled / "canary.policy.mig-1g-6gb.yaml"
    path.write_text(path.read_text().replace("Canary for", "Canary v2 for"))
    kept = cli("schedule", "create", "--variant", "canary.policy.mig-1g-6gb")
    assert "exists" in kept.output and "--replace" in kept.output
    moved = cli("schedule", "create", "--variant", "canary.policy.mig-1g-6gb", "--replace")
    assert moved.exit_code == 0 and "created" in moved.output and "replaced" in moved.output
    (rr,) = fake_kfp.state.recurring.values()
    versions = fake_kfp.state.versions[rr.pipeline_version_reference.pipeline_id]
    assert rr.pipeline_version_reference.pipeline_version_id == versions[-1].pipeline_version_id


# --- a cron that never fires (issue 37), and what KFP 2.17.0 does with ours (issue 36) ---------

@pytest.mark.parametrize(("args", "says"), [
    (("--cron", "0 2 31 2 *"), "never fires: no time in the 4 years after"),
    (("--cron", "0 0 30 2 *"), "never fires"),
    (("--cron", "0 2 * * *", "--start", "2031-01-01T03:00:00Z", "--end",
      "2031-01-02T01:00:00Z"), "first fires at 2031-01-02 02:00:00Z, after --end "
                               "2031-01-02 01:00:00Z"),
])
def test_a_schedule_that_would_never_run_is_refused_before_connecting(cli, fake_kfp, args, says):
    res = cli("schedule", "create", "--variant", "canary.policy.mig-1g-6gb", *args)
    assert res.exit_code == 2, res.output
    assert says in res.output
    assert fake_kfp.requests == []


def test_a_leap_day_fires_within_four_years():
    from datetime import UTC, datetime

    from draslice.kfp_ops.cron import kfp_schedule

    assert kfp_schedule("0 0 29 2 *", now=datetime(2029, 3, 1, tzinfo=UTC)) == "0 0 0 29 2 *"


def test_the_scheduled_workflow_follows_our_calls(cli, fake_kfp):
    """What a real 2.17.0 showed of the ScheduledWorkflow: cron 0 0 2 * * *, maxConcurrency 1,
    noCatchup true, spec.enabled flipped by disable/enable, gone after delete."""
    name = "draslice-canary-mig-1g-6gb-nightly"
    assert cli("schedule", "create", "--variant", "canary.policy.mig-1g-6gb").exit_code == 0
    ((rid, swf),) = fake_kfp.state.scheduled_workflows.items()
    spec = swf["spec"]
    assert spec["trigger"] == {"cronSchedule": {"cron": "0 0 2 * * *"}}
    assert (spec["maxConcurrency"], spec["noCatchup"], spec["enabled"]) == (1, True, True)
    version = fake_kfp.state.versions[spec["pipelineId"]][-1]
    assert spec["pipelineName"] == version.display_name  # the version's name, not the pipeline's
    assert cli("schedule", "disable", name).exit_code == 0
    assert fake_kfp.state.scheduled_workflows[rid]["spec"]["enabled"] is False
    assert cli("schedule", "enable", name).exit_code == 0
    assert fake_kfp.state.scheduled_workflows[rid]["spec"]["enabled"] is True
    assert cli("schedule", "delete", name).exit_code == 0
    assert fake_kfp.state.scheduled_workflows == {}


def test_a_server_refusal_of_a_schedule_is_its_first_line(cli, fake_kfp):
    fake_kfp.fail("POST", r"/recurringruns$", 500, "Failed to create a recurring run: boom\n"
                                                  "main.x\n\t/go/src/x.go:3", times=2)
    res = cli("schedule", "create", "--variant", "canary.policy.mig-1g-6gb")
    assert res.exit_code == 10
    assert res.output.rstrip().endswith("Failed to create a recurring run: boom")
    assert "/go/src/x.go" not in res.output
    verbose = cli("schedule", "create", "--variant", "canary.policy.mig-1g-6gb", "--verbose")
    assert verbose.exit_code == 10
    assert verbose.output.rstrip().endswith("main.x\n\t/go/src/x.go:3")
