"""Which allocator decides: --kubernetes-version, a live server's version clamped to the
supported releases, the newest for a snapshot; and the runner's own answers."""

from __future__ import annotations

import pytest

from draslice.cluster import allocator
from draslice.cluster.preflight import kubernetes_release
from draslice.cluster.snapshot import Snapshot
from draslice.errors import InvalidParameter


@pytest.mark.parametrize(
    "server, chosen, noted",
    [("v1.35.2", "1.35", False), ("v1.34.0-gke.1", "1.34", False), ("v1.37.2", "1.37", False),
     ("v1.33.4", "1.34", True), ("v1.40.0", "1.37", True), ("garbage", "1.37", True)],
)
def test_live_server_version_is_clamped(server, chosen, noted):
    snap = Snapshot(source="cluster https://x", server_version=server)
    version, note = kubernetes_release(snap, None)
    assert version == chosen
    assert bool(note) is noted
    if noted:
        assert chosen in note


def test_asked_version_wins_and_snapshot_default_is_newest():
    snap = Snapshot(source="cluster https://x", server_version="v1.35.1")
    assert kubernetes_release(snap, "1.36") == ("1.36", None)
    assert kubernetes_release(Snapshot(source="dump.yaml"), None) == (allocator.NEWEST, None)
    with pytest.raises(InvalidParameter, match="must be one of 1.34, 1.35, 1.36, 1.37"):
        allocator.check_version("1.33")


def test_each_release_reports_its_module_and_features():
    for version in allocator.SUPPORTED:
        answer = allocator.run({"checks": ["true"]}, version)
        assert answer["release"] == version
        assert answer["module"].startswith("k8s.io/dynamic-resource-allocation v0." + version[2:])
        assert answer["checks"] == [{"expression": "true"}]
    new = allocator.run({"checks": []}, "1.37")["features"]
    old = allocator.run({"checks": []}, "1.34")["features"]
    assert new.get("DRAPartitionableDevices") and not old.get("DRAPartitionableDevices")


def test_unreadable_input_is_an_answer_with_an_error():
    answer = allocator.run({"resourceSlices": [{"kind": "ResourceSlice", "apiVersion":
                                                "resource.k8s.io/v1alpha3",
                                                "metadata": {"name": "s"}}],
                            "templates": []}, "1.37")
    assert "ResourceSlice s (resource.k8s.io/v1alpha3)" in answer["error"]
