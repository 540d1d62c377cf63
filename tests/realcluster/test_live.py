"""Live preflight through the real ``kubernetes`` client against a real kube-apiserver: paging,
claims held by running allocations, templates by name, the server's own 403 for an account
without our RBAC, the namespace fallback for the pipeline-runner, the pipeline's preflight
task in a pod, and a real API server without ``resource.k8s.io/v1`` ("no DRA").

Faults a real server does not produce on demand (500, cut connection, stall, non-JSON) and
broken kubeconfigs are in tests/cluster/test_live_faults.py.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from draslice.cluster import live
from draslice.cluster.templates import mig_claim_template
from draslice.tests.realcluster.conftest import NAMESPACE, publish
from draslice.tests.realcluster.controlplane import ControlPlane
from draslice.tests.realcluster.pods import schedule
from draslice.tests.realcluster.scenarios import committed_templates, publishable

REPO = Path(__file__).resolve().parents[2]
H100 = "h100-80gb-x8-two-nodes.k8s-1.35.list.yaml"
OTHER = "team-b"


def _text(kubeconfig, *args) -> tuple[int, str]:
    from draslice.cli import main

    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    res = CliRunner(env=env).invoke(main, ["preflight", "--kubeconfig", str(kubeconfig), *args])
    assert "Traceback" not in res.output, res.output
    return res.exit_code, res.output


@pytest.fixture(scope="module")
def h100(cluster):
    """The two H100 nodes, our templates and RBAC, and one GPU taken by a pod in team-b."""
    from draslice.tests.cluster.conftest import load_fixture_objects

    kube = cluster.admin
    cluster.reset()
    for doc in yaml.safe_load_all((REPO / "manifests" / "20-rbac.yaml").read_text()):
        if doc:
            kube.apply(doc)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OTHER}})
    for template in [*committed_templates(), mig_claim_template("1g.10gb", namespace=NAMESPACE)]:
        kube.apply(template)
    shared = {**committed_templates()[2], "metadata": {"name": "shared-gpu-timeslice",
                                                       "namespace": OTHER}}
    kube.apply(shared)
    kube.apply(mig_claim_template("1g.10gb", namespace=OTHER, name="team-b-mig"))
    for sa in ("pipeline-runner", "nobody"):
        kube.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": sa, "namespace": NAMESPACE}})
    publish(cluster, [publishable(o) for o in load_fixture_objects(H100)])
    kube.wait(f"the {OTHER}/default service account",
              lambda: kube.get("ServiceAccount", "default", OTHER))
    kube.create({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "holder", "namespace": OTHER},
                 "spec": {"containers": [{"name": "main", "image": "registry.invalid/x",
                                          "resources": {"claims": [{"name": "gpu"}]}}],
                          "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName":
                                              "shared-gpu-timeslice"}]}})
    kube.wait("the holder pod bound", lambda: kube.get("Pod", "holder", OTHER)["spec"].get(
        "nodeName"))
    yield cluster
    cluster.reset()


def test_live_read_pages_through_every_list(h100, preflight, monkeypatch):
    monkeypatch.setattr(live, "PAGE_SIZE", 1)  # 4 slices, 3 classes: one object per page
    code, report, output = preflight("--shared", "timeslicing")
    assert code == 0, output
    assert report["source"] == f"cluster {h100.cp.server}"
    assert len(report["inventory"]) == 16
    assert (report["requests"][0]["matching"], report["requests"][0]["free"]) == (16, 15)


def test_live_claims_and_templates(h100, preflight):
    code, output = _text(h100.cp.admin_kubeconfig, "--template", "mig-1g-10gb", "-n",
                         NAMESPACE)
    assert code == 1
    assert "claim template: mig-1g-10gb" in output and "nvidia-smi mig -cgi" in output
    code, report, _ = preflight("--shared", "mps")
    assert (report["requests"][0]["matching"], report["requests"][0]["free"]) == (16, 15)
    held = [d for d in report["inventory"] if d["state"] != "free"]
    assert len(held) == 1  # the device the scheduler gave the holder pod


def test_403_names_verb_resource_and_the_rbac_fix(h100):
    _, kubeconfig = h100.cp.as_service_account(NAMESPACE, "nobody")
    code, output = _text(kubeconfig, "--profile", "1g.10gb")
    assert code == 1
    assert "may not list deviceclasses.resource.k8s.io (cluster scope): HTTP 403" in output
    assert f'User "system:serviceaccount:{NAMESPACE}:nobody" cannot list resource ' \
           '"deviceclasses" in API group "resource.k8s.io" at the cluster scope' in output
    assert "draslice manifests rbac" in output


def test_claims_forbidden_cluster_wide_fall_back_to_the_namespace(h100, preflight):
    _, kubeconfig = h100.cp.as_service_account(NAMESPACE, "pipeline-runner")
    outcome = schedule(h100.admin, "mine", "shared-gpu-timeslice")
    assert outcome.bound, outcome.detail
    try:
        code, report, output = preflight("--shared", "timeslicing", "-n", NAMESPACE,
                                         kubeconfig=kubeconfig)
        assert code == 0, output
        # its own namespace's claim counts; team-b's it may not see counts as free
        assert report["requests"][0]["free"] == 15
        assert any("claims read in namespace kubeflow only" in n for n in report["notes"])
        code, output = _text(kubeconfig, "--shared", "timeslicing")
        assert code == 1 and "may not list resourceclaims.resource.k8s.io" in output
    finally:
        h100.admin.delete("Pod", "mine", NAMESPACE)
        h100.admin.delete_all("ResourceClaim", NAMESPACE)
        h100.admin.wait("its claim gone", lambda: not h100.admin.list("ResourceClaim",
                                                                      NAMESPACE))


def test_template_by_name_without_namespace_is_found_in_any_namespace(h100):
    code, output = _text(h100.cp.admin_kubeconfig, "--template", "team-b-mig")
    assert code == 1 and "claim template: team-b-mig" in output  # no MIG device here
    assert "Request gpu-slice: class mig.nvidia.com" in output
    # an account that may list DRA objects cluster-wide, except claim templates
    kube = h100.admin
    rules = [{"apiGroups": ["resource.k8s.io"], "verbs": ["get", "list"],
              "resources": ["deviceclasses", "resourceslices", "resourceclaims"]}]
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "no-templates"}, "rules": rules})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "no-templates"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "no-templates"},
                "subjects": [{"kind": "ServiceAccount", "name": "nobody",
                              "namespace": NAMESPACE}]})
    _, kubeconfig = h100.cp.as_service_account(NAMESPACE, "nobody")
    code, output = kube.wait("the binding in force", lambda: (
        lambda r: r if "claim templates not read" in r[1] else None)(
        _text(kubeconfig, "--template", "team-b-mig")), timeout=30)
    kube.delete("ClusterRoleBinding", "no-templates")
    assert code == 1
    assert "ResourceClaimTemplate team-b-mig not found in any namespace" in output
    assert "claim templates not read" in output and "pass --namespace" in output


def test_pipeline_preflight_in_a_pod_reads_the_cluster(h100, monkeypatch, tmp_path):
    """The component with source=auto inside a pod: the service account's namespace and its
    token (through a kubeconfig-configured client, since this process is not in a pod)."""
    from kfp import dsl

    from draslice.components.preflight import preflight
    from draslice.errors import DrasliceError

    _, kubeconfig = h100.cp.as_service_account(NAMESPACE, "pipeline-runner")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setattr(live, "pod_namespace", lambda: NAMESPACE)
    real = live.api_client
    monkeypatch.setattr(live, "api_client", lambda *a: real(str(kubeconfig)))
    report = dsl.Markdown(name="report", uri=str(tmp_path / "report"), metadata={})
    out = preflight.python_func(claim_template="shared-gpu-timeslice", on_missing_dra="skip",
                                report=report)
    assert out.decision == "ready" and "16 match, 16 free" in out.reason
    assert f"source: cluster {h100.cp.server}" in (tmp_path / "report").read_text()
    with pytest.raises(DrasliceError, match="preflight failed") as err:
        preflight.python_func(claim_template="mig-1g-10gb", on_missing_dra="skip", report=report)
    assert "nvidia-smi mig -cgi" in str(err.value)


# --- a real API server that does not serve resource.k8s.io/v1 ---------------------------------

@pytest.fixture(scope="module", params=[
    ("resource.k8s.io/v1=false", "no DRA"),
    ("resource.k8s.io/v1=false,resource.k8s.io/v1beta1=true", "v1beta1 only"),
], ids=lambda p: p[1])
def old_server(request, control_plane):
    """etcd and kube-apiserver alone (no controllers), with resource.k8s.io/v1 switched off."""
    work = Path(tempfile.mkdtemp(prefix="draslice-cp-nodra-"))
    cp = ControlPlane.start(control_plane.bin_dir, work, runtime_config=request.param[0],
                            full=False)
    yield cp, request.param[1]
    cp.stop()


@pytest.mark.parametrize("policy, code", [("skip", 77), ("fail", 1)])
def test_404_means_no_dra(old_server, policy, code):
    cp, _ = old_server
    got, output = _text(cp.admin_kubeconfig, "--profile", "1g.10gb", "--on-missing-dra", policy)
    assert got == code, output
    assert "does not serve resource.k8s.io/v1" in output


def test_404_names_the_versions_the_cluster_serves(old_server):
    cp, kind = old_server
    code, output = _text(cp.admin_kubeconfig, "--json")
    assert code == 77, output
    (note,) = json.loads(output)["notes"]
    if kind == "v1beta1 only":
        assert "it serves resource.k8s.io/v1beta1 only" in note
        assert "upgrade to Kubernetes 1.34+" in note
    else:
        assert "(Kubernetes < 1.34, or DRA disabled)" in note
