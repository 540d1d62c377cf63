"""draslice's cron conversion, checked by the cron library KFP's scheduler runs.

KFP's ScheduledWorkflow controller parses a recurring run's cron with github.com/robfig/cron
v1.2.0 (``cron.Parse``: six fields, seconds first), the version KFP's go.mod pins. The Go
program in ``croncheck/`` links that library. For every five-field expression a user may write,
the schedule KFP derives from ``to_kfp_cron(expr)`` must fire at the same times as the library's
own standard five-field reading of ``expr`` (``cron.ParseStandard``). The library decides, not a
table written here. Marker ``kfp``: ``make test-kfp`` (needs Go and the module proxy once).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from draslice.errors import InvalidParameter
from draslice.kfp_ops.cron import to_kfp_cron

pytestmark = pytest.mark.kfp
HERE = Path(__file__).parent / "croncheck"
START = "2026-02-27T23:59:30Z"  # a month end, a leap-free February, just before midnight
COUNT = 40

FIVE_FIELD = [
    "0 2 * * *", "*/15 * * * *", "0 9 * * MON-FRI", "30 1 1,15 * *", "0 0 1 JAN *",
    "0 */6 * * *", "5 4 * * SUN", "0 0 * * 0", "0 12 ? * WED", "59 23 31 12 *",
    "0 0 29 2 *", "10-20/5 8-10 * * 1,3,5", "0 0 * jan-mar sat", "7 7 7 7 *", "0 0 1 */2 *",
    "@daily", "@hourly", "@weekly", "@monthly",
]
REJECTED = ["60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *", "* * * * 7",
            "*/0 * * * *", "5-1 * * * *", "a * * * *"]


@pytest.fixture(scope="module")
def croncheck(tmp_path_factory) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go not found: this test links KFP's cron library (Go >= 1.26)")
    binary = tmp_path_factory.mktemp("croncheck") / "croncheck"
    subprocess.run([go, "build", "-o", str(binary), "."], cwd=HERE, check=True, timeout=300)
    return binary


def ask(binary: Path, queries: list[dict]) -> list[dict]:
    for q in queries:
        q.setdefault("start", START)
        q.setdefault("count", COUNT)
    out = subprocess.run([str(binary)], input=json.dumps(queries), capture_output=True,
                         text=True, check=True, timeout=60)
    return json.loads(out.stdout)


@pytest.mark.parametrize("expr", FIVE_FIELD)
def test_kfp_fires_when_the_five_fields_say(croncheck, expr):
    [answer] = ask(croncheck, [{"kfp": to_kfp_cron(expr), "standard": expr}])
    assert "kfp_error" not in answer and "standard_error" not in answer, answer
    assert answer["kfp_next"]  # robfig looks five years ahead: 29 Feb gets 18 of COUNT
    assert answer["kfp_next"] == answer["standard_next"]


def test_five_fields_sent_unconverted_mean_something_else_to_kfp(croncheck):
    """Why the conversion exists: KFP reads '0 2 * * *' as second 0, minute 2, every hour."""
    [raw] = ask(croncheck, [{"kfp": "0 2 * * *", "standard": "0 2 * * *", "count": 3}])
    assert raw["kfp_next"] == ["2026-02-28T00:02:00Z", "2026-02-28T01:02:00Z",
                               "2026-02-28T02:02:00Z"]
    assert raw["standard_next"][0] == "2026-02-28T02:00:00Z"


def test_six_fields_pass_through_as_kfp_reads_them(croncheck):
    six = "30 0 2 * * *"
    assert to_kfp_cron(six) == six
    [answer] = ask(croncheck, [{"kfp": six, "count": 2}])
    assert answer["kfp_next"] == ["2026-02-28T02:00:30Z", "2026-03-01T02:00:30Z"]


@pytest.mark.parametrize("expr", REJECTED)
def test_what_draslice_refuses_kfp_refuses_too(croncheck, expr):
    with pytest.raises(InvalidParameter):
        to_kfp_cron(expr)
    [answer] = ask(croncheck, [{"kfp": "0 " + expr, "standard": expr}])
    assert answer.get("kfp_error") and answer.get("standard_error"), answer


# What KFP's API server and controller are handed verbatim: 5 and 6 fields, descriptors,
# @every, and every kind of mistake robfig names (its error text is what the server answers).
ROBFIG_SPECS = [
    "0 2 * * *", "0 0 2 * * *", "30 0 2 * * ?", "0 0 0 29 2 *", "0 0 2 31 2 *", "0 0 0 1,,15 * *",
    "*/7 */13 1-5 * * MON-fri", "0 0 0 * jan-MAR 0", "5/20 * * * *", "0 30 9 1 * 1",
    "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly",
    "@every 1h30m", "@every 90s", "@every 0.5s",
    "0 0 25 * * *", "60 * * * * *", "* * * 0 * *", "* * * * 13 *", "* * * * * 7", "a * * * * *",
    "1-2-3 * * * * *", "1/2/3 * * * * *", "*/0 * * * * *", "5-1 * * * * *", "-1 * * * * *",
    "0 0 2 * *  * *", "0 2 * *", "", "@every", "@every x", "@every 1", "@every 1q", "@daily ",
    "@fortnightly", "+5 * * * * *", "* * * * * FUNDAY",
]


@pytest.mark.parametrize("spec", ROBFIG_SPECS)
def test_the_port_of_robfig_answers_as_the_library(croncheck, spec):
    """kfp_ops/cron.py's robfig port (the test server's cron check and draslice's "never
    fires" check) against the library: the same error text, or the same fire times."""
    from datetime import datetime

    from draslice.kfp_ops.cron import RobfigError, robfig_parse

    [answer] = ask(croncheck, [{"kfp": spec}])
    try:
        schedule = robfig_parse(spec)
    except RobfigError as err:
        assert answer.get("kfp_error") == str(err), answer
        return
    assert "kfp_error" not in answer, answer
    times, t = [], datetime.fromisoformat(START)
    for _ in range(COUNT):
        t = schedule.next(t)
        if t is None:
            break
        times.append(t.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert times == answer["kfp_next"]
