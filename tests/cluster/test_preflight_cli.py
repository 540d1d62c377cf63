"""``draslice preflight --snapshot`` on every fixture: inventory, match/free counts, exit codes."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from draslice.cli import main
from draslice.cluster.templates import mig_claim_template
from tests.cluster.conftest import (
    ALL_FIXTURES,
    EXCERPT_NODES,
    claim,
    load_fixture_objects,
    write_snapshot,
)
from tests.conftest import fixture_path

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100 80GB PCIe"
REF = "NVIDIA A100-PCIE-40GB"
# fixture -> (inventory rows (node, type, profile, product, GiB, count), {template option:
# (matching, free, exit code)})
EXPECTED = {
    "h100-80gb-x8-two-nodes.k8s-1.35.list.yaml": (
        [("gpu-node-1", "gpu", "full", H100, 79.65, 8), ("gpu-node-2", "gpu", "full", H100,
                                                          79.65, 8)],
        {"--shared=timeslicing": (16, 16, 0), "--shared=mps": (16, 16, 0),
         "--profile=1g.10gb": (0, 0, 1)},
    ),
    "h200-one-device.gke-1.36.yaml": (
        [("<node-name>", "gpu", "full", "NVIDIA H200", 140.4, 1)],
        {"--shared=timeslicing": (1, 1, 0), "--profile=1g.18gb": (0, 0, 1)},
    ),
    "p100-16gb.v1beta1.yaml": (
        [("192.168.140.59", "gpu", "full", "Tesla P100-PCIE-16GB", 16.0, 1)],
        {"--shared=timeslicing": (1, 1, 0), "--profile=1g.10gb": (0, 0, 1)},
    ),
    "a100-80gb-mig-1g10gb.v1alpha3.list.yaml": (
        [("k8s-dra-driver-cluster-worker", "mig", "1g.10gb", A100, 9.5, 1)],
        {"--profile=1g.10gb": (1, 1, 0), "--profile=1g.5gb": (0, 0, 1),
         "--shared=timeslicing": (0, 0, 1)},
    ),
    "driver-reference-gpu-device.illustrative.yaml": (
        [("reference-node", "gpu", "full", REF, 40.0, 1)],
        {"--shared=mps": (1, 1, 0), "--profile=1g.5gb": (0, 0, 1)},
    ),
    "driver-reference-mig-device.illustrative.yaml": (
        [("reference-node", "mig", "1g.5gb", REF, 4.75, 1)],
        {"--profile=1g.5gb": (1, 1, 0), "--shared=timeslicing": (0, 0, 1)},
    ),
    "driver-reference-vfio-device.illustrative.yaml": (
        [("reference-node", "vfio", "", REF, None, 1)],
        {"--shared=timeslicing": (0, 0, 1), "--profile=1g.5gb": (0, 0, 1)},
    ),
}


def _invoke(*args):
    return CliRunner().invoke(main, ["preflight", *args])


def _snapshot_file(fixture, tmp_path, *extra):
    """The fixture itself when it is a complete dump; excerpts completed into one."""
    if fixture in EXCERPT_NODES or extra:
        return str(write_snapshot(tmp_path / "dump.yaml", load_fixture_objects(fixture)
                                  + list(extra)))
    return str(fixture_path("resourceslices", fixture))


def test_every_fixture_is_covered():
    assert sorted(EXPECTED) == ALL_FIXTURES


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_inventory(fixture, tmp_path):
    rows, _ = EXPECTED[fixture]
    res = _invoke("--snapshot", _snapshot_file(fixture, tmp_path), "--json")
    out = json.loads(res.output)
    got = {}
    for r in out["inventory"]:
        key = (r["node"], r["type"], r["profile"], r["product"], r["memory_gib"])
        got[key] = got.get(key, 0) + 1
    assert got == {row[:5]: row[5] for row in rows}
    assert all(r["state"] == "free" for r in out["inventory"])
    assert res.exit_code == 0 and out["decision"] == "ready"  # inventory only: a device is free
    # the table shows the same inventory
    text = _invoke("--snapshot", _snapshot_file(fixture, tmp_path)).output
    for node, typ, profile, product, _, count in rows:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(node) and product
                    in ln)
        assert typ in line and (profile in line) and f" {count} " in line


@pytest.mark.parametrize(
    "fixture, option",
    [(f, o) for f, (_, opts) in sorted(EXPECTED.items()) for o in opts],
)
def test_match_and_free_counts(fixture, option, tmp_path):
    matching, free, code = EXPECTED[fixture][1][option]
    res = _invoke("--snapshot", _snapshot_file(fixture, tmp_path), option, "--json")
    assert res.exit_code == code, res.output
    (req,) = json.loads(res.output)["requests"]
    assert (req["matching"], req["free"]) == (matching, free)
    text = _invoke("--snapshot", _snapshot_file(fixture, tmp_path), option)
    assert f"matching devices: {matching} " in text.output and f"free: {free}" in text.output
    assert text.exit_code == code


def test_taken_by_a_claim_in_the_dump(tmp_path):
    fixture = "a100-80gb-mig-1g10gb.v1alpha3.list.yaml"
    held = claim("job", {"pool": "k8s-dra-driver-cluster-worker", "device": "gpu-0-mig-19-6-1"})
    res = _invoke("--snapshot", _snapshot_file(fixture, tmp_path, held), "--profile", "1g.10gb")
    assert res.exit_code == 1
    assert "matching devices: 1 (1 taken); free: 0" in res.output
    assert "allocated to claim team-a/job" in res.output


def test_template_by_name_from_the_dump_and_from_a_file(tmp_path):
    fixture = "a100-80gb-mig-1g10gb.v1alpha3.list.yaml"
    template = mig_claim_template("1g.10gb", namespace="kubeflow")
    dump = _snapshot_file(fixture, tmp_path, template)
    res = _invoke("--snapshot", dump, "--template", "mig-1g-10gb", "-n", "kubeflow")
    assert res.exit_code == 0, res.output
    assert "claim template: mig-1g-10gb" in res.output
    missing = _invoke("--snapshot", dump, "--template", "mig-2g-20gb", "-n", "kubeflow")
    assert missing.exit_code == 1
    assert "ResourceClaimTemplate mig-2g-20gb not found in namespace kubeflow" in missing.output
    assert "kubeflow/mig-1g-10gb" in missing.output
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(template))
    assert _invoke("--snapshot", dump, "--template-file", str(path)).exit_code == 0


@pytest.mark.parametrize("policy, code", [("skip", 77), ("fail", 1)])
def test_no_dra_snapshot_skips_or_fails(tmp_path, policy, code):
    dump = write_snapshot(tmp_path / "empty.yaml", [])
    res = _invoke("--snapshot", str(dump), "--profile", "1g.10gb", "--on-missing-dra", policy)
    assert res.exit_code == code
    assert f"preflight: {policy.upper()} — no DRA at all" in res.output
    assert "the NVIDIA DRA driver is not installed" in res.output


def test_raw_excerpt_without_driver_is_a_clear_error():
    excerpt = fixture_path("resourceslices", "a100-80gb-mig-1g10gb.v1alpha3.list.yaml")
    res = _invoke("--snapshot", str(excerpt))
    assert res.exit_code == 2
    assert "a100-80gb-mig-1g10gb.v1alpha3.list.yaml" in res.output
    assert "spec.driver and spec.pool are required" in res.output


@pytest.mark.parametrize(
    "content, message",
    [
        ("kind: List\nmetadata: {}\nitems:\n\t- bad\n", "line 4: not valid YAML"),
        ("kind: List\nitems:\n- kind: ResourceSlice\n  metadata: {name: x}\n", "item 1 (line 3)"),
        ("---\nkind: DeviceClass\n---\n- 1\n- 2\n", "document 2 (line 4)"),
        ("", "empty file"),
    ],
)
def test_bad_snapshot_names_file_and_place(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    res = _invoke("--snapshot", str(path))
    assert res.exit_code == 2
    assert str(path) in res.output and message in res.output
    assert "Traceback" not in res.output


def test_usage_errors_exit_2(tmp_path):
    dump = write_snapshot(tmp_path / "empty.yaml", [])
    assert _invoke("--snapshot", str(dump), "--profile", "1g.10gb", "--shared", "mps"
                   ).exit_code == 2
    res = _invoke("--snapshot", str(dump), "--profile", "10gb")
    assert res.exit_code == 2 and "invalid profile='10gb'" in res.output
    assert _invoke("--snapshot", str(tmp_path / "nope.yaml")).exit_code == 2


def test_help_explains_exit_codes_and_examples():
    res = _invoke("--help")
    assert res.exit_code == 0
    for text in ("77  skip", "--snapshot", "kubectl get deviceclasses", "--profile 1g.10gb"):
        assert text in res.output
