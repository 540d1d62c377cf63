"""CEL selectors evaluated on every real ResourceSlice fixture by the upstream DRA CEL (through
the allocator program), with the expected matches.

Each case names the devices (``node/device``) the expression must select; the table covers every
file in tests/fixtures/resourceslices (a test fails if a new fixture has no cases). The older API
versions (v1beta1, v1alpha3) go through the same conversion preflight uses.
"""

from __future__ import annotations

import pytest

from draslice.tests.cluster.conftest import (
    ALL_FIXTURES,
    analyze_objects,
    exactly,
    load_fixture_objects,
    selected,
    template_with,
)

GPU_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
MIG_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
H100_NODES = ("gpu-node-1", "gpu-node-2")
H100_GPUS = {f"{n}/gpu-{i}" for n in H100_NODES for i in range(8)}
A100 = "k8s-dra-driver-cluster-worker/gpu-0-mig-19-6-1"
REF = "reference-node"

CASES = {
    "h100-80gb-x8-two-nodes.k8s-1.35.list.yaml": [
        (GPU_CLASS, H100_GPUS),
        (MIG_CLASS, set()),
        ("device.driver == 'compute-domain.nvidia.com'",
         {f"{n}/{d}" for n in H100_NODES for d in ("daemon-0", "channel-0")}),
        ('device.driver == "gpu.nvidia.com" && '
         'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) < 0', H100_GPUS),
        ('device.driver == "gpu.nvidia.com" && '
         'device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("79Gi"))', H100_GPUS),
        ('device.driver == "gpu.nvidia.com" && '
         'device.attributes["resource.kubernetes.io"].pciBusID == "0000:53:00.0"',
         {f"{n}/gpu-0" for n in H100_NODES}),
        ('device.driver == "gpu.nvidia.com" && '
         'device.attributes["gpu.nvidia.com"].uuid == "GPU-82e45d1b-1618-559f-144c-eab51545030b"',
         {"gpu-node-1/gpu-4"}),
        ('device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"]'
         '.driverVersion.isGreaterThan(semver("580.95.0"))', H100_GPUS),
        ('device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"]'
         '.cudaComputeCapability.compareTo(semver("9.0.0")) >= 0', H100_GPUS),
    ],
    "h200-one-device.gke-1.36.yaml": [
        (GPU_CLASS, {"<node-name>/gpu-0"}),
        ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("140Gi"))',
         {"<node-name>/gpu-0"}),
        ('device.capacity["gpu.nvidia.com"].memory.asInteger() == 143771 * 1024 * 1024',
         {"<node-name>/gpu-0"}),
        ('device.attributes["gpu.nvidia.com"].addressingMode == "None"', {"<node-name>/gpu-0"}),
        ('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100")', set()),
    ],
    "p100-16gb.v1beta1.yaml": [
        (GPU_CLASS, {"192.168.140.59/gpu-0"}),
        ('device.capacity["gpu.nvidia.com"].memory == quantity("16Gi")', {"192.168.140.59/gpu-0"}),
        ('device.attributes["gpu.nvidia.com"].pcieBusID == "0000:00:0b.0"',
         {"192.168.140.59/gpu-0"}),
        ('device.attributes["gpu.nvidia.com"].cudaComputeCapability.isLessThan(semver("7.0.0"))',
         {"192.168.140.59/gpu-0"}),
        ('has(device.attributes["resource.kubernetes.io"].pciBusID)', set()),
        ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"',
         {"192.168.140.59/gpu-0"}),
    ],
    "a100-80gb-mig-1g10gb.v1alpha3.list.yaml": [
        (MIG_CLASS, {A100}),
        (GPU_CLASS, set()),
        ('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"', {A100}),
        ('device.attributes["gpu.nvidia.com"].profile == "1g.5gb"', set()),
        ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("10Gi")) >= 0', set()),
        ('device.capacity["gpu.nvidia.com"].multiprocessors == quantity("14")', {A100}),
        ('device.capacity["gpu.nvidia.com"].memorySlice6.asInteger() == 1', {A100}),
        ('device.attributes["gpu.nvidia.com"].parentIndex == 0 && '
         'device.attributes["gpu.nvidia.com"].driverVersion == semver("560.35.3")', {A100}),
    ],
    "driver-reference-gpu-device.illustrative.yaml": [
        (GPU_CLASS, {f"{REF}/gpu-0"}),
        ('device.capacity["gpu.nvidia.com"].memory == quantity("40Gi")', {f"{REF}/gpu-0"}),
        ('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("580.126.3"))',
         {f"{REF}/gpu-0"}),
        ('device.attributes["gpu.nvidia.com"].addressingMode == "HMM"', {f"{REF}/gpu-0"}),
    ],
    "driver-reference-mig-device.illustrative.yaml": [
        (MIG_CLASS, {f"{REF}/gpu-0-mig-1g.5gb-0"}),
        ('device.attributes["gpu.nvidia.com"].profile == "1g.5gb" && '
         'device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("5Gi"))',
         {f"{REF}/gpu-0-mig-1g.5gb-0"}),
        ('device.attributes["gpu.nvidia.com"].parentUUID.startsWith("GPU-2fa81118")',
         {f"{REF}/gpu-0-mig-1g.5gb-0"}),
    ],
    "driver-reference-vfio-device.illustrative.yaml": [
        (GPU_CLASS, set()),
        (MIG_CLASS, set()),
        ("device.attributes['gpu.nvidia.com'].type == 'vfio' && "
         "device.attributes['gpu.nvidia.com'].iommuFDEnabled", {f"{REF}/gpu-0"}),
        ('device.capacity["gpu.nvidia.com"].addressableMemory.asApproximateFloat() == 40.0 * '
         "1024.0 * 1024.0 * 1024.0", {f"{REF}/gpu-0"}),
        ('device.attributes["gpu.nvidia.com"].numa == 0', {f"{REF}/gpu-0"}),
    ],
}


def _slices(fixture):
    return [o for o in load_fixture_objects(fixture) if o["kind"] == "ResourceSlice"]


def test_every_fixture_has_cases():
    assert sorted(CASES) == ALL_FIXTURES


@pytest.mark.parametrize(
    "fixture, expression, expected",
    [(f, e, m) for f, cases in CASES.items() for e, m in cases],
    ids=[f"{f.split('.')[0]}-{i}" for f, cases in CASES.items() for i in range(len(cases))],
)
def test_selector_on_fixture(fixture, expression, expected):
    assert selected(_slices(fixture), expression) == expected


def test_unguarded_attribute_fails_on_a_real_device():
    """A MIG-only attribute asked of a full GPU is an error the scheduler fails on, not false:
    the allocator's own message, naming the device and the selector."""
    slices = [s for s in _slices("h100-80gb-x8-two-nodes.k8s-1.35.list.yaml")
              if s["spec"]["driver"] == "gpu.nvidia.com"]
    expression = 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    report = analyze_objects(slices, template_with(exactly("gpu", "any", expression)))
    assert report.decision == "fail"
    assert "claim team-a/t: selector #0 on device gpu.nvidia.com/gpu-node-" in report.reason
    assert "CEL runtime error: no such key: profile" in report.reason
