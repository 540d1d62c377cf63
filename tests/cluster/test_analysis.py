"""Preflight's input building and reporting around the upstream allocator: taken, adminAccess,
taints, generations, completeness, shared counters, one node per claim, no DRA, and the
diagnosis messages. Every decision here is the allocator program's (cluster/allocator); the
expectations are what Kubernetes' allocator answers for the release named."""

from __future__ import annotations

import copy

import pytest

from draslice.cluster.analysis import analyze, published_slices
from draslice.cluster.cel import CelCompileError
from draslice.cluster.report import (
    BLOCKED,
    FAIL,
    FREE,
    INCOMPLETE,
    READY,
    SKIP,
    TAINTED,
    TAKEN,
    PublishedSlice,
)
from draslice.cluster.templates import mig_claim_template, shared_gpu_claim_template
from draslice.tests.cluster.conftest import claim, gpu, mig, rslice

MIG_1G = mig_claim_template("1g.10gb")


def _two_migs(**extra):
    return rslice("node-a", [mig("gpu-0-mig-0", **extra), mig("gpu-0-mig-1")])


def _request(report):
    (req,) = report.requests
    return req


def test_free_devices_make_it_ready(snapshot_of):
    report = analyze(snapshot_of(_two_migs()), MIG_1G)
    assert report.decision == READY and report.exit_code == 0
    assert (len(_request(report).matches), len(_request(report).free)) == (2, 2)
    assert report.node == "node-a"
    assert report.profiles == ["1g.10gb"]


def test_allocated_devices_are_taken(snapshot_of):
    one = claim("job-1", {"pool": "node-a", "device": "gpu-0-mig-0"})
    report = analyze(snapshot_of(_two_migs(), one), MIG_1G)
    req = _request(report)
    assert report.decision == READY
    assert req.counts() == {TAKEN: 1, FREE: 1}
    taken = next(m for m in req.matches if m.state == TAKEN)
    assert taken.device.name == "gpu-0-mig-0" and "team-a/job-1" in taken.why


def test_all_taken_fails_and_says_by_whom(snapshot_of):
    both = claim("job-1", {"pool": "node-a", "device": "gpu-0-mig-0"},
                 {"pool": "node-a", "device": "gpu-0-mig-1"})
    report = analyze(snapshot_of(_two_migs(), both), MIG_1G)
    assert report.decision == FAIL and report.exit_code == 1
    assert "2 match, 0 free" in report.reason
    assert any("every matching device is unavailable (2 taken)" in d and "team-a/job-1" in d
               for d in report.diagnosis)


def test_admin_access_does_not_take_a_device(snapshot_of):
    admin = claim("monitor", {"pool": "node-a", "device": "gpu-0-mig-0", "adminAccess": True},
                  namespace="monitoring")
    report = analyze(snapshot_of(_two_migs(), admin), MIG_1G)
    assert _request(report).counts() == {FREE: 2}
    assert any("adminAccess" in n and "monitoring/monitor" in n for n in report.notes)


def test_a_claim_on_another_driver_or_pool_does_not_take_ours(snapshot_of):
    other = claim("x", {"pool": "node-b", "device": "gpu-0-mig-0"})
    assert _request(analyze(snapshot_of(_two_migs(), other), MIG_1G)).counts() == {FREE: 2}


@pytest.mark.parametrize("effect, state", [("NoSchedule", TAINTED), ("NoExecute", TAINTED)])
def test_tainted_devices_are_skipped(snapshot_of, effect, state):
    taint = [{"key": "example.com/unhealthy", "value": "ecc", "effect": effect}]
    report = analyze(snapshot_of(_two_migs(taints=taint)), MIG_1G)
    req = _request(report)
    assert req.counts() == {state: 1, FREE: 1}
    assert "example.com/unhealthy=ecc" in next(m.why for m in req.matches if m.state == state)


def test_a_toleration_in_the_request_admits_the_tainted_device(snapshot_of):
    taint = [{"key": "example.com/unhealthy", "value": "ecc", "effect": "NoSchedule"}]
    template = copy.deepcopy(MIG_1G)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": "example.com/unhealthy", "operator": "Exists", "effect": "NoSchedule"}]
    assert _request(analyze(snapshot_of(_two_migs(taints=taint)), template)).counts() == {FREE: 2}


def test_only_the_newest_pool_generation_counts(snapshot_of):
    old = rslice("node-a", [mig("gpu-0-mig-0"), mig("gpu-0-mig-1")], generation=1, name="old")
    new = rslice("node-a", [mig("gpu-0-mig-7", profile="2g.20gb", memory="19968Mi")],
                 generation=2, name="new")
    report = analyze(snapshot_of(old, new), MIG_1G)
    assert [r.device for r in report.inventory] == ["gpu-0-mig-7"]
    assert report.profiles == ["2g.20gb"]
    assert report.pools[0]["generation"] == 2 and report.pools[0]["stale_slices"] == 1
    assert report.decision == FAIL
    assert any("1 slice(s) of an older generation ignored" in n for n in report.notes)
    assert any("MIG profiles published: 2g.20gb" in d for d in report.diagnosis)


@pytest.mark.parametrize("version, single", [("1.34", READY), ("1.35", FAIL), ("1.36", FAIL),
                                              ("1.37", FAIL)])
def test_incomplete_pool_per_release(snapshot_of, version, single):
    """1.34 still takes a single device from a pool being updated; 1.35+ takes nothing from it.
    Asking for all devices fails on it in every release."""
    part = rslice("node-a", [mig("gpu-0-mig-0"), mig("gpu-0-mig-1")], count=2)
    report = analyze(snapshot_of(part), MIG_1G, kubernetes_version=version)
    assert report.decision == single, report.reason
    assert report.pools[0]["complete"] is False
    assert any("incomplete: 1 of 2 slices" in n for n in report.notes)
    if single == FAIL:
        assert _request(report).counts() == {INCOMPLETE: 2}
    all_mode = copy.deepcopy(MIG_1G)
    exactly = all_mode["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["allocationMode"] = "All"
    del exactly["count"]
    failed = analyze(snapshot_of(part), all_mode, kubernetes_version=version)
    assert failed.decision == FAIL
    if version == "1.34":
        assert "asks for all devices, but resource pool" in failed.reason


def _partitionable(*, counters_in_own_slice: bool, **full_gpu):
    """One GPU as the NVIDIA driver publishes it with dynamic MIG: a counter set of 8 memory
    slices; the full GPU (with ``full_gpu``'s fields) consumes all, each 1g device one, the 4g
    device four."""
    counter_set = [{"name": "gpu-0-counters",
                    "counters": {f"memorySlice{i}": {"value": "1"} for i in range(8)}}]

    def uses(*slices):
        return [{"counterSet": "gpu-0-counters",
                 "counters": {f"memorySlice{i}": {"value": "1"} for i in slices}}]

    devices = [
        gpu("gpu-0", consumesCounters=uses(*range(8)), **full_gpu),
        mig("gpu-0-mig-1g-0", consumesCounters=uses(0)),
        mig("gpu-0-mig-1g-1", consumesCounters=uses(1)),
        mig("gpu-0-mig-4g-0", profile="4g.40gb", memory="40192Mi", consumesCounters=uses(0, 1, 2,
                                                                                         3)),
    ]
    if counters_in_own_slice:  # Kubernetes 1.35+: the counters sit in a slice of their own
        return [rslice("node-a", [], count=2, name="counters", shared_counters=counter_set),
                rslice("node-a", devices, count=2, name="devices")]
    return [rslice("node-a", devices, shared_counters=counter_set)]


@pytest.mark.parametrize("version", ["1.36", "1.37"])
def test_shared_counters_block_overlapping_devices(snapshot_of, version):
    """Partitionable devices (on by default from 1.36): counters in a slice of their own."""
    used = claim("job", {"pool": "node-a", "device": "gpu-0-mig-1g-0"})
    report = analyze(snapshot_of(*_partitionable(counters_in_own_slice=True), used), MIG_1G,
                     kubernetes_version=version)
    states = {r.device: r.state for r in report.inventory}
    assert states == {"gpu-0": BLOCKED, "gpu-0-mig-1g-0": TAKEN, "gpu-0-mig-1g-1": FREE,
                      "gpu-0-mig-4g-0": BLOCKED}
    assert report.decision == READY and len(_request(report).free) == 1
    why = next(r.why for r in report.inventory if r.device == "gpu-0")
    assert "gpu-0-counters/memorySlice0" in why
    assert report.pools[0]["counter_sets"] == ["gpu-0-counters"]


@pytest.mark.parametrize("version", ["1.34", "1.35"])
def test_counter_consuming_devices_unusable_while_the_feature_is_off(snapshot_of, version):
    report = analyze(snapshot_of(*_partitionable(counters_in_own_slice=True)), MIG_1G,
                     kubernetes_version=version)
    assert report.decision == FAIL
    assert _request(report).counts() == {BLOCKED: 2}
    assert "DRAPartitionableDevices is off" in _request(report).matches[0].why


def test_full_gpu_allocated_blocks_every_mig_placement(snapshot_of):
    used = claim("big", {"pool": "node-a", "device": "gpu-0"})
    report = analyze(snapshot_of(*_partitionable(counters_in_own_slice=True), used), MIG_1G)
    assert report.decision == FAIL
    assert _request(report).counts() == {BLOCKED: 2}


# The full GPU shared (consumable capacity, on by default from 1.36): a share of its memory per
# claim, the way the scheduler records one (a share ID and the capacity it consumed).
SHARED_MEMORY = {"memory": {"value": "81559Mi", "requestPolicy": {"default": "10Gi",
                                                                  "validRange": {"min": "1Gi"}}}}
SHARE_ID = "6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f"


def _shared_gpu_held(**consumed):
    return claim("shared", {"pool": "node-a", "device": "gpu-0", "shareID": SHARE_ID, **consumed})


@pytest.mark.parametrize("version", ["1.36", "1.37"])
def test_a_shared_gpu_in_use_blocks_the_mig_devices_of_its_counters(snapshot_of, version):
    """A share of the full GPU charges the counters the MIG devices need, as a dedicated
    allocation does: the allocator counts every allocated device, shares included, so no MIG
    device is free (the two releases where partitionable devices and sharing are both on)."""
    slices = _partitionable(counters_in_own_slice=True, allowMultipleAllocations=True,
                            capacity=SHARED_MEMORY)
    held = _shared_gpu_held(consumedCapacity={"memory": "10Gi"})
    report = analyze(snapshot_of(*slices, held), MIG_1G, kubernetes_version=version)
    assert report.decision == FAIL
    assert _request(report).counts() == {BLOCKED: 2}
    assert "gpu-0-counters/memorySlice0 is used by allocated devices (1 of 1)" in \
        _request(report).matches[0].why
    states = {r.device: r.state for r in report.inventory}
    assert states == {"gpu-0": FREE, "gpu-0-mig-1g-0": BLOCKED, "gpu-0-mig-1g-1": BLOCKED,
                      "gpu-0-mig-4g-0": BLOCKED}


@pytest.mark.parametrize("version, capacity, consumed, state", [
    ("1.36", SHARED_MEMORY, {"consumedCapacity": {"memory": "10Gi"}}, FREE),
    ("1.37", SHARED_MEMORY, {"consumedCapacity": {"memory": "10Gi"}}, FREE),
    # A GPU that publishes no capacity: its share consumed none, and 1.36 charges its counters
    # again for the next share (a fix of 1.37's allocator charges them once).
    ("1.36", {}, {}, BLOCKED),
    ("1.37", {}, {}, FREE),
])
def test_a_further_share_of_a_shared_gpu(snapshot_of, version, capacity, consumed, state):
    slices = _partitionable(counters_in_own_slice=True, allowMultipleAllocations=True,
                            capacity=capacity)
    shared = shared_gpu_claim_template()
    report = analyze(snapshot_of(*slices, _shared_gpu_held(**consumed)), shared,
                     kubernetes_version=version)
    assert _request(report).counts() == {state: 1}
    assert report.decision == (READY if state == FREE else FAIL), report.reason
    if state == BLOCKED:
        assert "this device's own allocation among them" in _request(report).matches[0].why


def test_one_node_must_serve_the_whole_claim(snapshot_of):
    two = copy.deepcopy(MIG_1G)
    two["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    a = rslice("node-a", [mig("gpu-0-mig-0")])
    b = rslice("node-b", [mig("gpu-0-mig-0")])
    report = analyze(snapshot_of(a, b), two)
    assert _request(report).counts() == {FREE: 2}
    assert report.decision == FAIL and "no node can serve the claim" in report.reason
    # each node's reason in kube-scheduler's words: what a Pending pod's condition then says
    assert report.unschedulable == ["node node-a: cannot allocate all claims"]
    report = analyze(snapshot_of(_two_migs(), b), two)
    assert report.decision == READY and report.node == "node-a"


@pytest.mark.parametrize("policy, decision, code", [("skip", SKIP, 77), ("fail", FAIL, 1)])
def test_no_dra_at_all_skips_or_fails(snapshot_of, policy, decision, code):
    report = analyze(snapshot_of(classes=False), MIG_1G, on_missing_dra=policy)
    assert (report.decision, report.exit_code) == (decision, code)
    assert "no DRA at all" in report.reason
    assert any("NVIDIA DRA driver is not installed" in d for d in report.diagnosis)


def test_dra_api_not_served(snapshot_of):
    snap = snapshot_of(classes=False)
    snap.dra_api = False
    report = analyze(snap, None)
    assert report.decision == SKIP and "does not serve resource.k8s.io/v1" in report.reason


def test_class_but_no_slices_prints_the_label_fix(snapshot_of):
    ds = {"kind": "DaemonSet", "metadata": {"name": "nvidia-dra-driver-gpu-kubelet-plugin",
                                            "namespace": "kube-system"},
          "spec": {"template": {"spec": {"nodeSelector": {"nvidia-device-enable": "pgpu-dra"}}}}}
    nodes = [
        {"kind": "Node", "metadata": {"name": "gpu-1", "labels": {
            "nvidia.com/gpu.present": "true"}}},
        {"kind": "Node", "metadata": {"name": "gpu-2", "labels": {
            "nvidia.com/gpu.present": "true", "nvidia-device-enable": "pgpu-dra"}}},
        {"kind": "Node", "metadata": {"name": "cpu-1", "labels": {}}},
    ]
    report = analyze(snapshot_of(ds, *nodes), MIG_1G)
    assert report.decision == SKIP
    (message,) = [d for d in report.diagnosis if "kubelet plugin publishes nothing" in d]
    assert "`kubectl label node gpu-1 nvidia-device-enable=pgpu-dra`" in message
    assert "gpu-2" not in message and "cpu-1" not in message


def test_class_but_no_slices_without_daemonsets_gives_the_commands(snapshot_of):
    report = analyze(snapshot_of(), None)
    assert any("kubectl label node <gpu-node>" in d for d in report.diagnosis)


def test_mig_class_without_mig_devices_says_how_to_create_them(snapshot_of):
    report = analyze(snapshot_of(rslice("node-a", [gpu("gpu-0")])), MIG_1G)
    assert report.decision == FAIL
    assert any("nvidia-smi mig -cgi" in d and "MIG mode is off" in d for d in report.diagnosis)


def test_selector_matching_nothing_lists_the_published_profiles(snapshot_of):
    sl = rslice("node-a", [mig("gpu-0-mig-0", profile="1g.12gb"),
                           mig("gpu-0-mig-1", profile="2g.24gb")])
    report = analyze(snapshot_of(sl), mig_claim_template("1g.6gb"))
    assert report.decision == FAIL
    assert any("MIG profiles published: 1g.12gb, 2g.24gb" in d for d in report.diagnosis)


def test_cel_runtime_error_fails_with_device_and_expression(snapshot_of):
    template = copy.deepcopy(shared_gpu_claim_template())
    expr = 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": expr}}]
    report = analyze(snapshot_of(rslice("node-a", [gpu("gpu-0")])), template)
    assert report.decision == FAIL
    assert report.reason.startswith(
        "claim default/shared-gpu-timeslice: selector #0 on device gpu.nvidia.com/node-a/gpu-0: "
        "CEL runtime error: no such key: profile")


def test_cel_compile_error_names_the_expression(snapshot_of):
    template = copy.deepcopy(MIG_1G)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.atributes['x'].y == 1"}}]
    with pytest.raises(CelCompileError, match="does not compile .*undefined field 'atributes'"):
        analyze(snapshot_of(_two_migs()), template)


def test_missing_device_class_is_an_error(snapshot_of):
    template = copy.deepcopy(MIG_1G)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nope"
    report = analyze(snapshot_of(_two_migs()), template)
    assert report.decision == FAIL
    assert report.reason.endswith('could not retrieve device class nope: '
                                  'deviceclasses.resource.k8s.io "nope" not found')
    assert any("DeviceClass nope not found" in d for d in report.diagnosis)


def test_v1beta1_template_and_first_available(snapshot_of):
    v1beta1 = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaimTemplate",
               "metadata": {"name": "old"},
               "spec": {"spec": {"devices": {"requests": [{
                   "name": "gpu", "deviceClassName": "mig.nvidia.com",
                   "selectors": [{"cel": {"expression":
                                  'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'}}],
               }]}}}}
    assert analyze(snapshot_of(_two_migs()), v1beta1).decision == READY
    first = {"kind": "ResourceClaimTemplate", "metadata": {"name": "either"},
             "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                 {"name": "big", "deviceClassName": "gpu.nvidia.com"},
                 {"name": "small", "deviceClassName": "mig.nvidia.com"}]}]}}}}
    report = analyze(snapshot_of(_two_migs()), first)
    assert report.decision == READY and _request(report).name == "gpu/small"


def test_published_slices_for_advise(snapshot_of):
    used = claim("job", {"pool": "node-a", "device": "gpu-0-mig-0"})
    h100 = rslice("node-b", [gpu("gpu-0"), gpu("gpu-1")])
    assert published_slices(snapshot_of(_two_migs(), h100, used)) == [
        PublishedSlice(profile="1g.10gb", product="NVIDIA A100 80GB PCIe", memory_gib=9.5,
                       total=2, free=1),
        PublishedSlice(profile="full", product="NVIDIA H100 80GB HBM3", memory_gib=79.65,
                       total=2, free=2),
    ]


def test_published_slices_carry_the_sms_a_real_mig_device_publishes(snapshot_of):
    """The A100 dump's 1g.10gb publishes ``multiprocessors: "14"``: advise scales time by it."""
    from draslice.tests.cluster.conftest import load_fixture_objects

    found = published_slices(snapshot_of(*load_fixture_objects(
        "a100-80gb-mig-1g10gb.v1alpha3.list.yaml")))
    assert [(p.profile, p.multiprocessors) for p in found] == [("1g.10gb", 14)]


def test_all_mode_wants_every_matching_device_of_one_node(snapshot_of):
    all_mode = copy.deepcopy(MIG_1G)
    exactly = all_mode["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["allocationMode"] = "All"
    del exactly["count"]
    b = rslice("node-b", [mig("gpu-0-mig-0"), mig("gpu-0-mig-1")])
    held = claim("job", {"pool": "node-b", "device": "gpu-0-mig-1"})
    report = analyze(snapshot_of(_two_migs(), b, held), all_mode)
    assert report.decision == READY and report.node == "node-a"
    held_a = claim("job-a", {"pool": "node-a", "device": "gpu-0-mig-0"})
    report = analyze(snapshot_of(_two_migs(), b, held, held_a), all_mode)
    assert report.decision == FAIL
