"""Preflight and the scheduler on a real node when slices are held, missing or pulled away:

- N running pods hold the node's N ``1g.6gb`` devices: preflight says no slice is free, and the
  N+1th pod stays Pending with the scheduler's DRA reason, the one preflight gives;
- a claim whose device class has no device on the node: Pending, with the reason preflight
  predicted;
- a claim deleted under a running pod: the API server keeps it (deletion waits on its
  ``reservedFor`` and finalizer), the kubelet keeps the pod running, and preflight answers
  promptly while it is so; deleting the pod lets the claim go and the driver unprepares it.
"""

from __future__ import annotations

import time

import pytest

from draslice.tests.node import devices
from draslice.tests.node.conftest import NAMESPACE
from draslice.tests.node.pods import allocated, wait_phase
from draslice.tests.realcluster.pods import claim_of

TEMPLATE = "mig-1g-6gb"
HOLD = ["python", "-c", "import time; time.sleep(3600)"]
RESTRICTED = {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def holder(name: str, template: str, image: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": image, "command": HOLD,
                                     "imagePullPolicy": "Never", "securityContext": RESTRICTED,
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu",
                                         "resourceClaimTemplateName": template}]}}


def _scheduled_condition(pod: dict) -> dict | None:
    return next((c for c in pod.get("status", {}).get("conditions") or []
                 if c["type"] == "PodScheduled"), None)


def wait_unschedulable(admin, name: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cond = _scheduled_condition(admin.get("Pod", name, NAMESPACE))
        if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
            return cond.get("message", "")
        time.sleep(0.3)
    raise TimeoutError(f"pod {name} was not marked unschedulable within {timeout:.0f} s")


@pytest.fixture
def clean(node_cluster):
    yield node_cluster
    admin = node_cluster.admin
    for pod in admin.list("Pod", NAMESPACE):
        if pod["metadata"]["name"].startswith(("hold-", "extra", "nowhere", "pulled")):
            admin.delete("Pod", pod["metadata"]["name"], NAMESPACE)
    admin.wait("the held claims released", lambda: not [
        c for c in admin.list("ResourceClaim", NAMESPACE)
        if c["metadata"]["name"].startswith(("hold-", "extra", "nowhere", "pulled"))],
        timeout=120)


def test_every_slice_held_then_preflight_and_the_scheduler_both_say_none_is_free(
        clean, preflight):
    admin, image = clean.admin, clean.trainer_image
    n = devices.count("1g.6gb")
    held = set()
    for i in range(n):
        admin.create(holder(f"hold-{i}", TEMPLATE, image))
        pod = wait_phase(admin, f"hold-{i}", NAMESPACE, ("Running",), timeout=180)
        held.update(allocated(admin, pod))
    assert len(held) == n  # N pods, N different devices
    code, report, output = preflight("--template", TEMPLATE, "-n", NAMESPACE)
    assert report and report["decision"] == "fail", output
    assert [(r["matching"], r["free"]) for r in report["requests"]] == [(n, 0)], output
    admin.create(holder("extra", TEMPLATE, image))
    message = wait_unschedulable(admin, "extra")
    assert "cannot allocate all claims" in message, message
    assert any("cannot allocate all claims" in u for u in report["unschedulable"]), report


def test_a_class_without_devices_stays_pending_as_preflight_predicted(clean, preflight):
    admin = clean.admin
    # the whole-GPU template: its class gpu.nvidia.com selects type == 'gpu'; the node has
    # only MIG devices
    template = "shared-gpu-timeslice"
    code, report, output = preflight("--template", template, "-n", NAMESPACE)
    assert report and report["decision"] == "fail", output
    assert [r["matching"] for r in report["requests"]] == [0], output
    admin.create(holder("nowhere", template, clean.trainer_image))
    message = wait_unschedulable(admin, "nowhere")
    assert "cannot allocate all claims" in message, message
    assert any("cannot allocate all claims" in u for u in report["unschedulable"]), report


def test_a_claim_deleted_under_a_running_pod(clean, preflight):
    admin = clean.admin
    admin.create(holder("pulled", TEMPLATE, clean.trainer_image))
    pod = wait_phase(admin, "pulled", NAMESPACE, ("Running",), timeout=180)
    claim = claim_of(admin, pod)
    name = claim["metadata"]["name"]
    admin.delete("ResourceClaim", name, NAMESPACE)
    time.sleep(5)
    kept = admin.get("ResourceClaim", name, NAMESPACE)
    assert kept["metadata"].get("deletionTimestamp"), kept["metadata"]
    assert kept["status"]["reservedFor"][0]["name"] == "pulled"
    assert admin.get("Pod", "pulled", NAMESPACE)["status"]["phase"] == "Running"
    start = time.monotonic()
    code, report, output = preflight("--template", TEMPLATE, "-n", NAMESPACE)
    assert report is not None and time.monotonic() - start < 30, output
    admin.delete("Pod", "pulled", NAMESPACE)
    admin.wait("the deleted claim gone once its pod is", lambda: not [
        c for c in admin.list("ResourceClaim", NAMESPACE) if c["metadata"]["name"] == name],
        timeout=120)
    # the kubelet asks the driver to unprepare once the pod's containers are gone
    uid = claim["metadata"]["uid"]
    admin.wait("the driver removed the claim's CDI spec",
               lambda: not list((clean.node.work / "cdi").glob(f"*{uid}*")), timeout=60)
