"""(b) The MutatingAdmissionPolicy draslice installs (manifests/30-admission-policy.map-v1.yaml)
run by the real API server on pods built as KFP 2.17 builds them on Argo.

Each labelled executor of each policy-mode pipeline in compiled/ becomes a pod: its
``podMetadata`` labels, Argo's ``init`` and ``wait`` containers, KFP's launcher init container
and the user container ``main``. The server's answer to creating it (dry run, so nothing is
scheduled) must equal its answer for the pod native mode asks for (the same pod with the
claim already in it), and native mode's own file must name the same template. Pods the policy
must not touch, and a policy broken on purpose (fail closed), are checked the same way.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from draslice.cluster.manifests.podclaim import with_claim
from draslice.cluster.names import CLAIM_LABEL
from tests.realcluster.kube import KubeError

REPO = Path(__file__).resolve().parents[2]
POLICY_FILE = REPO / "manifests" / "30-admission-policy.map-v1.yaml"
OPTED_IN, NOT_OPTED_IN = "kfp-policy-on", "kfp-policy-off"
ARGOEXEC = "quay.io/argoproj/argoexec:v3.6.7"
LAUNCHER = "ghcr.io/kubeflow/kfp-launcher:2.17.0"


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


def labelled_executors() -> list[tuple[str, str, dict, str]]:
    """(file, executor, podMetadata labels, main image) for every labelled policy executor."""
    out = []
    for path in sorted((REPO / "compiled").glob("*.policy.*.yaml")):
        images = _images(path)
        for name, cfg in _executors(path).items():
            labels = (cfg.get("podMetadata") or {}).get("labels") or {}
            if CLAIM_LABEL in labels:
                out.append((path.name, name, labels, images[name]))
    return out


def kfp_argo_pod(name: str, namespace: str, labels: dict | None, image: str) -> dict:
    """An executor pod as KFP 2.17's Argo compiler and Argo make it."""
    meta = {"name": name, "namespace": namespace,
            "labels": {"pipelines.kubeflow.org/v2_component": "true",
                       "workflows.argoproj.io/completed": "false",
                       "workflows.argoproj.io/workflow": "sft-abc12", **(labels or {})},
            "annotations": {"pipelines.kubeflow.org/v2_pipeline": "true",
                            "workflows.argoproj.io/node-name": "sft-abc12.root.sft"}}
    mounts = [{"name": "var-run-argo", "mountPath": "/var/run/argo"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "serviceAccountName": "pipeline-runner",
        "initContainers": [
            {"name": "init", "image": ARGOEXEC, "command": ["argoexec", "init"],
             "volumeMounts": mounts},
            {"name": "kfp-launcher", "image": LAUNCHER,
             "command": ["launcher-v2", "--copy", "/kfp-launcher/launch"],
             "volumeMounts": [{"name": "kfp-launcher", "mountPath": "/kfp-launcher"}]},
        ],
        "containers": [
            {"name": "wait", "image": ARGOEXEC, "command": ["argoexec", "wait"],
             "volumeMounts": mounts},
            {"name": "main", "image": image,
             "command": ["/var/run/argo/argoexec", "emissary", "--", "/kfp-launcher/launch"],
             "resources": {"limits": {"cpu": "4", "memory": "16Gi"}},
             "volumeMounts": mounts + [{"name": "kfp-launcher", "mountPath": "/kfp-launcher"}]},
        ],
        "volumes": [{"name": "var-run-argo", "emptyDir": {}},
                    {"name": "kfp-launcher", "emptyDir": {}}],
        "restartPolicy": "Never",
    }}


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


@pytest.mark.parametrize("file, executor, labels, image", labelled_executors(),
                         ids=lambda v: v if isinstance(v, str) and "/" not in v else None)
def test_a_kfp_pod_becomes_the_native_mode_pod(admission, file, executor, labels, image):
    template = labels[CLAIM_LABEL]
    native_file = REPO / "compiled" / file.replace(".policy.", ".native.")
    if native_file.exists():  # the canary is compiled in policy mode only
        native_claims = _executors(native_file)[executor]["podResourceClaims"]
        assert native_claims == [{"resourceClaimTemplateName": template}], native_file.name

    pod = kfp_argo_pod("sft-abc12-system-container-impl-1", OPTED_IN, labels, image)
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
