"""The admission policy's CEL, run on sample pods: the mutated pod equals the native-mode pod."""

from __future__ import annotations

import copy

import pytest

from draslice.cluster.manifests import admission
from draslice.cluster.manifests.podclaim import with_claim
from draslice.cluster.names import CLAIM_LABEL
from draslice.tests.manifests.admission_cel import PolicyRunner

TEMPLATE = "mig-1g-6gb"
CEL_ENGINES = ("map-v1", "map-v1beta1", "kyverno")


def _policy_spec(engine: str) -> dict:
    kind = "MutatingPolicy" if engine == "kyverno" else "MutatingAdmissionPolicy"
    return next(d for d in admission.admission_policy(engine) if d["kind"] == kind)["spec"]


@pytest.fixture(scope="module", params=CEL_ENGINES)
def runner(request) -> PolicyRunner:
    return PolicyRunner(_policy_spec(request.param))


def kfp_pod(labels: dict | None = None, containers: list[dict] | None = None) -> dict:
    """An executor pod as KFP 2.17 creates it (launcher init container, user code in main)."""
    meta: dict = {"name": "sft-abc-system-container-impl-1", "namespace": "kubeflow",
                  "annotations": {"pipelines.kubeflow.org/runtime-role": "launcher"}}
    if labels is not None:
        meta["labels"] = labels
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {
            "initContainers": [{"name": "kfp-launcher", "image": "launcher:2.17"}],
            "containers": containers if containers is not None else [
                {"name": "main", "image": "trainer", "resources": {"limits": {"cpu": "4"}}}
            ],
        },
    }


def native(pod: dict, template: str = TEMPLATE) -> dict:
    out = copy.deepcopy(pod)
    out["spec"] = with_claim(pod["spec"], template)
    return out


def test_labelled_pod_becomes_the_native_mode_pod(runner):
    pod = kfp_pod({CLAIM_LABEL: TEMPLATE, "pipelines.kubeflow.org/v2_component": "true"})
    result = runner.admit(pod)
    assert result.matched
    assert result.pod == native(pod)
    assert result.pod["spec"]["resourceClaims"] == [
        {"name": TEMPLATE, "resourceClaimTemplateName": TEMPLATE}]
    assert result.pod["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "4"}, "claims": [{"name": TEMPLATE}]}
    assert result.pod["spec"]["initContainers"] == pod["spec"]["initContainers"]


def test_template_comes_from_the_label(runner):
    pod = kfp_pod({CLAIM_LABEL: "shared-gpu-timeslice"})
    assert runner.admit(pod).pod == native(pod, "shared-gpu-timeslice")


def test_main_without_resources_and_not_first(runner):
    pod = kfp_pod({CLAIM_LABEL: TEMPLATE}, containers=[
        {"name": "sidecar", "image": "s", "resources": {"claims": [{"name": "other"}]}},
        {"name": "main", "image": "trainer"},
    ])
    result = runner.admit(pod)
    assert result.pod == native(pod)
    assert result.pod["spec"]["containers"][0] == pod["spec"]["containers"][0]  # untouched
    assert result.pod["spec"]["containers"][1]["resources"] == {"claims": [{"name": TEMPLATE}]}


def test_existing_pod_claims_are_kept(runner):
    pod = kfp_pod({CLAIM_LABEL: TEMPLATE})
    pod["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimTemplateName": "rdma"}]
    result = runner.admit(pod)
    assert result.pod["spec"]["resourceClaims"] == [
        {"name": "nic", "resourceClaimTemplateName": "rdma"},
        {"name": TEMPLATE, "resourceClaimTemplateName": TEMPLATE},
    ]
    assert result.pod == native(pod)


@pytest.mark.parametrize("labels", [None, {}, {"app": "x"}, {CLAIM_LABEL: ""}],
                         ids=["no-labels", "empty-labels", "other-label", "empty-value"])
def test_unlabelled_pod_is_not_touched(runner, labels):
    result = runner.admit(kfp_pod(labels))
    assert not result.matched and result.patches == []


def test_pod_without_main_container_is_not_touched(runner):
    pod = kfp_pod({CLAIM_LABEL: TEMPLATE}, containers=[{"name": "driver", "image": "d"}])
    assert not runner.admit(pod).matched


def test_already_claimed_pod_is_skipped_and_mutation_is_idempotent(runner):
    claimed = native(kfp_pod({CLAIM_LABEL: TEMPLATE}))
    assert not runner.admit(claimed).matched
    # Even if the policy ran again (reinvocation), its patch would add nothing.
    assert runner.patches(claimed) == []


def test_half_claimed_pod_is_completed_without_duplicates(runner):
    pod = kfp_pod({CLAIM_LABEL: TEMPLATE})
    pod["spec"]["resourceClaims"] = [{"name": TEMPLATE, "resourceClaimTemplateName": TEMPLATE}]
    result = runner.admit(pod)
    assert result.matched
    assert result.pod == native(pod)
    assert len(result.pod["spec"]["resourceClaims"]) == 1


def test_twice_through_the_policy_equals_once(runner):
    once = runner.admit(kfp_pod({CLAIM_LABEL: TEMPLATE})).pod
    assert runner.admit(once).pod == once


def test_scope_is_opt_in_namespaces_pod_create_labelled_fail_closed():
    for engine in ("map-v1", "map-v1beta1", "kyverno"):
        spec = _policy_spec(engine)
        mc = spec["matchConstraints"]
        assert mc["resourceRules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                                        "operations": ["CREATE"], "resources": ["pods"]}]
        assert mc["namespaceSelector"] == {
            "matchLabels": {admission.OPT_IN_LABEL: admission.OPT_IN_VALUE}}
        assert mc["objectSelector"]["matchExpressions"] == [
            {"key": CLAIM_LABEL, "operator": "Exists"}]
        assert spec["failurePolicy"] == "Fail"
    binding = admission.admission_policy("map-v1")[1]
    assert binding["kind"] == "MutatingAdmissionPolicyBinding"
    assert binding["spec"]["policyName"] == admission.NAME


def test_kyverno_cluster_policy_scope():
    (policy,) = admission.admission_policy("kyverno-clusterpolicy")
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["rules"]
    res = rule["match"]["any"][0]["resources"]
    assert res["kinds"] == ["Pod"] and res["operations"] == ["CREATE"]
    assert res["namespaceSelector"]["matchLabels"] == {
        admission.OPT_IN_LABEL: admission.OPT_IN_VALUE}
    patch = rule["mutate"]["patchStrategicMerge"]["spec"]
    assert patch["containers"][0]["(name)"] == "main"
    assert patch["resourceClaims"][0]["name"] == patch["resourceClaims"][0][
        "resourceClaimTemplateName"] == patch["containers"][0]["resources"]["claims"][0]["name"]


def test_a_typo_in_the_cel_fails_to_compile():
    """The runner is a real compiler: a broken expression is an error, not a skip."""
    spec = copy.deepcopy(_policy_spec("map-v1"))
    spec["matchConditions"][0]["expression"] = "object.metadata.labels[["
    with pytest.raises(Exception, match="(?i)syntax|parse|mismatched"):
        PolicyRunner(spec)
