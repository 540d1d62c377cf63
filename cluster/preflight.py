"""Preflight: decide ``ready`` / ``skip`` / fail before any GPU step claims a slice.

This version checks what can be checked without reading the cluster: the claim template
name (the same rule the compiler applies), the skip-or-fail policy, and where the run is
(a local ``kfp.local`` run or a task pod). A task pod runs without a claim, so it sees no GPU;
that is expected and reported, not a failure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from draslice.cluster.names import validate_template_name
from draslice.trainer.device import nvidia_smi_list
from draslice.trainer.errors import DrasliceError, InvalidParameter

READY = "ready"
SKIP = "skip"
ON_MISSING_DRA = ("skip", "fail")


class PreflightFailed(DrasliceError):
    exit_code = 1


@dataclass
class PreflightResult:
    decision: str
    reason: str
    facts: dict = field(default_factory=dict)

    def text(self) -> str:
        lines = [f"preflight: {self.decision} — {self.reason}"]
        lines += [f"  {k}: {v}" for k, v in self.facts.items()]
        return "\n".join(lines)

    def markdown(self) -> str:
        rows = "\n".join(f"| {k} | {v} |" for k, v in self.facts.items())
        return (
            f"# preflight: {self.decision}\n\n{self.reason}\n\n| check | result |\n| --- | --- |\n"
            f"{rows}\n"
        )


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def run_preflight(claim_template: str, on_missing_dra: str = "skip") -> PreflightResult:
    """Check the run's inputs and surroundings; raise :class:`PreflightFailed` to fail."""
    if on_missing_dra not in ON_MISSING_DRA:
        raise InvalidParameter("on_missing_dra", on_missing_dra, "must be 'skip' or 'fail'")
    validate_template_name(claim_template)
    smi = nvidia_smi_list()
    facts = {
        "claim template": claim_template,
        "where": "task pod in a cluster" if in_cluster() else "local run (no cluster)",
        "nvidia-smi here": (smi.splitlines()[0] if smi else "not present"),
    }
    if in_cluster():
        reason = (
            "template name valid; the scheduler allocates the claim when the GPU steps start"
        )
    else:
        reason = "local run: the GPU steps use this machine's device, no claim is made"
    return PreflightResult(decision=READY, reason=reason, facts=facts)
