"""How a GPU task's pod gets its DRA claim: the one place that decides it.

Two modes, one resulting pod (docs/design.md):

- ``policy`` (default, any KFP 2.x backend): the task gets the pod label
  ``draslice.dev/claim-template: <template>`` through kfp-kubernetes (it lands on executor
  pods only), and a cluster admission policy adds ``spec.resourceClaims`` and the ``main``
  container's ``resources.claims`` at pod CREATE.
- ``native`` (KFP backends that ship kubeflow/pipelines#14243): the executor's platform spec
  gets ``podResourceClaims: [{resourceClaimTemplateName: <template>}]``, the shape upstream's
  ``kfp.kubernetes.add_resource_claim`` emits. A KFP 2.17 backend accepts the upload but
  rejects the run ("unknown field podResourceClaims"), so this is never the default.

Either way the pod claim is named after the template and ``main`` consumes it; no
``nvidia.com/gpu`` limit is set anywhere.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from draslice.cluster.manifests.kueue import QUEUE_LABEL, check_queue_name
from draslice.cluster.names import CLAIM_LABEL, NATIVE_FIELD, validate_template_name
from draslice.errors import InvalidParameter

if TYPE_CHECKING:  # kfp is imported where a claim is bound, not for ClaimMode
    from kfp.dsl import PipelineTask

__all__ = ["CLAIM_LABEL", "NATIVE_FIELD", "QUEUE_LABEL", "ClaimMode", "bind_claim"]


class ClaimMode(StrEnum):
    POLICY = "policy"
    NATIVE = "native"

    @classmethod
    def parse(cls, value: str | ClaimMode) -> ClaimMode:
        try:
            return cls(value)
        except ValueError as err:
            raise InvalidParameter(
                "claim_mode", value, "must be 'policy' (any KFP 2.x) or 'native' (KFP with #14243)"
            ) from err


def bind_claim(
    task: PipelineTask, template: str, mode: str | ClaimMode, *, kueue_queue: str | None = None
) -> PipelineTask:
    """Give ``task``'s pod the claim on ``template`` in ``mode``.

    With ``kueue_queue`` the pod also gets the label ``kueue.x-k8s.io/queue-name``, so Kueue
    admits it against the queue's quota on slices (``draslice compile --kueue-queue``).

    Call it last among a task's kfp-kubernetes settings: in native mode it writes a field the
    released kfp-kubernetes protos do not know, and they refuse to re-read it.
    """
    from kfp import kubernetes

    validate_template_name(template)
    mode = ClaimMode.parse(mode)
    if kueue_queue is not None:
        kubernetes.add_pod_label(task, QUEUE_LABEL, check_queue_name(kueue_queue))
    if mode is ClaimMode.POLICY:
        return kubernetes.add_pod_label(task, CLAIM_LABEL, template)
    config = task.platform_config.setdefault("kubernetes", {})
    claims = config.setdefault(NATIVE_FIELD, [])
    entry = {"resourceClaimTemplateName": template}
    if entry not in claims:
        claims.append(entry)
    return task
