"""The claim as it must appear in a pod: the contract both claim modes meet.

``native`` mode (KFP's driver with kubeflow/pipelines#14243) and ``policy`` mode (the admission
policy in :mod:`.admission`) must both produce this pod, and the workloads for users outside
KFP (:mod:`.workloads`) are built with it, so a smoke Pod, a Job and a KFP task pod claim a
slice the same way:

- ``spec.resourceClaims``: ``{name: <template>, resourceClaimTemplateName: <template>}``;
- the consuming container: ``resources.claims: [{name: <template>}]``;
- no ``nvidia.com/gpu`` limit anywhere.
"""

from __future__ import annotations

import copy

from draslice.cluster.names import MAIN_CONTAINER, validate_template_name


def with_claim(pod_spec: dict, template: str, container: str = MAIN_CONTAINER) -> dict:
    """A copy of ``pod_spec`` whose ``container`` consumes a per-pod claim on ``template``.

    Idempotent: an entry already there is not added again.
    """
    validate_template_name(template)
    spec = copy.deepcopy(pod_spec)
    names = [c.get("name") for c in spec.get("containers", [])]
    if container not in names:
        raise ValueError(f"pod has no container {container!r} (containers: {names})")
    claims = spec.setdefault("resourceClaims", [])
    if not any(c.get("name") == template for c in claims):
        claims.append({"name": template, "resourceClaimTemplateName": template})
    target = spec["containers"][names.index(container)]
    consumed = target.setdefault("resources", {}).setdefault("claims", [])
    if not any(c.get("name") == template for c in consumed):
        consumed.append({"name": template})
    return spec
