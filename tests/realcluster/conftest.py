"""Fixtures for the tests against a real control plane (`make test-cluster`, marker ``cluster``).

Reusable by any test that needs Kubernetes itself (docs/cluster-tests.md):

- ``control_plane`` (session): etcd, kube-apiserver, kube-controller-manager and kube-scheduler
  on loopback (:mod:`tests.realcluster.controlplane`), stopped and removed at the end;
- ``cluster`` (session): that control plane with the NVIDIA DeviceClasses, the ``kubeflow``
  namespace and a :class:`~tests.realcluster.nodes.FakeNodes` registry; use
  :func:`publish` to put ResourceSlices (and their Nodes) in, and ``cluster.reset()`` to take
  every slice, claim, pod and fake node out again;
- ``preflight``: runs ``draslice preflight --json`` against the control plane.

Every test collected here is marked ``cluster``: plain ``make test`` deselects them.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from draslice.tests.markers import mark_folder
from draslice.tests.realcluster import summary
from draslice.tests.realcluster.controlplane import ControlPlane, build_binaries
from draslice.tests.realcluster.kube import Kube
from draslice.tests.realcluster.nodes import FakeNodes

NAMESPACE = "kubeflow"
HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marker
def pytest_collection_modifyitems(config, items):
    mark_folder(items, HERE, pytest.mark.cluster)


def pytest_sessionfinish(session, exitstatus):
    summary.write()


@pytest.fixture(scope="session")
def control_plane():
    bin_dir = build_binaries()
    work = Path(tempfile.mkdtemp(prefix="draslice-cp-"))
    cp = ControlPlane.start(bin_dir, work)
    summary.record_version(cp.version)
    try:
        yield cp
    finally:
        cp.stop()


@dataclass
class Cluster:
    """The control plane set up as a GPU cluster with the NVIDIA DRA driver installed."""

    cp: ControlPlane
    admin: Kube
    nodes: FakeNodes

    def reset(self) -> None:
        """Remove every pod, claim, slice and fake node, so the next test starts empty."""
        for ns in (n["metadata"]["name"] for n in self.admin.list("Namespace")):
            self.admin.delete_all("Pod", ns)
        self.admin.delete_all("ResourceClaim")
        self.admin.delete_all("ResourceSlice")
        self.admin.wait("all ResourceClaims gone (their finalizers released)",
                        lambda: not self.admin.list("ResourceClaim"), timeout=60)
        self.nodes.remove_all()


def _ensure_namespace(kube: Kube, name: str, labels: dict | None = None) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}}})


@pytest.fixture(scope="session")
def cluster(control_plane):
    from draslice.cluster.snapshot import NVIDIA_DEVICE_CLASSES

    admin = control_plane.admin
    for device_class in NVIDIA_DEVICE_CLASSES:
        admin.apply(device_class)
    _ensure_namespace(admin, NAMESPACE)
    admin.wait(f"the {NAMESPACE}/default service account",
               lambda: admin.get("ServiceAccount", "default", NAMESPACE))
    nodes = FakeNodes(Kube(control_plane.server, str(control_plane.ca),
                           cert=tuple(map(str, control_plane.admin_cert))))
    state = Cluster(control_plane, admin, nodes)
    yield state
    nodes.stop()
    assert not nodes.errors, f"fake node heartbeats failed: {nodes.errors[:5]}"


def publish(cluster: Cluster, slices: list[dict]) -> list[dict]:
    """Register a fake Node for every node a slice names, then create the slices owned by their
    Node (as the driver's kubelet plugin does), each in the API version it was written in."""
    created = []
    for obj in slices:
        obj = copy.deepcopy(obj)
        node = obj["spec"].get("nodeName")
        meta = {"name": obj["metadata"]["name"]}
        if node:
            owner = cluster.nodes.register(node)
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node,
                                        "uid": owner["metadata"]["uid"], "controller": True}]
        obj["metadata"] = meta
        created.append(cluster.admin.create(obj))
    return created


@pytest.fixture
def preflight(control_plane):
    """``draslice preflight ARGS --json`` as the admin (or ``kubeconfig=``): (exit code,
    the JSON report or None, the output)."""
    def run(*args: str, kubeconfig: Path | None = None):
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        res = CliRunner(env=env).invoke(
            _cli(), ["preflight", "--kubeconfig", str(kubeconfig or control_plane.admin_kubeconfig),
                     *args, "--json"])
        try:
            report = json.loads(res.stdout)
        except ValueError:
            report = None
        return res.exit_code, report, res.output

    return run


def _cli():
    from draslice.cli import main

    return main
