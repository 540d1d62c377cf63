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


def test_each_listed_release_has_its_go_file_build_tag_and_module_file():
    """releases.txt is the one list: a release added there without its Go side fails here,
    before any build."""
    assert list(allocator.SUPPORTED) == sorted(allocator.SUPPORTED,
                                               key=lambda v: tuple(map(int, v.split("."))))
    tags = {v: "k8s" + v.replace(".", "") for v in allocator.SUPPORTED}
    older = " || ".join(tags[v] for v in allocator.SUPPORTED if v != allocator.NEWEST)
    for version in allocator.SUPPORTED:
        # the newest also builds without any tag (go build, go vet, an editor)
        constraint = (f"{tags[version]} || !({older})" if version == allocator.NEWEST
                      else tags[version])
        source = (allocator.HERE / f"release_{tags[version][3:]}.go").read_text()
        assert source.startswith(f"//go:build {constraint}\n"), version
        assert f'const release = "{version}"' in source, version
        assert (allocator.HERE / allocator.MODFILES[version]).is_file(), version
    assert allocator.MODFILES[allocator.NEWEST] == "go.mod"
    assert sorted(p.name for p in allocator.HERE.glob("release_*.go")) == sorted(
        f"release_{v.replace('.', '')}.go" for v in allocator.SUPPORTED)


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
