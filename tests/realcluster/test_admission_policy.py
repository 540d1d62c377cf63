"""(b) The MutatingAdmissionPolicy draslice installs (manifests/30-admission-policy.map-v1.yaml)
run by the real API server on pods built as KFP 2.17 builds them on Argo.

Each task of each policy-mode pipeline in compiled/ that KFP 2.17.0's Workflow runs on the
shared ``metadata-0-1-system-container-impl`` template becomes a pod (tests/kfp_workflow.py):
the label arrives through the task's Argo parameters substituted into that template's
metadata, with Argo's ``init`` and ``wait`` containers, KFP's launcher init container and the
user container ``main`` whose image the driver's pod spec patch sets. The server's answer to
creating it (dry run, so nothing is scheduled) must equal its answer for the pod native mode
asks for (the same pod with the claim already in it), and native mode's own file must name the
same template. Pods the policy must not touch, and a policy broken on purpose (fail closed),
are checked the same way.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from draslice.cluster.manifests.podclaim import with_claim
from draslice.cluster.names import CLAIM_LABEL
from draslice.tests import kfp_workflow
from draslice.tests.realcluster.kube import KubeError

REPO = Path(__file__).resolve().parents[2]
POLICY_FILE = REPO / "manifests" / "30-admission-policy.map-v1.yaml"
OPTED_IN, NOT_OPTED_IN = "kfp-policy-on", "kfp-policy-off"


def _policy_docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]


def _executors(path: Path) -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    platform = next((d for d in docs if "platforms" in d), {})
    return platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get(
        "executors", {})


def _images(path: Path) -> dict[str, str]:
    spec = next(d for d in yaml.safe_load_all(path.read_text()) if d and "deploymentSpec" in d)
    return {name: e["container"]["image"]
            for name, e in spec["deploymentSpec"]["executors"].items() if "container" in e}


def labelled_tasks() -> list[tuple[str, str]]:
    """(file, task) for every task of a policy file that runs the labelled executor template."""
    return [(path.name, task) for path in sorted((REPO / "compiled").glob("*.policy.*.yaml"))
            for task in kfp_workflow.labelled_tasks(path)]


kfp_argo_pod = kfp_workflow.argo_pod
LIMITS = {"limits": {"cpu": "4", "memory": "16Gi"}}  # limits a task may set; the policy keeps them


def _normal(pod: dict) -> dict:
    """The pod without what differs between two creations (uid, times, token volume name)."""
    pod = copy.deepcopy(pod)
    for key in ("uid", "creationTimestamp", "resourceVersion", "generation", "managedFields"):
        pod["metadata"].pop(key, None)
    return yaml.safe_load(re.sub(r"kube-api-access-[a-z0-9]+", "kube-api-access",
                                 yaml.safe_dump(pod)))


@pytest.fixture(scope="module")
def admission(cluster):
    kube = cluster.admin
    for ns, labels in ((OPTED_IN, {"draslice.dev/claim-injection": "enabled"}),
                       (NOT_OPTED_IN, {})):
        kube.apply({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": ns, "labels": labels}})
        kube.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "pipeline-runner", "namespace": ns}})
    for doc in _policy_docs():
        kube.apply(doc)
    _wait_mutating(kube)
    yield kube
    for doc in _policy_docs():
        kube.delete(doc["kind"], doc["metadata"]["name"])


def _probe(kube, namespace: str = OPTED_IN, labels: dict | None = None) -> dict:
    return kube.create(kfp_argo_pod("probe", namespace, labels or {CLAIM_LABEL: "mig-1g-6gb"},
                                    "trainer:probe"), dry_run=True)


def _wait_mutating(kube) -> None:
    kube.wait("the admission policy to mutate a labelled pod",
              lambda: _probe(kube)["spec"].get("resourceClaims"), timeout=60)


def _wait_rejecting(kube) -> KubeError:
    def rejected():
        try:
            _probe(kube)
        except KubeError as exc:
            if exc.status in (400, 403, 422, 500):
                return exc
            raise
        return None

    return kube.wait("the broken policy to reject a labelled pod", rejected, timeout=60)


@pytest.mark.parametrize("file, task", labelled_tasks(), ids=lambda v: v)
def test_a_kfp_pod_becomes_the_native_mode_pod(admission, file, task):
    wf = kfp_workflow.workflow(REPO / "compiled" / file)
    pod = kfp_workflow.executor_pod(wf, task, f"sft-abc12-{task}-system-container-impl-1",
                                    OPTED_IN, LIMITS)
    template = pod["metadata"]["labels"][CLAIM_LABEL]
    native_file = REPO / "compiled" / file.replace(".policy.", ".native.")
    if native_file.exists():  # the canary is compiled in policy mode only
        native_claims = _executors(native_file)[f"exec-{task}"]["podResourceClaims"]
        assert native_claims == [{"resourceClaimTemplateName": template}], native_file.name

    mutated = admission.create(pod, dry_run=True)
    native = copy.deepcopy(pod)
    native["spec"] = with_claim(pod["spec"], template)
    expected = admission.create(native, dry_run=True)  # the policy leaves a claimed pod alone
    assert _normal(mutated) == _normal(expected)

    spec = mutated["spec"]
    assert spec["resourceClaims"] == [{"name": template, "resourceClaimTemplateName": template}]
    containers = {c["name"]: c for c in spec["containers"]}
    assert containers["main"]["resources"]["claims"] == [{"name": template}]
    assert containers["main"]["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
    assert "claims" not in containers["wait"].get("resources", {})
    assert all("claims" not in c.get("resources", {}) for c in spec["initContainers"])


def test_unlabelled_pods_and_namespaces_not_opted_in_are_untouched(admission):
    unlabelled = _probe(admission, OPTED_IN, labels={"app": "other"})
    assert "resourceClaims" not in unlabelled["spec"]
    not_opted_in = _probe(admission, NOT_OPTED_IN)
    assert "resourceClaims" not in not_opted_in["spec"]
    assert all("claims" not in c.get("resources", {}) for c in not_opted_in["spec"]["containers"])


def test_a_pod_that_already_has_the_claim_is_left_as_it_is(admission):
    pod = kfp_argo_pod("claimed", OPTED_IN, {CLAIM_LABEL: "mig-1g-6gb"}, "trainer:probe")
    pod["spec"] = with_claim(pod["spec"], "mig-1g-6gb")
    pod["spec"]["containers"][1]["resources"]["claims"].insert(0, {"name": "other"})
    pod["spec"]["resourceClaims"].insert(0, {"name": "other",
                                             "resourceClaimTemplateName": "other"})
    stored = admission.create(pod, dry_run=True)
    outside = copy.deepcopy(pod)  # the same pod where no policy applies
    outside["metadata"]["namespace"] = NOT_OPTED_IN
    unpolicied = admission.create(outside, dry_run=True)
    unpolicied["metadata"]["namespace"] = OPTED_IN
    assert _normal(stored) == _normal(unpolicied)
    assert stored["spec"]["resourceClaims"] == pod["spec"]["resourceClaims"]


def _broken(change) -> list[dict]:
    docs = copy.deepcopy(_policy_docs())
    change(*docs)
    return docs


def _expression_error(policy, binding):
    for var in policy["spec"]["variables"]:
        if var["name"] == "template":  # a label no pod has: an evaluation error
            var["expression"] = 'object.metadata.labels["draslice.dev/no-such-label"]'


def _missing_parameter(policy, binding):
    policy["spec"]["paramKind"] = {"apiVersion": "v1", "kind": "ConfigMap"}
    binding["spec"]["paramRef"] = {"name": "draslice-claim-params", "namespace": OPTED_IN,
                                   "parameterNotFoundAction": "Deny"}


@pytest.mark.parametrize("break_it", [_expression_error, _missing_parameter],
                         ids=["expression-error", "missing-parameter"])
def test_a_broken_policy_fails_closed(admission, break_it):
    """Never admitted without its claim: a labelled pod is refused while the policy is broken,
    and pods the policy does not select are still admitted."""
    try:
        for doc in _broken(break_it):
            admission.apply(doc)
        err = _wait_rejecting(admission)
        print(f"refused: {err}")  # shown with -rP
        assert "draslice-claim-from-label" in err.message, err.message
        unlabelled = _probe(admission, OPTED_IN, labels={"app": "other"})
        assert "resourceClaims" not in unlabelled["spec"]
    finally:
        for doc in _policy_docs():
            admission.apply(doc)
        _wait_mutating(admission)
