"""Pods that claim from a ResourceClaimTemplate, and the scheduler's verdict on them.

No kubelet runs them: a pod is created, the resourceclaim controller makes its claim from the
template, and kube-scheduler either allocates the claim and binds the pod to a (fake) node or
marks it unschedulable. :func:`schedule` waits for that verdict. Reusable by any test on the
control plane (docs/cluster-tests.md), e.g. N pods of one sweep each getting a different device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from draslice.cluster.manifests.podclaim import with_claim
from draslice.tests.realcluster.kube import KubeError
from draslice.tests.realcluster.scenarios import NAMESPACE

SETTLE_S = 1.0  # an unschedulable verdict must hold this long once the claim exists


@dataclass
class Outcome:
    bound: bool
    detail: str


def claiming_pod(name: str, template: str, namespace: str = NAMESPACE) -> dict:
    spec = {"containers": [{"name": "main", "image": "registry.invalid/draslice/probe:0"}],
            "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": with_claim(spec, template)}


def claim_of(kube, pod: dict) -> dict | None:
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("resourceClaimName"):
            try:
                return kube.get("ResourceClaim", status["resourceClaimName"],
                                pod["metadata"]["namespace"])
            except KubeError:
                return None
    return None


def devices(claim: dict | None) -> str:
    results = (((claim or {}).get("status") or {}).get("allocation") or {}).get(
        "devices", {}).get("results") or []
    return ", ".join(f"{r['request']}={r['pool']}/{r['device']}" for r in results) or "none"


def schedule(kube, name: str, template: str, timeout: float = 60.0,
             namespace: str = NAMESPACE) -> Outcome:
    """Create a pod that claims from ``template`` and wait for the scheduler's verdict on it.

    Reusable by other tests (docs/cluster-tests.md): the pod has one container ``main`` that
    consumes the claim, no kubelet ever runs it, and it is bound or unschedulable."""
    kube.create(claiming_pod(name, template, namespace))
    deadline = time.monotonic() + timeout
    unschedulable_since = None
    while time.monotonic() < deadline:
        pod = kube.get("Pod", name, namespace)
        node = pod["spec"].get("nodeName")
        claim = claim_of(kube, pod)
        if node:
            return Outcome(True, f"bound to {node}, devices {devices(claim)}")
        cond = next((c for c in (pod.get("status") or {}).get("conditions") or []
                     if c["type"] == "PodScheduled"), None)
        if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable" \
                and claim is not None:
            unschedulable_since = unschedulable_since or time.monotonic()
            if time.monotonic() - unschedulable_since >= SETTLE_S:
                return Outcome(False, f"unschedulable: {cond.get('message', '')}")
        else:
            unschedulable_since = None
        time.sleep(0.05)
    raise TimeoutError(f"the scheduler gave no verdict on pod {name} within {timeout:.0f} s")
