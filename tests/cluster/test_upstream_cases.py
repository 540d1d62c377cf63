"""Cases where the former hand-written allocator disagreed with Kubernetes (issue 12), each
answered now by the upstream allocator of the release named. The expected decision is what
``k8s.io/dynamic-resource-allocation`` answers; these tests check that preflight builds its input
so the allocator sees the cluster as the scheduler would, and reports its answer faithfully."""

from __future__ import annotations

import pytest

from draslice.tests.cluster.conftest import (
    analyze_objects,
    claim,
    exactly,
    gpu,
    mig,
    rslice,
    template_with,
)

PRODUCT = 'device.attributes["gpu.nvidia.com"].productName'


def _decide(objects, *requests, version=None, constraints=None):
    template = template_with(*requests)
    if constraints:
        template["spec"]["spec"]["devices"]["constraints"] = constraints
    return analyze_objects(objects, template, version)


def test_backtracking_finds_the_assignment_greedy_misses():
    """Request a (H100 or A100) takes the A100 so that request b (A100 only) gets one: a greedy
    pass that gives a the first device it sees (the A100) fails b."""
    node = rslice("node-a", [gpu("gpu-0", product="NVIDIA A100"), gpu("gpu-1")])
    report = _decide([node], exactly("a", "gpu.nvidia.com"),
                     exactly("b", "gpu.nvidia.com", f'{PRODUCT} == "NVIDIA A100"'))
    assert report.decision == "ready", report.reason
    assert {(d["request"], d["device"]) for d in report.allocation} == {("a", "gpu-1"),
                                                                          ("b", "gpu-0")}


def test_first_available_is_chosen_with_the_other_requests():
    """The first subrequest (a full GPU) would starve request b: the allocator picks the second
    (a MIG device) for a, as the scheduler does, instead of failing."""
    node = rslice("node-a", [gpu("gpu-0"), mig("gpu-1-mig-0")])
    either = {"name": "a", "firstAvailable": [
        {"name": "full", "deviceClassName": "gpu.nvidia.com"},
        {"name": "slice", "deviceClassName": "mig.nvidia.com"}]}
    report = _decide([node], either, exactly("b", "gpu.nvidia.com"))
    assert report.decision == "ready", report.reason
    assert {d["request"] for d in report.allocation} == {"a/slice", "b"}
    assert [r.name for r in report.requests] == ["a/slice", "b"]


def test_admin_access_may_use_a_device_in_use():
    node = rslice("node-a", [gpu("gpu-0")])
    held = claim("job", {"pool": "node-a", "device": "gpu-0"})
    assert _decide([node, held], exactly("a", "gpu.nvidia.com")).decision == "fail"
    report = _decide([node, held], exactly("a", "gpu.nvidia.com", adminAccess=True))
    assert report.decision == "ready", report.reason
    assert report.allocation[0]["adminAccess"] is True


def test_a_shareable_device_held_by_a_dedicated_allocation_is_taken():
    node = rslice("node-a", [gpu("gpu-0", allowMultipleAllocations=True)])
    held = claim("job", {"pool": "node-a", "device": "gpu-0"})
    report = _decide([node, held], exactly("a", "gpu.nvidia.com"), version="1.37")
    assert report.decision == "fail"
    assert report.requests[0].counts() == {"taken": 1}


def test_selectors_are_not_evaluated_on_devices_in_use():
    """The full GPU in use has no `profile`: the allocator never evaluates the selector on it, so
    there is no CEL error, and the free MIG device serves the claim."""
    node = rslice("node-a", [gpu("gpu-0"), mig("gpu-0-mig-0")])
    held = claim("job", {"pool": "node-a", "device": "gpu-0"})
    profile = 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    report = _decide([node, held], exactly("a", "any", profile))
    assert report.decision == "ready", report.reason
    assert report.requests[0].errors == []


def test_thirty_two_devices_per_claim_at_most():
    node = rslice("node-a", [gpu(f"gpu-{i}") for i in range(40)])
    report = _decide([node], exactly("a", "gpu.nvidia.com", count=33))
    assert report.decision == "fail"
    assert "exceeds the claim limit of 32" in report.reason
    assert _decide([node], exactly("a", "gpu.nvidia.com", count=32)).decision == "ready"


def test_match_attribute_constraint():
    node = rslice("node-a", [gpu("gpu-0", product="NVIDIA A100"), gpu("gpu-1"), gpu("gpu-2")])
    same = [{"requests": ["a", "b"], "matchAttribute": "gpu.nvidia.com/productName"}]
    report = _decide([node], exactly("a", "gpu.nvidia.com"), exactly("b", "gpu.nvidia.com"),
                     constraints=same)
    assert report.decision == "ready", report.reason
    assert {d["device"] for d in report.allocation} == {"gpu-1", "gpu-2"}
    two = rslice("node-a", [gpu("gpu-0", product="NVIDIA A100"), gpu("gpu-1")])
    assert _decide([two], exactly("a", "gpu.nvidia.com"), exactly("b", "gpu.nvidia.com"),
                   constraints=same).decision == "fail"


@pytest.mark.parametrize("version", ["1.36", "1.37"])
def test_distinct_attribute_constraint(version):
    """distinctAttribute (with consumable capacity, on by default from 1.36): the two devices
    must differ in productName."""
    node = rslice("node-a", [gpu("gpu-0"), gpu("gpu-1")])
    distinct = [{"requests": ["a"], "distinctAttribute": "gpu.nvidia.com/productName"}]
    report = _decide([node], exactly("a", "gpu.nvidia.com", count=2), constraints=distinct,
                     version=version)
    assert report.decision == "fail"
    mixed = rslice("node-a", [gpu("gpu-0", product="NVIDIA A100"), gpu("gpu-1")])
    assert _decide([mixed], exactly("a", "gpu.nvidia.com", count=2), constraints=distinct,
                   version=version).decision == "ready"


def test_a_pool_with_duplicate_devices_is_invalid():
    node = rslice("node-a", [gpu("gpu-0"), gpu("gpu-0")])
    report = _decide([node], exactly("a", "gpu.nvidia.com"))
    assert report.decision == "fail"
    assert any("invalid resource pools" in u for u in report.unschedulable), report.unschedulable


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_every_release_allocates_a_plain_request(version):
    report = _decide([rslice("node-a", [mig("gpu-0-mig-0")])],
                     exactly("a", "mig.nvidia.com"), version=version)
    assert report.decision == "ready" and report.kubernetes_version == version
    assert report.allocator.startswith("k8s.io/dynamic-resource-allocation v0." + version[2:])
