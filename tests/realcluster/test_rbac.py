"""(d) The RBAC draslice installs (manifests/20-rbac.yaml) on the real API server: KFP's
pipeline-runner service account can run `draslice preflight` live, and real
SubjectAccessReviews (and real requests with its token) show it cannot create pods, read
secrets or change ResourceSlices.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from draslice.tests.realcluster.conftest import NAMESPACE, publish
from draslice.tests.realcluster.kube import KubeError
from draslice.tests.realcluster.scenarios import committed_templates, publishable

REPO = Path(__file__).resolve().parents[2]
SA = "pipeline-runner"
USER = f"system:serviceaccount:{NAMESPACE}:{SA}"
GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
          "system:authenticated"]


@pytest.fixture(scope="module")
def runner(cluster):
    from draslice.tests.cluster.conftest import load_fixture_objects

    cluster.reset()
    for doc in yaml.safe_load_all((REPO / "manifests" / "20-rbac.yaml").read_text()):
        if doc:
            cluster.admin.apply(doc)
    for template in committed_templates():
        cluster.admin.apply(template)
    cluster.admin.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": SA, "namespace": NAMESPACE}})
    publish(cluster, [publishable(o) for o in
                      load_fixture_objects("h100-80gb-x8-two-nodes.k8s-1.35.list.yaml")])
    kube, kubeconfig = cluster.cp.as_service_account(NAMESPACE, SA)
    yield kube, kubeconfig
    cluster.reset()


def test_preflight_runs_live_as_the_pipeline_runner(runner, preflight):
    _, kubeconfig = runner
    code, report, output = preflight("--template", "shared-gpu-timeslice", "-n", NAMESPACE,
                                     kubeconfig=kubeconfig)
    assert code == 0, output
    assert report["decision"] == "ready"
    assert (report["requests"][0]["matching"], report["requests"][0]["free"]) == (16, 16)
    # claims are read in its namespace only: the RBAC grants no cluster-wide claim list
    assert any("claims read in namespace kubeflow only" in n for n in report["notes"])


def _allowed(cluster, verb: str, resource: str, group: str = "", namespace: str | None = None,
             name: str | None = None) -> bool:
    attrs = {"verb": verb, "resource": resource, "group": group}
    if namespace:
        attrs["namespace"] = namespace
    if name:
        attrs["name"] = name
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "metadata": {"name": None},
              "spec": {"user": USER, "groups": GROUPS, "resourceAttributes": attrs}}
    return cluster.admin.create(review)["status"]["allowed"]


DENIED = [
    ("create", "pods", "", NAMESPACE),
    ("create", "pods", "", "default"),
    ("get", "secrets", "", NAMESPACE),
    ("list", "secrets", "", NAMESPACE),
    ("list", "secrets", "", None),
    ("create", "resourceslices", "resource.k8s.io", None),
    ("update", "resourceslices", "resource.k8s.io", None),
    ("patch", "resourceslices", "resource.k8s.io", None),
    ("delete", "resourceslices", "resource.k8s.io", None),
    ("deletecollection", "resourceslices", "resource.k8s.io", None),
    ("create", "resourceclaims", "resource.k8s.io", NAMESPACE),
    ("update", "deviceclasses", "resource.k8s.io", None),
    ("list", "resourceclaims", "resource.k8s.io", None),  # cluster-wide: not granted
]
ALLOWED = [  # the control: what preflight reads is granted, so the denials above are not a
    ("list", "deviceclasses", "resource.k8s.io", None),  # review that denies everything
    ("list", "resourceslices", "resource.k8s.io", None),
    ("watch", "resourceslices", "resource.k8s.io", None),
    ("list", "resourceclaims", "resource.k8s.io", NAMESPACE),
    ("get", "resourceclaimtemplates", "resource.k8s.io", NAMESPACE),
]


@pytest.mark.parametrize("verb, resource, group, namespace", DENIED,
                         ids=lambda v: v or "cluster")
def test_subject_access_review_denies(cluster, runner, verb, resource, group, namespace):
    assert _allowed(cluster, verb, resource, group, namespace) is False


@pytest.mark.parametrize("verb, resource, group, namespace", ALLOWED,
                         ids=lambda v: v or "cluster")
def test_subject_access_review_allows_what_preflight_reads(cluster, runner, verb, resource,
                                                           group, namespace):
    assert _allowed(cluster, verb, resource, group, namespace) is True


def test_its_token_is_refused_by_the_server(runner, cluster):
    """The same account's own requests: 403 on each forbidden verb."""
    kube, _ = runner
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": NAMESPACE},
           "spec": {"containers": [{"name": "main", "image": "registry.invalid/x"}]}}
    slice_name = cluster.admin.list("ResourceSlice")[0]["metadata"]["name"]
    attempts = [
        lambda: kube.create(pod),
        lambda: kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets"),
        lambda: kube.request("PATCH", kube.path("ResourceSlice", slice_name),
                             {"metadata": {"labels": {"x": "y"}}},
                             content_type="application/merge-patch+json"),
        lambda: kube.delete("ResourceSlice", slice_name, missing_ok=False),
    ]
    for attempt in attempts:
        with pytest.raises(KubeError) as err:
            attempt()
        assert err.value.status == 403, err.value
        assert USER in err.value.message
