"""Reading a big snapshot: JSON the fast way, YAML through libyaml, progress while it lasts,
and errors that still name the line."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from draslice.benchmarks.preflight_scale import generate
from draslice.cli import main
from draslice.cluster import snapshot as snapshot_mod
from draslice.cluster.snapshot import SnapshotError, load_snapshot

OBJECTS = generate(100, 8)  # 100 nodes x 8 devices, a third of them held by claims


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """The same cluster as ``kubectl -o yaml`` and ``-o json`` would write it."""
    folder = tmp_path_factory.mktemp("dumps")
    listed = {"apiVersion": "v1", "kind": "List", "items": OBJECTS}
    as_yaml, as_json = folder / "dump.yaml", folder / "dump.json"
    as_yaml.write_text(yaml.dump(listed, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)))
    as_json.write_text(json.dumps(listed, indent=2))
    return as_yaml, as_json


def test_json_and_yaml_of_one_cluster_read_alike(dumps):
    as_yaml, as_json = dumps
    from_yaml, from_json = load_snapshot(as_yaml), load_snapshot(as_json)
    for kind in ("device_classes", "slices", "claims"):
        assert getattr(from_yaml, kind) == getattr(from_json, kind), kind
    assert len(from_json.slices) == 100 and len(from_json.inventory.devices) == 800


def test_yaml_is_read_by_libyaml_where_pyyaml_has_it():
    assert snapshot_mod.YAML_LOADER is (yaml.CSafeLoader if yaml.__with_libyaml__
                                        else yaml.SafeLoader)


def test_an_object_at_fault_in_json_is_named_with_its_line(tmp_path):
    items = [*OBJECTS[:3], {"metadata": {"name": "no-kind"}}]
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"kind": "List", "items": items}, indent=2))
    lines = path.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if '"no-kind"' in text) - 2  # its "{"
    with pytest.raises(SnapshotError) as err:
        load_snapshot(path)
    assert str(err.value) == (f"{path}: document 1, item 4 (line {line}): not a Kubernetes "
                              "object (no `kind`)")


def test_a_long_read_says_how_far_it_got(dumps, monkeypatch):
    as_yaml, as_json = dumps
    monkeypatch.setattr(snapshot_mod, "PROGRESS_S", 0.0)  # every chunk counts as "a while"
    said: list[str] = []
    load_snapshot(as_yaml, said.append)
    assert said[0].startswith(f"reading {as_yaml}: ") and " MB parsed in " in said[0]
    assert said[-2].startswith(f"reading {as_yaml}: parsed ")
    assert said[-2].endswith("building its objects")
    assert said[-1].startswith(f"read {as_yaml} in ")
    claims = sum(o["kind"] == "ResourceClaim" for o in OBJECTS)
    assert said[-1].endswith(f": 100 ResourceSlices, {claims} ResourceClaims")
    said.clear()
    load_snapshot(as_json, said.append)
    assert said == []  # read in a fraction of a second


def test_preflight_json_stays_on_stdout_while_progress_goes_to_stderr(dumps, monkeypatch):
    as_yaml, _ = dumps
    monkeypatch.setattr(snapshot_mod, "PROGRESS_S", 0.0)
    res = CliRunner().invoke(main, ["preflight", "--snapshot", str(as_yaml), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["decision"] == "ready"
    assert f"read {as_yaml} in " in res.stderr
