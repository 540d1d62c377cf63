"""The admission policy for ``policy`` claim mode: it gives labelled task pods their claim.

KFP 2.17 cannot put a DRA claim on a task pod, so draslice labels GPU task pods with
``draslice.dev/claim-template: <template>`` and this policy, at pod CREATE, adds exactly what
``native`` mode would have written (:func:`.podclaim.with_claim`):
``spec.resourceClaims: [{name: T, resourceClaimTemplateName: T}]`` and, on the container
``main`` only, ``resources.claims: [{name: T}]``.

Scope, in every engine:

- namespaces that opt in with the label ``draslice.dev/claim-injection: enabled``;
- pods, on CREATE only;
- pods that carry the claim-template label and have a container ``main``;
- idempotent: a claim already there is not added again, and a pod that has both parts is
  skipped by a match condition;
- failurePolicy Fail: a labelled pod must never start without its GPU.

Engines: MutatingAdmissionPolicy ``admissionregistration.k8s.io/v1`` (Kubernetes 1.36+) or
``v1beta1`` (1.34-1.35, feature gate ``MutatingAdmissionPolicy`` and
``--runtime-config=admissionregistration.k8s.io/v1beta1=true``); Kyverno ``MutatingPolicy``
(``policies.kyverno.io/v1``; releases that serve only ``v1beta1`` need that apiVersion) with
the same CEL; Kyverno ``ClusterPolicy`` (``kyverno.io/v1``, with ``operations`` in match:
Kyverno 1.10+) for older installs.

The mutation is a JSONPatch built in CEL (not an ApplyConfiguration): it can append to lists
that may be absent and leave every other container and claim alone.
"""

from __future__ import annotations

from draslice.cluster.names import CLAIM_LABEL, MAIN_CONTAINER
from draslice.errors import InvalidParameter

NAME = "draslice-claim-from-label"
OPT_IN_LABEL = "draslice.dev/claim-injection"
OPT_IN_VALUE = "enabled"
ENGINES = ("map-v1", "map-v1beta1", "kyverno", "kyverno-clusterpolicy")
MAP_APIS = {"map-v1": "admissionregistration.k8s.io/v1",
            "map-v1beta1": "admissionregistration.k8s.io/v1beta1"}
KYVERNO_MUTATING_API = "policies.kyverno.io/v1"
KYVERNO_CLUSTERPOLICY_API = "kyverno.io/v1"

_TEMPLATE = f'object.metadata.labels["{CLAIM_LABEL}"]'
_MAIN = f'c.name == "{MAIN_CONTAINER}"'

# Evaluated before the policy's variables exist, so each is self-contained.
MATCH_CONDITIONS: list[dict] = [
    {"name": "has-claim-template-label",
     "expression": f'has(object.metadata.labels) && "{CLAIM_LABEL}" in object.metadata.labels'
                   f' && {_TEMPLATE} != ""'},
    {"name": "has-main-container",
     "expression": f"object.spec.containers.exists(c, {_MAIN})"},
    {"name": "not-claimed-yet",
     "expression": (
         f"!(\n"
         f"  has(object.spec.resourceClaims) &&\n"
         f"  object.spec.resourceClaims.exists(rc, rc.name == {_TEMPLATE}) &&\n"
         f"  object.spec.containers.exists(c, {_MAIN} &&\n"
         f"    has(c.resources) && has(c.resources.claims) &&\n"
         f"    c.resources.claims.exists(k, k.name == {_TEMPLATE}))\n"
         f")\n"
     )},
]

VARIABLES: list[dict] = [
    {"name": "template", "expression": _TEMPLATE},
    {"name": "mainIndex",
     "expression": f'object.spec.containers.map(c, c.name).indexOf("{MAIN_CONTAINER}")'},
    {"name": "main", "expression": "object.spec.containers[variables.mainIndex]"},
    {"name": "mainPath", "expression": '"/spec/containers/" + string(variables.mainIndex)'},
    {"name": "podClaimed",
     "expression": "has(object.spec.resourceClaims) &&\n"
                   "object.spec.resourceClaims.exists(rc, rc.name == variables.template)\n"},
    {"name": "mainClaimed",
     "expression": "has(variables.main.resources) && has(variables.main.resources.claims) &&\n"
                   "variables.main.resources.claims.exists(k, k.name == variables.template)\n"},
]

# Each part is added only when missing, so running it twice changes nothing (reinvocation).
PATCH_EXPRESSION = """\
(has(object.spec.resourceClaims) ? [] : [
  JSONPatch{op: "add", path: "/spec/resourceClaims", value: []}
]) +
(variables.podClaimed ? [] : [
  JSONPatch{op: "add", path: "/spec/resourceClaims/-",
            value: {"name": variables.template, "resourceClaimTemplateName": variables.template}}
]) +
(has(variables.main.resources) ? [] : [
  JSONPatch{op: "add", path: variables.mainPath + "/resources", value: {}}
]) +
(has(variables.main.resources) && has(variables.main.resources.claims) ? [] : [
  JSONPatch{op: "add", path: variables.mainPath + "/resources/claims", value: []}
]) +
(variables.mainClaimed ? [] : [
  JSONPatch{op: "add", path: variables.mainPath + "/resources/claims/-",
            value: {"name": variables.template}}
])
"""


def _match_constraints() -> dict:
    return {
        "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"]}],
        "namespaceSelector": {"matchLabels": {OPT_IN_LABEL: OPT_IN_VALUE}},
        "objectSelector": {"matchExpressions": [{"key": CLAIM_LABEL, "operator": "Exists"}]},
    }


def _cel_spec() -> dict:
    return {
        "failurePolicy": "Fail",
        "matchConstraints": _match_constraints(),
        "matchConditions": [dict(c) for c in MATCH_CONDITIONS],
        "variables": [dict(v) for v in VARIABLES],
        "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": PATCH_EXPRESSION}}],
        "reinvocationPolicy": "IfNeeded",
    }


def mutating_admission_policy(api_version: str) -> list[dict]:
    """The MutatingAdmissionPolicy and the binding that turns it on."""
    return [
        {"apiVersion": api_version, "kind": "MutatingAdmissionPolicy",
         "metadata": {"name": NAME}, "spec": _cel_spec()},
        {"apiVersion": api_version, "kind": "MutatingAdmissionPolicyBinding",
         "metadata": {"name": NAME}, "spec": {"policyName": NAME}},
    ]


def kyverno_mutating_policy() -> list[dict]:
    """Kyverno's MutatingPolicy: the same CEL, no binding (Kyverno binds it itself).

    Admission only: no background scan, no mutation of existing pods, and no rules generated
    for pod controllers (Deployments, Jobs, ...): the policy is for pods, as the MAP is.
    """
    spec = _cel_spec()
    spec["evaluation"] = {"admission": {"enabled": True}, "background": {"enabled": False},
                          "mutateExisting": {"enabled": False}}
    spec["autogen"] = {"podControllers": {"controllers": []}}
    return [{"apiVersion": KYVERNO_MUTATING_API, "kind": "MutatingPolicy",
             "metadata": {"name": NAME}, "spec": spec}]


def kyverno_cluster_policy() -> list[dict]:
    """Kyverno's older ClusterPolicy: a strategic merge patch keyed by name.

    Lists merge by ``name`` (pod claims, containers, container claims), so a claim that is
    there already is not duplicated; a precondition skips pods that have it anyway.
    """
    template = "{{ request.object.metadata.labels.\"" + CLAIM_LABEL + "\" }}"
    rule = {
        "name": "claim-from-label",
        "match": {"any": [{"resources": {
            "kinds": ["Pod"],
            "operations": ["CREATE"],
            "namespaceSelector": {"matchLabels": {OPT_IN_LABEL: OPT_IN_VALUE}},
            "selector": {"matchExpressions": [{"key": CLAIM_LABEL, "operator": "Exists"}]},
        }}]},
        "preconditions": {"all": [
            {"key": "{{ length(request.object.spec.containers[?name == '"
                    + MAIN_CONTAINER + "']) }}",
             "operator": "GreaterThan", "value": 0},
            {"key": template, "operator": "AnyNotIn",
             "value": "{{ request.object.spec.resourceClaims[].name || `[]` }}"},
        ]},
        "mutate": {"patchStrategicMerge": {"spec": {
            "resourceClaims": [{"name": template, "resourceClaimTemplateName": template}],
            "containers": [{"(name)": MAIN_CONTAINER,
                            "resources": {"claims": [{"name": template}]}}],
        }}},
    }
    return [{"apiVersion": KYVERNO_CLUSTERPOLICY_API, "kind": "ClusterPolicy",
             "metadata": {"name": NAME},
             "spec": {"admission": True, "background": False, "failurePolicy": "Fail",
                      "rules": [rule]}}]


def admission_policy(engine: str) -> list[dict]:
    """The objects to apply for ``engine`` (one of :data:`ENGINES`)."""
    if engine in MAP_APIS:
        return mutating_admission_policy(MAP_APIS[engine])
    if engine == "kyverno":
        return kyverno_mutating_policy()
    if engine == "kyverno-clusterpolicy":
        return kyverno_cluster_policy()
    raise InvalidParameter(
        "engine", engine,
        "must be one of map-v1 (Kubernetes 1.36+), map-v1beta1 (1.34-1.35), kyverno "
        "(Kyverno MutatingPolicy, policies.kyverno.io/v1) or kyverno-clusterpolicy (Kyverno "
        "ClusterPolicy, older Kyverno)",
    )


def opt_in_command(namespace: str) -> str:
    """The command that lets the policy act in ``namespace``."""
    return f"kubectl label namespace {namespace} {OPT_IN_LABEL}={OPT_IN_VALUE}"
