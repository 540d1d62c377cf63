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
) -> NamedTuple("PreflightOutputs", decision=str, reason=str):
    """Checks what the GPU steps need and outputs the decision ``ready`` or ``skip``.

    Runs without a claim: it must be able to say "no slice" without holding one.

    Args:
        claim_template: Name of the ResourceClaimTemplate the GPU steps claim.
        on_missing_dra: ``skip`` to skip the GPU steps when no DRA device can be had (the
            seed's e2e behaviour on device-plugin-only clusters), ``fail`` to fail the run.
        report: Markdown the KFP UI shows: what was checked and why the decision.

    Returns:
        decision: ``ready`` (run the GPU steps) or ``skip``.
        reason: One line saying why.
    """
    from collections import namedtuple

    from draslice.cluster.preflight import run_preflight

    result = run_preflight(claim_template=claim_template, on_missing_dra=on_missing_dra)
    with open(report.path, "w") as f:
        f.write(result.markdown())
    print(result.text())
    return namedtuple("PreflightOutputs", ["decision", "reason"])(result.decision, result.reason)
