"""ResourceClaimTemplates to apply, built by :mod:`draslice.cluster.templates` (the one builder).

This module only decides *which* templates an admin asked for; what each one contains is
decided in ``cluster/templates.py``, which is also what ``draslice preflight --profile``
evaluates.
"""

from __future__ import annotations

from collections.abc import Sequence

from draslice.cluster.templates import (
    Sharing,
    gpus_claim_template,
    mig_claim_template,
    shared_gpu_claim_template,
)
from draslice.errors import InvalidParameter

SHARED_STRATEGIES = {"timeslicing": "TimeSlicing", "mps": "MPS"}


def sharing_from_options(
    shared: str,
    interval: str | None = None,
    active_thread_percentage: int | None = None,
    pinned_memory_limit: str | None = None,
) -> Sharing:
    """The ``--shared timeslicing|mps`` options as a checked :class:`Sharing`."""
    strategy = SHARED_STRATEGIES.get(shared)
    if strategy is None:
        raise InvalidParameter("shared", shared, f"must be one of {sorted(SHARED_STRATEGIES)}")
    if strategy == "MPS" and interval is not None:
        raise InvalidParameter("interval", interval, "applies to --shared timeslicing only")
    sharing = Sharing(
        strategy=strategy,
        interval=interval or "Default",
        active_thread_percentage=active_thread_percentage,
        pinned_memory_limit=pinned_memory_limit,
    )
    sharing.check()
    return sharing


def claim_templates(
    profiles: Sequence[str] = (),
    sharings: Sequence[Sharing] = (),
    namespace: str | None = None,
    gpu_counts: Sequence[int] = (),
) -> list[dict]:
    """One template per MIG profile, then one per shared-GPU setting, then one per count of
    whole GPUs in a pod, in the order given."""
    if not profiles and not sharings and not gpu_counts:
        raise InvalidParameter(
            "profile", None,
            "give at least one --profile (e.g. 1g.6gb), --shared timeslicing|mps or --gpus K",
        )
    docs = [mig_claim_template(p, namespace) for p in profiles]
    docs += [shared_gpu_claim_template(s, namespace) for s in sharings]
    docs += [gpus_claim_template(k, namespace) for k in gpu_counts]
    names = [d["metadata"]["name"] for d in docs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidParameter(
            "profile", duplicates, "each template is named after its profile: give it once"
        )
    return docs
