"""(a) Every object `draslice manifests all` renders (the committed manifests/, which
tests/manifests/test_committed.py keeps equal to what it renders) is accepted by the real API
server through `kubectl apply --server-side` with strict field validation (an unknown or
misspelt field is an error, not silently dropped) and stored unchanged; the Kueue, Kyverno and
Trainer objects after their projects' own CRDs (tests/realcluster/crds.py); and the server's own
validation of the claim templates' CEL.

Not applied: manifests/50-kueue-config.yaml, a fragment of Kueue's controller configuration file
(not an API object: its header says to merge it into the kueue-manager-config ConfigMap).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from draslice.tests.realcluster.crds import crd_files
from draslice.tests.realcluster.kube import KubeError

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
NOT_API_OBJECTS = {"50-kueue-config.yaml"}
APPLIED = sorted(p.name for p in MANIFESTS.glob("*.yaml") if p.name not in NOT_API_OBJECTS)


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _differences(sent, stored, path: str = "") -> list[str]:
    """Where ``stored`` lacks or changed a value of ``sent`` (server defaults may be added)."""
    if isinstance(sent, dict) and isinstance(stored, dict):
        return [d for k, v in sent.items() for d in (
            [f"{path}.{k}: missing"] if k not in stored else
            _differences(v, stored[k], f"{path}.{k}"))]
    if isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        return [d for i, (a, b) in enumerate(zip(sent, stored, strict=True))
                for d in _differences(a, b, f"{path}[{i}]")]
    return [] if sent == stored else [f"{path}: sent {sent!r:.80}, stored {stored!r:.80}"]


def _check(result, what: str) -> str:
    assert result.returncode == 0, f"{what}: exit {result.returncode}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def upstream_crds(cluster):
    names = []
    for path in crd_files():
        _check(cluster.cp.kubectl("apply", "--server-side", "-f", str(path)), f"CRD {path}")
        names.append(_docs(path)[0]["metadata"]["name"])
    _check(cluster.cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                              *[f"crd/{n}" for n in names]), "CRDs established")
    return names


@pytest.mark.parametrize("name", APPLIED)
def test_server_side_apply_accepts_every_object(cluster, upstream_crds, name):
    path = MANIFESTS / name
    docs = _docs(path)
    out = _check(cluster.cp.kubectl("apply", "--server-side", "--validate=strict",
                                    "--field-manager=draslice-tests", "-f", str(path)), name)
    assert out.count("serverside-applied") == len(docs), out
    for doc in docs:  # what the server stored carries every field we wrote, unchanged
        meta = doc["metadata"]
        group = doc["apiVersion"].rpartition("/")[0]
        version = doc["apiVersion"].rpartition("/")[2]
        resource = f"{doc['kind'].lower()}.{version}.{group}" if group else doc["kind"].lower()
        got = _check(cluster.cp.kubectl("get", resource, meta["name"], "-o", "json",
                                        *(["-n", meta["namespace"]] if meta.get("namespace")
                                          else [])), f"get {doc['kind']} {meta['name']}")
        assert _differences(doc, json.loads(got)) == [], f"{name}: {doc['kind']} {meta['name']}"
    cleanup = cluster.cp.kubectl("delete", "--wait=false", "--ignore-not-found",
                                 "--grace-period=0", "--force", "-f", str(path))
    _check(cleanup, f"delete {name}")


def _template_with(expression: str) -> dict:
    template = copy.deepcopy(_docs(MANIFESTS / "10-claim-templates.yaml")[0])
    template["metadata"]["name"] = "cel-check"
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": expression}}]
    return template


@pytest.mark.parametrize("template", _docs(MANIFESTS / "10-claim-templates.yaml"),
                         ids=lambda t: t["metadata"]["name"])
def test_each_templates_cel_passes_the_servers_validation(cluster, template):
    """The server compiles each selector with the scheduler's CEL environment on create."""
    stored = cluster.admin.create(template, dry_run=True)
    assert _differences(template["spec"], stored["spec"]) == []


@pytest.mark.parametrize("expression, words", [
    ('device.attributes["gpu.nvidia.com"].profile ==', "Syntax error"),
    ('device.attributes["gpu.nvidia.com"].profile.nosuch()', "undeclared reference"),
    ('device.capacity["gpu.nvidia.com"].memory', "must evaluate to bool"),
])
def test_the_server_refuses_a_selector_that_does_not_compile(cluster, expression, words):
    """The control for the test above: the same server does refuse broken CEL."""
    with pytest.raises(KubeError) as err:
        cluster.admin.create(_template_with(expression), dry_run=True)
    assert err.value.status == 422
    assert "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression" in \
        err.value.message
    assert words in err.value.message
