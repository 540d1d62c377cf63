"""(c) `draslice preflight` against the real scheduler, for every scenario x template pair.

For each pair, on a cluster holding only that scenario's ResourceSlices (and its fake Nodes):
(and, where the scenario says so, pods of other templates already holding devices),
round 0 asks preflight live whether the template can be allocated now, then creates a pod that
claims from the template; the resourceclaim controller makes the claim and kube-scheduler
allocates it and binds the pod, or marks the pod unschedulable. The pod is kept, so its devices
are taken, and the next round asks again, until the scheduler finds nothing more (or
``MAX_ROUNDS``). Preflight's decision (``ready`` or not) must equal the scheduler's outcome in
every round: before any pod exists, with claims allocated, and when every device is taken.

A pair agrees when every round agrees; the count goes into `make test-cluster`'s closing line
``preflight vs scheduler: N/N agree``. A disagreement fails the test with each round's
preflight answer (decision, reason, per request matching/free) and the scheduler's (node and
devices, or its message).
"""

from __future__ import annotations

import pytest

from draslice.tests.realcluster import summary
from draslice.tests.realcluster.conftest import publish
from draslice.tests.realcluster.pods import schedule
from draslice.tests.realcluster.scenarios import HOLDERS, NAMESPACE, scenarios, templates

MAX_ROUNDS = 20
SCENARIOS = scenarios()
TEMPLATES = templates()


@pytest.fixture(scope="module", params=SCENARIOS, ids=str)
def scenario(request, cluster):
    cluster.reset()
    for template in TEMPLATES:
        cluster.admin.apply(template)
    publish(cluster, list(request.param.slices))
    if request.param.holders:
        cluster.admin.apply({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": HOLDERS}})
        cluster.admin.wait(f"the {HOLDERS}/default service account",
                           lambda: cluster.admin.get("ServiceAccount", "default", HOLDERS))
    for i, template in enumerate(request.param.holders):
        cluster.admin.apply(template)
        held = schedule(cluster.admin, f"holder-{i}", template["metadata"]["name"],
                        namespace=HOLDERS)
        assert held.bound, f"{request.param}: the holder pod was not scheduled: {held.detail}"
    yield request.param
    cluster.reset()


def _summary(report: dict | None, code: int, output: str) -> str:
    if report is None:
        return f"exit {code}: {output.strip()[:300]}"
    reqs = "; ".join(f"{r['name']}: {r.get('matching')} match, {r.get('free')} free"
                     + (f", errors {r['errors']}" if r.get("errors") else "")
                     for r in report.get("requests") or [])
    return f"{report.get('decision')} (exit {code}): {report.get('reason')} [{reqs}]"


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t["metadata"]["name"])
def test_preflight_predicts_the_scheduler(cluster, scenario, template, preflight):
    name = template["metadata"]["name"]
    pair = f"{scenario} x {name}"
    rounds: list[str] = []
    disagree = False
    try:
        for i in range(MAX_ROUNDS):
            code, report, output = preflight("--template", name, "-n", NAMESPACE)
            predicted = report is not None and report.get("decision") == "ready"
            outcome = schedule(cluster.admin, f"probe-{i}", name)
            agree = predicted == outcome.bound
            disagree |= not agree
            rounds.append(f"  round {i} ({i} pod(s) already holding devices) "
                          f"{'agree' if agree else 'DISAGREE'}:\n"
                          f"    preflight: {_summary(report, code, output)}\n"
                          f"    scheduler: {outcome.detail}")
            if not outcome.bound:
                break
        summary.record_pair(pair, not disagree)
    except BaseException:
        summary.record_pair(pair, False)
        raise
    finally:
        cluster.admin.delete_all("Pod", NAMESPACE)
        cluster.admin.delete_all("ResourceClaim", NAMESPACE)
        cluster.admin.wait("the pair's claims gone",
                           lambda: not cluster.admin.list("ResourceClaim", NAMESPACE))
    print(f"{pair}:\n" + "\n".join(rounds))  # shown with -rP, and on failure
    assert not disagree, f"preflight and the scheduler disagree on {pair}:\n" + "\n".join(rounds)
