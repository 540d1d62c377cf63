"""Preflight for several pods, each with its own claim from one template (a TrainJob's
``numNodes`` pods): can all of them be allocated at once?

The scheduler allocates one pod's claim at a time, each against what the earlier ones hold. So
does this: the allocator (cluster/allocator) places pod 1's claim; that allocation goes into
the cluster state as an allocated ResourceClaim (as the scheduler's claim tracker sees it),
and the allocator places pod 2's against it, and so on. Which devices are free, what a MIG
device's shared counters allow, and on which node each claim fits are the allocator's
decisions; this module only chains them and says the verdict in one line.

A claim of K whole GPUs in one pod (``gpus-K``) needs no chaining: the allocator places a claim
on one node, so its answer for the template is whether K devices fit on one node.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import replace

from draslice.cluster.report import READY, PreflightReport
from draslice.errors import InvalidParameter

MAX_PODS = 1000  # far beyond any TrainJob a slice-sized cluster runs; bounds the allocator runs


def check_pods(pods: int) -> int:
    if isinstance(pods, bool) or not isinstance(pods, int) or not 1 <= pods <= MAX_PODS:
        raise InvalidParameter("pods", pods, f"must be a whole number of pods, 1..{MAX_PODS}")
    return pods


def allocated_claim(template: dict, report: PreflightReport, index: int) -> dict:
    """The ResourceClaim pod ``index`` would hold: the template's spec, allocated as the
    allocator answered (its node, its devices)."""
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    claim_spec = spec if template.get("kind") == "ResourceClaim" else spec.get("spec", {})
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"{meta.get('name', 'claim')}-preflight-pod-{index}",
                     "namespace": meta.get("namespace") or "default"},
        "spec": copy.deepcopy(claim_spec),
        "status": {"allocation": {"devices": {"results": [
            {"request": d["request"], "driver": d["driver"], "pool": d["pool"],
             "device": d["device"]} for d in report.allocation]}}},
    }


def pods_preflight(snapshot, template: dict, pods: int, decide) -> PreflightReport:
    """``pods`` claims from ``template``, placed one after another. ``decide(snapshot,
    template)`` is the one-claim preflight (:func:`draslice.cluster.preflight.cluster_preflight`
    with the caller's options). Returns the report of the first claim that does not fit, or of
    the last one, with the verdict for all of them as its reason."""
    check_pods(pods)
    name = (template.get("metadata") or {}).get("name", "the template")
    placed: list[PreflightReport] = []
    current = snapshot
    report = decide(current, template)
    while report.decision == READY:
        placed.append(report)
        if len(placed) == pods:
            break
        current = replace(current, claims=[*current.claims,
                                           allocated_claim(template, report, len(placed))],
                          cache={})
        report = decide(current, template)
    nodes = ", ".join(f"{n}: {k}" for n, k in Counter(r.node for r in placed).items())
    where = f" (pods per node: {nodes})" if placed else ""
    if len(placed) == pods:
        report.reason = (f"{pods} pod(s) × {name}: every pod's claim can be allocated now"
                         f"{where}")
        return report
    if placed:  # pods after the first: the report of the first one that does not fit
        report.reason = (f"{pods} pod(s) × {name}: only {len(placed)} of {pods} claims can be "
                         f"allocated now{where}; pod {len(placed) + 1}: {report.reason}")
    else:
        report.reason = f"{pods} pod(s) × {name}: not even one claim: {report.reason}"
    report.notes.append(
        f"{len(placed)} of {pods} pods placed, each against the allocations before it "
        "(the scheduler's order); free devices or run fewer pods (TrainJob numNodes)")
    return report
