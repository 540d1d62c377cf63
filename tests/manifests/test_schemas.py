"""Every rendered Kubernetes object validated strictly against the official OpenAPI schemas.

Kubernetes 1.34, 1.35, 1.36 and 1.37 (PyPI kubernetes-validate, strict: unknown fields fail)
wherever the kind exists in that release; the MutatingAdmissionPolicy v1 exists from 1.36 only,
which is why v1beta1 is rendered too.
"""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml

from draslice.cluster.manifests import admission, committed, kueue, rbac, workloads
from draslice.cluster.manifests.claim_templates import claim_templates, sharing_from_options

VERSIONS = ("1.34", "1.35", "1.36", "1.37")
IMAGE = "registry.example.com/draslice/trainer:0.1.0"
CRD_GROUPS = ("kyverno.io", "trainer.kubeflow.org", "kueue.x-k8s.io")


def _rendered() -> list[tuple[str, dict]]:
    docs: list[tuple[str, dict]] = []
    for name, text in committed.files(IMAGE).items():
        docs += [(name, d) for d in yaml.safe_load_all(text)]
    extra = claim_templates(
        ["1g.10gb+me", "4g.40gb"],
        [sharing_from_options("timeslicing", interval="Long"),
         sharing_from_options("mps", active_thread_percentage=30, pinned_memory_limit="4096Mi")],
        "team-a", [1, 8, 32],
    )
    extra += rbac.rbac("team-a", "default-editor")
    for purpose in workloads.workloads("shared-gpu-mps", IMAGE, "team-a").values():
        extra += purpose
    docs += [("variants", d) for d in extra]
    return docs


RENDERED = _rendered()
BUILTIN = [(n, d) for n, d in RENDERED
           if not any(d["apiVersion"].split("/")[0].endswith(g) for g in CRD_GROUPS)
           and d["kind"] != "Configuration"]


def _validate(doc: dict, version: str) -> bool:
    """True when valid, False when the kind does not exist in ``version``; raises if invalid."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return False
    return True


@pytest.mark.parametrize(("source", "doc"), BUILTIN,
                         ids=[f"{n}:{d['kind']}:{d['metadata']['name']}" for n, d in BUILTIN])
def test_valid_in_every_release_that_has_the_kind(source, doc):
    known = [v for v in VERSIONS if _validate(doc, v)]
    expected = ["1.36", "1.37"] if doc["apiVersion"] == admission.MAP_APIS["map-v1"] else VERSIONS
    assert known == list(expected), f"{source}: {doc['kind']} known in {known}"


def test_every_builtin_kind_is_covered():
    kinds = {d["kind"] for _, d in BUILTIN}
    assert kinds == {
        "ResourceClaimTemplate", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "Pod", "Job",
    }


@pytest.mark.parametrize("path", [("spec", "spec", "devices", "requests", 0, "exactly", "colour"),
                                  ("spec", "matchConstraints", "labelSelector")],
                         ids=["claim-template", "admission-policy"])
def test_validation_is_strict_unknown_fields_fail(path):
    """Proves the check can fail: one unknown field anywhere makes the object invalid."""
    source = (claim_templates(["1g.6gb"])[0] if path[1] == "spec"
              else admission.admission_policy("map-v1")[0])
    doc = copy.deepcopy(source)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, "1.36", strict=True)


def test_kueue_api_is_the_one_stated():
    assert {d["apiVersion"] for d in kueue.queues("kubeflow")} == {kueue.KUEUE_API}
