"""``draslice preflight --snapshot`` on every fixture: inventory, match/free counts, exit codes."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from draslice.cli import main
from draslice.cluster.templates import mig_claim_template
from draslice.tests.cluster.conftest import (
    ALL_FIXTURES,
    EXCERPT_NODES,
    claim,
    load_fixture_objects,
    write_snapshot,
)
from draslice.tests.conftest import fixture_path

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


# --- bad input: one clear line, exit 2 (issue 14), and the JSON contract in error cases -------

def _one_slice(tmp_path, **pool_or_capacity):
    from draslice.tests.cluster.conftest import gpu, rslice

    sl = rslice("node-a", [gpu("gpu-0", memory=pool_or_capacity.pop("memory", "81559Mi"))])
    sl["spec"]["pool"].update(pool_or_capacity)
    return str(write_snapshot(tmp_path / "dump.yaml", [sl]))


def _one_line_exit_2(res, *needles):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_binary_snapshot_is_one_line(tmp_path):
    path = tmp_path / "dump.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary")
    _one_line_exit_2(_invoke("--snapshot", str(path)), str(path), "not a text file")


def test_malformed_capacity_quantity_is_the_allocators_refusal(tmp_path):
    res = _invoke("--snapshot", _one_slice(tmp_path, memory="81559Mx"), "--shared", "mps")
    _one_line_exit_2(res, "ResourceSlice node-a-gpu.nvidia.com-g1", "allocator",
                     "quantities must match")


def test_non_numeric_pool_generation(tmp_path):
    res = _invoke("--snapshot", _one_slice(tmp_path, generation="two"), "--shared", "mps")
    _one_line_exit_2(res, "ResourceSlice node-a-gpu.nvidia.com-g1", "generation")


def test_empty_profile_is_refused(tmp_path):
    res = _invoke("--snapshot", _one_slice(tmp_path), "--profile", "")
    _one_line_exit_2(res, "invalid profile=''")


def test_selector_that_does_not_compile_exits_2(tmp_path):
    template = mig_claim_template("1g.10gb", namespace="kubeflow")
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.atributes['x'].y == 1"}}]
    dump = write_snapshot(tmp_path / "dump.yaml",
                          load_fixture_objects("h200-one-device.gke-1.36.yaml") + [template])
    res = _invoke("--snapshot", str(dump), "--template", "mig-1g-10gb", "-n", "kubeflow")
    _one_line_exit_2(res, "does not compile", "undefined field 'atributes'")
    as_json = _invoke("--snapshot", str(dump), "--template", "mig-1g-10gb", "-n", "kubeflow",
                      "--json")
    assert as_json.exit_code == 2
    out = json.loads(as_json.stdout)
    assert out["decision"] == "error" and out["exit_code"] == 2
    assert "does not compile" in out["reason"]


def test_json_contract_of_a_decision(tmp_path):
    fixture = "a100-80gb-mig-1g10gb.v1alpha3.list.yaml"
    template = mig_claim_template("1g.10gb", namespace="kubeflow")
    dump = _snapshot_file(fixture, tmp_path, template)
    res = _invoke("--snapshot", dump, "--template", "mig-1g-10gb", "--namespace", "kubeflow",
                  "--json")
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and out["decision"] == "ready" and out["reason"]
    (req,) = out["requests"]
    assert {"name", "matching", "free", "errors"} <= set(req)
    assert (req["name"], req["matching"], req["free"], req["errors"]) == ("gpu-slice", 1, 1, [])
    assert out["kubernetes_version"] == "1.37"
    assert out["allocation"] == [{"request": "gpu-slice", "driver": "gpu.nvidia.com",
                                  "pool": "k8s-dra-driver-cluster-worker",
                                  "device": "gpu-0-mig-19-6-1"}]


def test_json_error_object_on_bad_input(tmp_path):
    res = _invoke("--snapshot", str(tmp_path / "missing.yaml"), "--json")
    assert res.exit_code == 2
    out = json.loads(res.stdout)
    assert out["decision"] == "error" and "missing.yaml" in out["error"]


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_kubernetes_version_option(tmp_path, version):
    res = _invoke("--snapshot", _one_slice(tmp_path), "--shared", "mps",
                  "--kubernetes-version", version)
    assert res.exit_code == 0, res.output
    assert f"(Kubernetes {version})" in res.output
    bad = _invoke("--snapshot", _one_slice(tmp_path), "--kubernetes-version", "1.20")
    assert bad.exit_code == 2


def test_missing_allocator_binary_is_one_line(tmp_path, monkeypatch):
    """No packaged binary, no Go sources, no cache: one line that says how to get one."""
    from draslice.cluster import allocator

    monkeypatch.setattr(allocator, "HERE", tmp_path)
    allocator.binary.cache_clear()
    try:
        res = _invoke("--snapshot", _one_slice(tmp_path), "--shared", "mps")
    finally:
        allocator.binary.cache_clear()
    _one_line_exit_2(res, "no DRA allocator binary for Kubernetes 1.37", "make allocator",
                     "wheel")


def test_wrong_platform_allocator_binary_is_one_line(tmp_path, monkeypatch):
    from draslice.cluster import allocator

    wrong = tmp_path / "bin" / allocator.host_platform() / "allocator-1.37"
    wrong.parent.mkdir(parents=True)
    wrong.write_bytes(b"\xcf\xfa\xed\xfe" + b"\x00" * 64)  # a Mach-O header
    wrong.chmod(0o755)
    monkeypatch.setattr(allocator, "HERE", tmp_path)
    allocator.binary.cache_clear()
    try:
        res = _invoke("--snapshot", _one_slice(tmp_path), "--shared", "mps")
    finally:
        allocator.binary.cache_clear()
    _one_line_exit_2(res, "cannot run the DRA allocator", "another platform")


def test_bad_kubernetes_version_in_json_mode_is_a_json_error(tmp_path):
    res = _invoke("--snapshot", _one_slice(tmp_path), "--kubernetes-version", "1.20", "--json")
    assert res.exit_code == 2
    out = json.loads(res.stdout)
    assert out["decision"] == "error" and "1.34, 1.35, 1.36, 1.37" in out["error"]
