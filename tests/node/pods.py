"""Pods on the real node: run one to its end, read its log through the API server (which asks the
kubelet, as `kubectl logs` does), and what containerd really gave its container."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from draslice.tests.realcluster.kube import Kube, KubeError
from draslice.tests.realcluster.pods import claim_of

DONE = ("Succeeded", "Failed")


@dataclass
class Ended:
    pod: dict
    phase: str
    log: str
    devices: list[str]  # driver/pool/device of its claim, read while it ran

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]


def log_of(node, pod: dict, container: str = "main") -> str:
    """The container's output as `kubectl logs` reads it: the API server asks the kubelet."""
    meta = pod["metadata"]
    return node.cp.admin.request(
        "GET", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/log",
        params={"container": container}, raw=True)


def wait_phase(kube: Kube, name: str, namespace: str, phases: tuple[str, ...],
               timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    pod = kube.get("Pod", name, namespace)
    while time.monotonic() < deadline:
        pod = kube.get("Pod", name, namespace)
        if pod.get("status", {}).get("phase") in phases:
            return pod
        time.sleep(0.5)
    raise TimeoutError(f"pod {namespace}/{name} not {'/'.join(phases)} within {timeout:.0f} s: "
                       f"{json.dumps(pod.get('status', {}))[:1500]}")


def run_to_end(node, pod: dict, timeout: float = 300.0) -> Ended:
    """Create the pod and wait for its end. The devices of its claim are read while it runs:
    once a pod is done, the resourceclaim controller deletes the claim made for it."""
    kube, meta = node.cp.admin, pod["metadata"]
    kube.create(pod)
    deadline, devices = time.monotonic() + timeout, []
    while True:
        current = kube.get("Pod", meta["name"], meta["namespace"])
        if not devices and current.get("status", {}).get("resourceClaimStatuses"):
            devices = allocated(kube, current)
        if current.get("status", {}).get("phase") in DONE:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"pod {meta['namespace']}/{meta['name']} did not end within "
                               f"{timeout:.0f} s: {json.dumps(current.get('status', {}))[:1500]}")
        time.sleep(0.5)
    container = current["spec"]["containers"][0]["name"]
    return Ended(current, current["status"]["phase"], log_of(node, current, container), devices)


def allocated(kube: Kube, pod: dict) -> list[str]:
    """``driver/pool/device`` of each device the pod's claim was allocated."""
    claim = claim_of(kube, pod)
    results = (((claim or {}).get("status") or {}).get("allocation") or {}).get(
        "devices", {}).get("results") or []
    return [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]


def container_spec(node, pod: dict, container: str = "main") -> dict:
    """The OCI spec containerd gave the pod's container (env after CDI, user, ...)."""
    status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)
    cid = status["containerID"].split("://", 1)[1]
    out = node.ctr("containers", "info", cid)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["Spec"]


def release(kube: Kube, names: list[str], namespace: str = "kubeflow",
            timeout: float = 120.0) -> None:
    """Delete the pods and wait until the claims made for them are gone (their devices free)."""
    claims = set()
    for name in names:
        try:
            pod = kube.get("Pod", name, namespace)
        except KubeError:
            continue
        claims |= {s["resourceClaimName"] for s in pod.get("status", {}).get(
            "resourceClaimStatuses") or [] if s.get("resourceClaimName")}
        kube.delete("Pod", name, namespace)
    kube.wait("the pods' claims gone", lambda: not [
        c for c in kube.list("ResourceClaim", namespace) if c["metadata"]["name"] in claims],
        timeout=timeout)
