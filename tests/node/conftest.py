"""Fixtures for the tests on a real node (`make test-node`, marker ``node``; docs/cluster-tests.md).

- ``node_cluster`` (session): the control plane of tests/realcluster (with the Node authorizer
  and the controllers a kubelet's pods need) and one node that runs containers
  (:mod:`tests.node.runtime`) with Kubernetes' DRA test driver publishing MIG-shaped devices
  (:mod:`tests.node.devices`); the NVIDIA DeviceClasses, draslice's manifests (claim templates,
  RBAC, the MutatingAdmissionPolicy) and the namespace ``kubeflow`` (opted in to the policy,
  Pod Security ``restricted`` enforced) installed; a PersistentVolumeClaim ``data`` bound to a
  hostPath PersistentVolume on the node, for the artifacts the pipeline's tasks pass on.
- ``preflight``: ``draslice preflight --json`` against it.

Every test collected here is marked ``node``: `make test` and `make test-cluster` deselect them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from draslice.tests.markers import mark_folder
from draslice.tests.node import devices, summary
from draslice.tests.node.runtime import Node, build_node_binaries
from draslice.tests.realcluster.controlplane import CONTROLLERS, ControlPlane, build_binaries
from draslice.tests.realcluster.kube import Kube

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NAMESPACE = "kubeflow"
DATA_CLAIM = "data"
# What a kubelet's pods need of the controller-manager beyond the control-plane tests' set: the
# kube-root-ca.crt ConfigMap every namespace gets, PersistentVolumeClaims bound, Jobs run, and
# the claims made for a pod deleted with it (they name the pod as owner: the garbage collector).
NODE_CONTROLLERS = CONTROLLERS + ("root-ca-certificate-publisher-controller",
                                  "persistentvolume-binder-controller", "job-controller",
                                  "garbage-collector-controller")
APPLIED_MANIFESTS = ("10-claim-templates.yaml", "20-rbac.yaml",
                     "30-admission-policy.map-v1.yaml")
IMAGE_SCRIPTS = (REPO / "scripts" / "node" / "pause.sh", REPO / "scripts" / "node" / "image.sh")


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marker
def pytest_collection_modifyitems(config, items):
    mark_folder(items, HERE, pytest.mark.node)


def pytest_sessionfinish(session, exitstatus):
    summary.write(passed=exitstatus == 0)


def image_archive(script: Path) -> tuple[Path, str]:
    """Build (or take from the cache) an image: its archive and its reference."""
    out = subprocess.run(["bash", str(script)], check=False, text=True, stdout=subprocess.PIPE)
    if out.returncode != 0:
        raise RuntimeError(f"{script} failed (exit {out.returncode}); its errors are above")
    lines = out.stdout.strip().splitlines()
    return Path(lines[-2]), lines[-1]


@dataclass
class NodeCluster:
    cp: ControlPlane
    node: Node
    admin: Kube
    trainer_image: str
    data_host: Path  # the PersistentVolume's folder on the node
    created: list[tuple[str, str, str]] = field(default_factory=list)

    def kubectl_apply(self, path: Path) -> str:
        out = self.cp.kubectl("apply", "--server-side", "--field-manager=draslice-tests",
                              "-f", str(path))
        assert out.returncode == 0, f"kubectl apply -f {path}: {out.stderr}"
        return out.stdout


def _namespace(admin: Kube, name: str, labels: dict) -> None:
    admin.apply({"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": name, "labels": labels}})
    admin.wait(f"the {name}/default service account",
               lambda: admin.get("ServiceAccount", "default", name))


def _volume(admin: Kube, host: Path) -> None:
    """A hostPath PersistentVolume on the node and the claim the pipeline's pods mount: what an
    admin of a one-node cluster without a provisioner would give a namespace."""
    host.mkdir(parents=True)
    os.chown(host, 1000, 1000)
    admin.apply({"apiVersion": "v1", "kind": "PersistentVolume",
                 "metadata": {"name": "draslice-node-data"},
                 "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
                          "persistentVolumeReclaimPolicy": "Retain",
                          "storageClassName": "manual",
                          "hostPath": {"path": str(host), "type": "Directory"}}})
    admin.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": DATA_CLAIM, "namespace": NAMESPACE},
                 "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                          "volumeName": "draslice-node-data",
                          "resources": {"requests": {"storage": "2Gi"}}}})
    admin.wait("the data claim bound", lambda: admin.get(
        "PersistentVolumeClaim", DATA_CLAIM, NAMESPACE).get("status", {}).get("phase")
        == "Bound", timeout=60)


def _wait_policy_active(admin: Kube) -> None:
    """The API server applies a new MutatingAdmissionPolicy a moment after it is stored: wait
    until it mutates a labelled pod (a dry run) before the tests create theirs."""
    from draslice.cluster.names import CLAIM_LABEL

    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"generateName": "policy-probe-", "namespace": NAMESPACE,
                          "labels": {CLAIM_LABEL: "mig-1g-6gb"}},
             "spec": {"securityContext": {"runAsNonRoot": True,
                                          "seccompProfile": {"type": "RuntimeDefault"}},
                      "containers": [{"name": "main", "image": "probe", "securityContext": {
                          "allowPrivilegeEscalation": False,
                          "capabilities": {"drop": ["ALL"]}}}]}}
    admin.wait("the admission policy to mutate a labelled pod",
               lambda: admin.create(probe, dry_run=True)["spec"].get("resourceClaims"),
               timeout=60)


@pytest.fixture(scope="session")
def node_cluster():
    from draslice.cluster.snapshot import NVIDIA_DEVICE_CLASSES

    cp_bins, node_bins = build_binaries(), build_node_binaries()
    images = [image_archive(script) for script in IMAGE_SCRIPTS]
    work = Path(tempfile.mkdtemp(prefix="draslice-node-"))
    cp = node = None
    try:
        cp = ControlPlane.start(cp_bins, work / "control-plane", controllers=NODE_CONTROLLERS,
                                authorization="Node,RBAC")
        node = Node.start(cp, node_bins, work / "node", devices.write(work / "devices.json"),
                          [archive for archive, _ in images])
        summary.record("kubelet", f"kubelet {node.kubelet_version}")
        summary.record("containerd", f"containerd {node.containerd_version}")
        summary.record("driver", node.published)
        admin = cp.admin
        for device_class in NVIDIA_DEVICE_CLASSES:
            admin.apply(device_class)
        _namespace(admin, NAMESPACE, {"draslice.dev/claim-injection": "enabled",
                                      "pod-security.kubernetes.io/enforce": "restricted",
                                      "pod-security.kubernetes.io/enforce-version": "latest"})
        state = NodeCluster(cp, node, admin, images[-1][1], work / "data")
        for name in APPLIED_MANIFESTS:
            state.kubectl_apply(REPO / "manifests" / name)
        _wait_policy_active(admin)
        _volume(admin, state.data_host)
        yield state
    finally:
        if node is not None:
            node.stop()
        if cp is not None:
            cp.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def preflight(node_cluster):
    """``draslice preflight ARGS --json`` as the admin: (exit code, report or None, output)."""
    from draslice.cli import main

    def run(*args: str):
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        res = CliRunner(env=env).invoke(main, [
            "preflight", "--kubeconfig", str(node_cluster.cp.admin_kubeconfig), *args, "--json"])
        try:
            report = json.loads(res.stdout)
        except ValueError:
            report = None
        return res.exit_code, report, res.output

    return run


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]
