"""CRD objects (Kyverno, Kubeflow Trainer v2, Kueue): the fields their CRDs mark required.

No typed model package installs cleanly for these here (cloudcoil-models-kyverno needs
Python 3.14), so the checks name the required fields of each CRD schema and the references
between objects, and fail on an absent or empty one.
"""

from __future__ import annotations

import pytest

from draslice.cluster.manifests import admission, kueue, workloads
from draslice.cluster.names import CLAIM_LABEL

IMAGE = "registry.example.com/draslice/trainer:0.1.0"


def _get(doc, path: str):
    node = doc
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def require(doc: dict, *paths: str) -> None:
    missing = []
    for path in ("apiVersion", "kind", "metadata.name", *paths):
        try:
            value = _get(doc, path)
        except (KeyError, IndexError, TypeError):
            missing.append(path)
            continue
        if value in (None, "", [], {}):
            missing.append(path)
    assert not missing, f"{doc['kind']}: required fields missing or empty: {missing}"


def test_require_fails_on_a_missing_field():
    with pytest.raises(AssertionError, match="spec.runtimeRef.name"):
        require({"apiVersion": "v", "kind": "TrainJob", "metadata": {"name": "x"},
                 "spec": {"runtimeRef": {}}}, "spec.runtimeRef.name")


def test_kyverno_mutating_policy():
    (doc,) = admission.admission_policy("kyverno")
    assert doc["apiVersion"] == "policies.kyverno.io/v1" and doc["kind"] == "MutatingPolicy"
    require(doc, "spec.matchConstraints.resourceRules", "spec.mutations.0.patchType",
            "spec.mutations.0.jsonPatch.expression")
    for cond in doc["spec"]["matchConditions"] + doc["spec"]["variables"]:
        assert cond["name"] and cond["expression"]
    assert doc["spec"]["failurePolicy"] == "Fail"
    evaluation = doc["spec"]["evaluation"]
    assert evaluation["admission"]["enabled"] is True
    assert evaluation["background"]["enabled"] is False
    assert evaluation["mutateExisting"]["enabled"] is False
    assert doc["spec"]["autogen"]["podControllers"]["controllers"] == []  # pods only


def test_kyverno_cluster_policy():
    (doc,) = admission.admission_policy("kyverno-clusterpolicy")
    assert doc["apiVersion"] == "kyverno.io/v1" and doc["kind"] == "ClusterPolicy"
    require(doc, "spec.rules.0.name", "spec.rules.0.match.any.0.resources.kinds",
            "spec.rules.0.mutate.patchStrategicMerge")
    for cond in doc["spec"]["rules"][0]["preconditions"]["all"]:
        assert set(cond) == {"key", "operator", "value"}
        assert cond["operator"] in {"GreaterThan", "AnyNotIn"}
    assert CLAIM_LABEL in str(doc["spec"]["rules"][0]["mutate"])


def test_trainer_runtime_and_trainjob():
    runtime, job = workloads.workloads("mig-1g-6gb", IMAGE, "team-a")["trainjob"]
    assert runtime["apiVersion"] == job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    require(runtime, "spec.template.spec.replicatedJobs.0.name",
            "spec.template.spec.replicatedJobs.0.template.spec.template.spec.containers")
    require(job, "spec.runtimeRef.name")
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert job["metadata"]["namespace"] == runtime["metadata"]["namespace"] == "team-a"
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]
    # The seed's two DRA hooks, and no device-plugin limit.
    assert pod["resourceClaims"] == [{"name": "mig-1g-6gb",
                                      "resourceClaimTemplateName": "mig-1g-6gb"}]
    (node,) = pod["containers"]
    assert node["name"] == "node" and node["image"] == IMAGE
    assert node["resources"] == {"claims": [{"name": "mig-1g-6gb"}]}
    assert node["command"] == list(workloads.TORCHRUN) and node["command"][-2:] == ["draslice",
                                                                                      "train"]
    assert "nvidia.com/gpu" not in str(runtime)


def test_kueue_objects_reference_each_other():
    flavor, cq, lq = kueue.queues("team-a", "gpu-q", mig_slices=8, shared_gpus=1)
    require(flavor)
    require(cq, "spec.resourceGroups.0.coveredResources", "spec.resourceGroups.0.flavors.0.name",
            "spec.resourceGroups.0.flavors.0.resources.0.name")
    require(lq, "spec.clusterQueue", "metadata.namespace")
    group = cq["spec"]["resourceGroups"][0]
    (fl,) = group["flavors"]
    assert fl["name"] == flavor["metadata"]["name"]
    assert [r["name"] for r in fl["resources"]] == group["coveredResources"]
    quota = {r["name"]: r["nominalQuota"] for r in fl["resources"]}
    assert quota[kueue.MIG_RESOURCE] == 8 and quota[kueue.SHARED_RESOURCE] == 1
    assert lq["spec"]["clusterQueue"] == cq["metadata"]["name"]
    assert lq["metadata"] == {"name": "gpu-q", "namespace": "team-a"}


def test_kueue_configuration_maps_every_quota_resource_to_our_device_classes():
    config = kueue.configuration_fragment()
    mappings = config["resources"]["deviceClassMappings"]
    for m in mappings:
        assert m["name"] and m["deviceClassNames"]
    covered = kueue.queues("x")[1]["spec"]["resourceGroups"][0]["coveredResources"]
    assert {m["name"] for m in mappings} <= set(covered)
    assert {c for m in mappings for c in m["deviceClassNames"]} == {
        "mig.nvidia.com", "gpu.nvidia.com"}
    # A DeviceClass may appear in one mapping only (Kueue rejects the Configuration otherwise).
    classes = [c for m in mappings for c in m["deviceClassNames"]]
    assert len(classes) == len(set(classes))
