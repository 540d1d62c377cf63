"""A snapshot that holds one object twice: an API server never holds two objects of one kind,
namespace and name, so an identical copy (two dumps concatenated) counts once, with a note,
and a different one is refused, naming both places."""

from __future__ import annotations

import copy
import json

import yaml
from click.testing import CliRunner

from draslice.cli import main
from draslice.cluster.templates import mig_claim_template
from draslice.tests.cluster.conftest import load_fixture_objects, write_snapshot
from draslice.tests.conftest import fixture_path

FIXTURE = "h100-80gb-x8-two-nodes.k8s-1.35.list.yaml"  # two nodes of 8 GPUs each


def _preflight(*args: str):
    return CliRunner().invoke(main, ["preflight", *args])


def test_a_dump_concatenated_twice_counts_each_device_once(tmp_path):
    text = fixture_path("resourceslices", FIXTURE).read_text()
    dump = tmp_path / "twice.yaml"
    dump.write_text(f"{text}\n---\n{text}")
    res = _preflight("--snapshot", str(dump), "--shared", "timeslicing", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    (request,) = out["requests"]
    assert (request["matching"], request["free"]) == (16, 16)
    assert len(out["inventory"]) == 16
    slices = [o for o in load_fixture_objects(FIXTURE) if o["kind"] == "ResourceSlice"]
    (note,) = [n for n in out["notes"] if "ResourceSlices twice" in n]
    assert note.startswith(f"{dump} holds {len(slices)} ResourceSlices twice "
                           f"({slices[0]['metadata']['name']} at document 1, item 1 (line 3) "
                           "and again at document 2, item 1 (line "), note
    assert note.endswith("each counted once, as a cluster holds one object per name"), note
    text_out = _preflight("--snapshot", str(dump), "--shared", "timeslicing").output
    assert "matching devices: 16 (16 free)" in text_out and note in text_out


def test_a_second_different_copy_is_refused_naming_both_places(tmp_path):
    objects = load_fixture_objects(FIXTURE)
    changed = copy.deepcopy(objects[0])
    changed["spec"]["devices"] = changed["spec"]["devices"][:1]
    dump = tmp_path / "two-versions.yaml"
    dump.write_text(yaml.safe_dump_all([{"kind": "List", "items": objects}, changed]))
    res = _preflight("--snapshot", str(dump), "--shared", "timeslicing")
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    (line,) = res.output.splitlines()
    name = objects[0]["metadata"]["name"]
    assert line.startswith(f"error: {dump}: document 2 (line "), line
    assert (f"a second, different ResourceSlice {name} (the first is at document 1, item 1 "
            "(line ") in line
    assert line.endswith("a cluster holds one object per name: keep the copy from one dump")


def test_one_name_in_two_namespaces_is_two_objects(tmp_path):
    a = mig_claim_template("1g.10gb", namespace="team-a")
    b = mig_claim_template("1g.10gb", namespace="team-b")
    dump = write_snapshot(tmp_path / "dump.yaml",
                          load_fixture_objects("a100-80gb-mig-1g10gb.v1alpha3.list.yaml") + [a, b])
    for namespace in ("team-a", "team-b"):
        res = _preflight("--snapshot", str(dump), "--template", "mig-1g-10gb", "-n", namespace)
        assert res.exit_code == 0, res.output
        assert " twice (" not in res.output


def test_a_namespaced_object_twice_is_named_with_its_namespace(tmp_path):
    template = mig_claim_template("1g.10gb", namespace="team-a")
    changed = copy.deepcopy(template)
    changed["metadata"]["labels"] = {"edited": "yes"}
    dump = write_snapshot(tmp_path / "dump.yaml",
                          load_fixture_objects("a100-80gb-mig-1g10gb.v1alpha3.list.yaml")
                          + [template, changed])
    res = _preflight("--snapshot", str(dump), "--template", "mig-1g-10gb", "-n", "team-a")
    assert res.exit_code == 2, res.output
    assert "a second, different ResourceClaimTemplate team-a/mig-1g-10gb" in res.output
