"""Helpers for the cluster tests: the ResourceSlice fixtures as devices and snapshots, and small
builders for slices, claims and classes in the shapes the API server returns."""

from __future__ import annotations

import copy

import pytest
import yaml

from draslice.tests.conftest import FIXTURES, fixture_path

SLICES = FIXTURES / "resourceslices"
DRIVER = "gpu.nvidia.com"
# The devices-only excerpts (the driver's reference page) and the v1alpha3 excerpt, which lost
# spec.driver/pool/nodeName when its author cut it, are by SOURCES.md devices of gpu.nvidia.com;
# the tests put them into complete slices of these nodes.
EXCERPT_NODES = {
    "driver-reference-gpu-device.illustrative.yaml": "reference-node",
    "driver-reference-mig-device.illustrative.yaml": "reference-node",
    "driver-reference-vfio-device.illustrative.yaml": "reference-node",
    "a100-80gb-mig-1g10gb.v1alpha3.list.yaml": "k8s-dra-driver-cluster-worker",
}
ALL_FIXTURES = sorted(p.name for p in SLICES.glob("*.yaml"))


def rslice(node, devices, *, driver=DRIVER, pool=None, generation=1, count=1, name=None,
           api="resource.k8s.io/v1", shared_counters=None):
    spec = {"driver": driver, "nodeName": node,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
            "devices": devices}
    if shared_counters is not None:
        spec["sharedCounters"] = shared_counters
    return {"apiVersion": api, "kind": "ResourceSlice",
            "metadata": {"name": name or f"{node}-{driver}-g{generation}"}, "spec": spec}


def gpu(name, memory="81559Mi", product="NVIDIA H100 80GB HBM3", **extra):
    return {"name": name, "attributes": {"type": {"string": "gpu"},
                                         "productName": {"string": product},
                                         "driverVersion": {"version": "580.105.8"}},
            "capacity": {"memory": {"value": memory}}, **extra}


def mig(name, profile="1g.10gb", memory="9728Mi", product="NVIDIA A100 80GB PCIe", **extra):
    return {"name": name, "attributes": {"type": {"string": "mig"},
                                         "profile": {"string": profile},
                                         "productName": {"string": product}},
            "capacity": {"memory": {"value": memory}}, **extra}


def claim(name, *results, namespace="team-a"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu-slice", "driver": DRIVER, **r} for r in results]}}}}


def load_fixture_objects(name: str) -> list[dict]:
    """The fixture's objects; excerpts completed into ResourceSlices of gpu.nvidia.com."""
    text = fixture_path("resourceslices", name).read_text()
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    if name.startswith("driver-reference"):
        node = EXCERPT_NODES[name]
        return [rslice(node, docs[0], name=f"{node}-{name.split('-')[2]}")]
    objs: list[dict] = []
    for doc in docs:
        objs += doc.get("items", [doc])
    if name in EXCERPT_NODES:
        for obj in objs:
            obj["spec"].setdefault("driver", DRIVER)
            obj["spec"].setdefault("nodeName", EXCERPT_NODES[name])
            obj["spec"].setdefault("pool", {"name": EXCERPT_NODES[name], "generation": 1,
                                            "resourceSliceCount": 1})
    return objs


def write_snapshot(path, objects: list[dict]):
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                    "items": copy.deepcopy(objects)}))
    return path


@pytest.fixture
def snapshot_of():
    """Build a Snapshot from objects (as `kubectl get ... -o yaml` would list them)."""
    from draslice.cluster.snapshot import NVIDIA_DEVICE_CLASSES, Snapshot

    def make(*objects, classes=True):
        snap = Snapshot(source="test")
        for obj in (list(copy.deepcopy(NVIDIA_DEVICE_CLASSES)) if classes else []) + list(
            objects
        ):
            snap.add(copy.deepcopy(obj))
        return snap

    return make


# --- the allocator program (cluster/allocator) -----------------------------------------------

ANY_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
             "metadata": {"name": "any"}, "spec": {}}


@pytest.fixture(scope="session", autouse=True)
def allocator_binary():
    """Build (or find) the newest release's allocator once per session; without Go and without
    a packaged binary, every test here would fail the same way: fail once, saying why."""
    from draslice.cluster import allocator
    from draslice.errors import DrasliceError

    try:
        return allocator.binary(allocator.NEWEST)
    except DrasliceError as exc:
        pytest.fail(f"the DRA allocator program is needed by the cluster tests: {exc}",
                    pytrace=False)


def template_with(*requests, name="t") -> dict:
    """A ResourceClaimTemplate (v1) with the given requests."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


def exactly(name="gpu", cls="any", *selectors, count=1, mode="ExactCount", **extra) -> dict:
    body = {"deviceClassName": cls, "allocationMode": mode, **extra}
    if mode == "ExactCount":
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def analyze_objects(objects, template, version=None, classes=True):
    """The preflight report for ``template`` against ``objects`` (plus the NVIDIA classes and
    the selector-free class ``any``), decided by the allocator of ``version``."""
    from draslice.cluster.analysis import analyze
    from draslice.cluster.snapshot import NVIDIA_DEVICE_CLASSES, Snapshot

    snap = Snapshot(source="test")
    extra = [*copy.deepcopy(NVIDIA_DEVICE_CLASSES), ANY_CLASS] if classes else []
    for obj in extra + list(objects):
        snap.add(copy.deepcopy(obj))
    return analyze(snap, template, kubernetes_version=version)


def selected(objects, expression, version=None) -> set[str]:
    """``node/device`` of every device the upstream CEL selects with ``expression``; a CEL
    runtime error fails with the allocator's message."""
    report = analyze_objects(objects, template_with(exactly("gpu", "any", expression)), version)
    (req,) = report.requests
    if report.decision == "fail" and "CEL runtime error" in report.reason:
        raise AssertionError(report.reason)
    return {f"{m.device.node}/{m.device.name}" for m in req.matches}
