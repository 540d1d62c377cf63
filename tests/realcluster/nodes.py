"""Fake Nodes kept Ready the way a kubelet keeps its Node Ready, without a kubelet (as kwok does).

A registered node gets a Lease in ``kube-node-lease`` and a ``Ready`` condition; a background
thread renews both every few seconds. The node-lifecycle controller (which the control plane
runs) taints a node ``not-ready``/``unreachable`` when its heartbeats stop, so the scheduler
then avoids it, exactly as on a cluster whose kubelet died. No container ever runs: pods are
bound to these nodes and stay Pending, which is all the scheduling tests need.
"""

from __future__ import annotations

import datetime
import threading

from draslice.tests.realcluster.kube import Kube, KubeError

HEARTBEAT_S = 5.0
LEASE_S = 40
CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "1000", "ephemeral-storage": "1Ti"}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ready_status() -> dict:
    now = _now().split(".")[0] + "Z"
    return {"status": {
        "capacity": CAPACITY, "allocatable": CAPACITY,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "fake node heartbeated by the draslice test harness",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "nodeInfo": {"kubeletVersion": "v0.0.0-fake", "operatingSystem": "linux",
                     "architecture": "amd64", "containerRuntimeVersion": "fake://0",
                     "kernelVersion": "", "osImage": "", "kubeProxyVersion": "",
                     "machineID": "", "systemUUID": "", "bootID": ""},
    }}


class FakeNodes:
    """Registers nodes and heartbeats them until :meth:`stop`."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self.names: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-node-heartbeats",
                                        daemon=True)
        self.errors: list[str] = []
        self._thread.start()

    def register(self, name: str, labels: dict | None = None) -> dict:
        """Create (or keep) the Node, mark it Ready, start its heartbeats; returns the Node."""
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                      "kubernetes.io/os": "linux",
                                                      **(labels or {})}}}
        try:
            created = self.kube.create(node)
        except KubeError as exc:
            if exc.status != 409:
                raise
            created = self.kube.get("Node", name)
        self._beat(name)
        with self._lock:
            self.names.add(name)
        return created

    def remove(self, name: str) -> None:
        with self._lock:
            self.names.discard(name)
        self.kube.delete("Node", name)
        self.kube.delete("Lease", name, "kube-node-lease")

    def remove_all(self) -> None:
        for name in list(self.names):
            self.remove(name)

    def _beat(self, name: str) -> None:
        self.kube.patch_status("Node", name, _ready_status())
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": name, "namespace": "kube-node-lease"},
                 "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_S,
                          "renewTime": _now()}}
        self.kube.apply(lease, manager="fake-kubelet")

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                names = sorted(self.names)
            for name in names:
                try:
                    self._beat(name)
                except Exception as exc:  # noqa: BLE001 (a missed beat is reported, not fatal)
                    with self._lock:
                        if name in self.names:  # not a node removed during its beat
                            self.errors.append(f"{name}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=HEARTBEAT_S * 2)
