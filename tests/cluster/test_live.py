"""Preflight through the real ``kubernetes`` client against an API server on loopback."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from draslice.cli import main
from draslice.cluster import live
from draslice.cluster.snapshot import NVIDIA_DEVICE_CLASSES
from draslice.cluster.templates import mig_claim_template, shared_gpu_claim_template
from tests.cluster.conftest import claim, load_fixture_objects
from tests.cluster.k8s_fake_server import RESOURCE, FakeCluster, kubeconfig, serve

H100 = "h100-80gb-x8-two-nodes.k8s-1.35.list.yaml"


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    fake = FakeCluster(objects=list(NVIDIA_DEVICE_CLASSES) + load_fixture_objects(H100))
    server, url = serve(fake)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(url)))
    fake.kubeconfig = str(path)
    fake.url = url
    yield fake
    server.shutdown()
    server.server_close()


def _preflight(cluster, *args):
    return CliRunner().invoke(main, ["preflight", "--kubeconfig", cluster.kubeconfig, *args])


def test_live_read_pages_through_every_list(cluster, monkeypatch):
    monkeypatch.setattr(live, "PAGE_SIZE", 2)  # 4 slices, 3 classes: several pages each
    res = _preflight(cluster, "--shared", "timeslicing", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["source"] == f"cluster {cluster.url}"
    assert (out["requests"][0]["matching"], out["requests"][0]["free"]) == (16, 16)
    assert len(out["inventory"]) == 16
    pages = [q for m, p, q in cluster.log if p == f"{RESOURCE}/resourceslices"]
    assert len(pages) == 2 and "continue" not in pages[0] and "continue" in pages[1]
    assert all(q["limit"] == "2" for q in pages)


def test_live_claims_and_templates(cluster):
    cluster.objects += [
        mig_claim_template("1g.10gb", namespace="kubeflow"),
        claim("job", {"pool": "gpu-node-1", "device": "gpu-3"}, namespace="other"),
    ]
    res = _preflight(cluster, "--template", "mig-1g-10gb", "-n", "kubeflow")
    assert res.exit_code == 1
    assert "claim template: mig-1g-10gb" in res.output
    assert "nvidia-smi mig -cgi" in res.output
    res = _preflight(cluster, "--shared", "mps", "--json")
    req = json.loads(res.output)["requests"][0]
    assert (req["matching"], req["free"]) == (16, 15)
    paths = {p for _, p, _ in cluster.log}
    assert f"{RESOURCE}/namespaces/kubeflow/resourceclaimtemplates" in paths
    assert f"{RESOURCE}/resourceclaims" in paths


def test_403_names_verb_resource_and_the_rbac_fix(cluster):
    cluster.forbidden.add(f"{RESOURCE}/resourceslices")
    res = _preflight(cluster, "--profile", "1g.10gb")
    assert res.exit_code == 1
    msg = res.output
    assert "may not list resourceslices.resource.k8s.io (cluster scope): HTTP 403" in msg
    assert 'User "system:serviceaccount:kubeflow:pipeline-runner" cannot list' in msg
    assert "draslice manifests rbac" in msg
    assert "Traceback" not in msg


def test_claims_forbidden_cluster_wide_fall_back_to_the_namespace(cluster):
    cluster.forbidden.add(f"{RESOURCE}/resourceclaims")
    cluster.objects.append(claim("mine", {"pool": "gpu-node-2", "device": "gpu-0"},
                                 namespace="kubeflow"))
    res = _preflight(cluster, "--shared", "timeslicing", "-n", "kubeflow", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["requests"][0]["free"] == 15
    assert any("claims read in namespace kubeflow only" in n for n in out["notes"])
    # without a namespace to fall back to, the 403 is the answer
    res = _preflight(cluster, "--shared", "timeslicing")
    assert res.exit_code == 1 and "may not list resourceclaims.resource.k8s.io" in res.output


@pytest.mark.parametrize("policy, code", [("skip", 77), ("fail", 1)])
def test_404_means_no_dra(cluster, policy, code):
    cluster.dra = False
    res = _preflight(cluster, "--profile", "1g.10gb", "--on-missing-dra", policy)
    assert res.exit_code == code
    assert "does not serve resource.k8s.io/v1" in res.output
    assert "Kubernetes 1.34" in res.output


def test_404_names_the_versions_the_cluster_serves(cluster):
    cluster.dra = False
    cluster.other_versions = ["v1beta1"]
    res = _preflight(cluster, "--json")
    assert res.exit_code == 77
    (note,) = json.loads(res.output)["notes"]
    assert "it serves resource.k8s.io/v1beta1 only" in note and "upgrade to Kubernetes 1.34+" \
        in note


def test_unreachable_server_is_one_clear_line(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig("http://127.0.0.1:9")))
    res = CliRunner().invoke(main, ["preflight", "--kubeconfig", str(path)])
    assert res.exit_code == 1
    assert "cannot reach the API server http://127.0.0.1:9" in res.output


def test_missing_kubeconfig_points_at_snapshot(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    res = CliRunner().invoke(main, ["preflight", "--kubeconfig", str(tmp_path / "none")])
    assert res.exit_code == 1
    assert "cannot load cluster credentials" in res.output and "--snapshot" in res.output


def test_pipeline_preflight_in_a_pod_reads_the_cluster(cluster, monkeypatch, tmp_path):
    """The component with source=auto inside a pod: the service account's namespace and the
    live API (here the loopback server through a kubeconfig-configured client)."""
    from kfp import dsl

    from draslice.components.preflight import preflight
    from draslice.errors import DrasliceError

    cluster.objects += [mig_claim_template("1g.10gb", namespace="kubeflow"),
                        shared_gpu_claim_template(namespace="kubeflow")]
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setattr(live, "_pod_namespace", lambda: "kubeflow")
    real = live.api_client
    monkeypatch.setattr(live, "api_client", lambda *a: real(cluster.kubeconfig))
    report = dsl.Markdown(name="report", uri=str(tmp_path / "report"), metadata={})
    out = preflight.python_func(claim_template="shared-gpu-timeslice", on_missing_dra="skip",
                                report=report)
    assert out.decision == "ready" and "16 match, 16 free" in out.reason
    assert f"source: cluster {cluster.url}" in (tmp_path / "report").read_text()
    with pytest.raises(DrasliceError, match="preflight failed") as err:
        preflight.python_func(claim_template="mig-1g-10gb", on_missing_dra="skip", report=report)
    assert "nvidia-smi mig -cgi" in str(err.value)


def test_template_by_name_without_namespace_is_found_in_any_namespace(cluster):
    cluster.objects.append(mig_claim_template("1g.10gb", namespace="team-b"))
    res = _preflight(cluster, "--template", "mig-1g-10gb")
    assert "claim template: mig-1g-10gb" in res.output and res.exit_code == 1  # no MIG device
    assert "Request gpu-slice: class mig.nvidia.com" in res.output
    cluster.forbidden.add(f"{RESOURCE}/resourceclaimtemplates")
    res = _preflight(cluster, "--template", "mig-1g-10gb")
    assert res.exit_code == 1
    assert "ResourceClaimTemplate mig-1g-10gb not found in any namespace" in res.output
    assert "claim templates not read" in res.output and "pass --namespace" in res.output
