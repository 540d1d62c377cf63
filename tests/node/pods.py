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

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]


def log_of(node, pod: dict, container: str = "main") -> str:
    """The container's output, from the kubelet's log files (CRI format: time, stream, tag,
    text). The node advertises no address (a kubelet refuses loopback as its node IP, and nothing
    else may be dialled here), so the API server cannot proxy `kubectl logs` to it."""
    meta = pod["metadata"]
    folder = node.pod_logs / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container
    lines = []
    for path in sorted(folder.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)
            lines.append(parts[3] if len(parts) == 4 else line)
    return "\n".join(lines)


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
    kube, meta = node.cp.admin, pod["metadata"]
    kube.create(pod)
    ended = wait_phase(kube, meta["name"], meta["namespace"], DONE, timeout)
    container = ended["spec"]["containers"][0]["name"]
    return Ended(ended, ended["status"]["phase"], log_of(node, ended, container))


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
