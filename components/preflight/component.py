"""Preflight: decide whether the GPU steps can run, before a slice is claimed."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Markdown, Output

from draslice.components.image import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def preflight(
    claim_template: str,
    on_missing_dra: str,
    report: Output[Markdown],
    source: str = "auto",
    namespace: str = "",
) -> NamedTuple("PreflightOutputs", decision=str, reason=str):
    """Checks that the claim template can be allocated and outputs ``ready`` or ``skip``.

    Runs without a claim: it must be able to say "no slice" without holding one. In a task pod
    it reads the cluster's DeviceClasses, ResourceSlices and ResourceClaims and evaluates the
    template's selectors as the scheduler would; a run fails here, with the diagnosis, when no
    node can serve the claim.

    Args:
        claim_template: Name of the ResourceClaimTemplate the GPU steps claim.
        on_missing_dra: ``skip`` to skip the GPU steps when the cluster has no DRA GPU at all
            (the guide's e2e check does so on device-plugin-only clusters), ``fail`` to fail.
        report: Markdown the KFP UI shows: inventory, matches, decision and why.
        source: ``auto`` (read the cluster when running in a pod, else only check this
            machine), ``none`` (only check this machine), or the path of a snapshot file from
            ``kubectl get deviceclasses,resourceslices,resourceclaims,resourceclaimtemplates
            -A -o yaml``.
        namespace: Namespace of the claim template; empty: the pod's own namespace.

    Returns:
        decision: ``ready`` (run the GPU steps) or ``skip``.
        reason: One line saying why.
    """
    from collections import namedtuple

    from draslice.cluster.preflight import run_preflight

    result = run_preflight(claim_template=claim_template, on_missing_dra=on_missing_dra,
                           source=source, namespace=namespace)
    with open(report.path, "w") as f:
        f.write(result.markdown())
    print(result.text())
    return namedtuple("PreflightOutputs", ["decision", "reason"])(result.decision, result.reason)
