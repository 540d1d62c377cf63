"""Preflight's report: the scheduler's own DRA allocator decides, this module explains.

The decision (can the claim be allocated now, on which node, with which devices) and the
per-request counts (devices matching the class and request selectors, and how many of those
are free) come from the allocator program (``cluster/allocator``: Kubernetes'
``k8s.io/dynamic-resource-allocation`` of the chosen release, run as the scheduler runs it).
Nothing about allocation or CEL is decided in Python.

What stays here: the inventory (pools, generations, what each node publishes), the notes that
turn the allocator's answer into the command that fixes the cause (with ``diagnosis``), and
``published_slices``, the summary ``draslice advise`` reads. The report's shape is ``report``'s.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache

from draslice.cluster import allocator
from draslice.cluster.cel import CelCompileError, compile_error_message
from draslice.cluster.diagnosis import diagnose
from draslice.cluster.report import (
    FAIL,
    FREE,
    READY,
    SKIP,
    InventoryRow,
    Match,
    PreflightReport,
    PublishedSlice,
    RequestReport,
)
from draslice.cluster.resources import Device, Inventory, served_form
from draslice.cluster.snapshot import Snapshot, SnapshotError
from draslice.cluster.templates import DRIVER

# Drivers whose devices are not GPUs a training pod claims (the ComputeDomain daemons/channels).
IGNORED_DRIVERS = frozenset({"compute-domain.nvidia.com"})


class AllocatorRefused(SnapshotError):
    """The allocator refused the cluster state itself (an object it cannot read): exit 2."""


@lru_cache(maxsize=1024)
def _quantity(text: str | None) -> Decimal | None:
    """A capacity's quantity text parsed (``9728Mi``, ``"14"``); None when absent or malformed."""
    if not text:
        return None
    from kubernetes.utils import parse_quantity  # here: the client takes a second to import

    try:
        return parse_quantity(text)
    except (ValueError, ArithmeticError):
        return None


def count(text: str | None) -> int | None:
    """A whole-number capacity (``multiprocessors: "14"``); a malformed one counts as absent."""
    value = _quantity(text)
    return int(value) if value is not None and value == int(value) and value > 0 else None


def memory_gib(text: str | None) -> float | None:
    """A capacity in GiB for the table; a malformed one is the allocator's to refuse."""
    value = _quantity(text)
    return None if value is None else round(float(value) / 2**30, 2)


def _selectors(obj: dict) -> list[str]:
    return [s["cel"]["expression"] for s in obj.get("selectors") or []
            if isinstance(s, dict) and isinstance(s.get("cel"), dict)]


# --- the allocator's answer ------------------------------------------------------------------

def allocator_input(snapshot: Snapshot) -> dict:
    """The cluster half of the allocator's input: objects as read (v1alpha3 slices rewritten
    to v1beta1, see resources.served_form), and the snapshot's Nodes when it has them."""
    cached = snapshot.cache.get("allocator_input")
    if cached is None:
        cached = {
            "deviceClasses": [served_form(c) for c in snapshot.device_classes],
            "resourceSlices": _with_slice_counts([served_form(s) for s in snapshot.slices]),
            "claims": [served_form(c) for c in snapshot.claims],
            "nodes": [
                {"name": (n.get("metadata") or {}).get("name", ""),
                 "labels": (n.get("metadata") or {}).get("labels") or {}}
                for n in snapshot.nodes if (n.get("metadata") or {}).get("name")
            ],
        }
        snapshot.cache["allocator_input"] = cached
    return cached


def _with_slice_counts(slices: list[dict]) -> list[dict]:
    """A dump trimmed of ``spec.pool.resourceSliceCount`` (the API server always sets it) is
    taken as complete, as the note says: the count becomes the number of slices present."""
    def key(s: dict) -> tuple | None:
        spec = s.get("spec")
        pool = spec.get("pool") if isinstance(spec, dict) else None
        if not isinstance(pool, dict):
            return None
        return spec.get("driver"), pool.get("name"), pool.get("generation")

    present = Counter(key(s) for s in slices)
    out = []
    for s in slices:
        if key(s) is not None and s["spec"]["pool"].get("resourceSliceCount") is None:
            pool = {**s["spec"]["pool"], "resourceSliceCount": present[key(s)]}
            s = {**s, "spec": {**s["spec"], "pool": pool}}
        out.append(s)
    return out


def ask_allocator(snapshot: Snapshot, templates: list[dict], version: str) -> dict:
    """One allocator run for every template; refusals and compile errors raised as exit 2."""
    payload = {**allocator_input(snapshot), "templates": [served_form(t) for t in templates]}
    answer = allocator.run(payload, version)
    who = f"the Kubernetes {version} allocator ({answer.get('module', 'unknown module')})"
    if answer.get("error"):
        raise AllocatorRefused(
            f"{snapshot.source}: {who} refuses it: {compile_error_message(answer['error'])}"
        )
    for item in answer.get("compileErrors") or []:
        raise CelCompileError(
            "cel.expression", item["expression"],
            f"does not compile ({item.get('where', '')}; {who}): "
            + compile_error_message(item["error"]),
        )
    return answer


# --- what does not depend on the template ----------------------------------------------------

@dataclass
class ClusterState:
    """Pools, notes and each device's state: computed once per snapshot and release, shared
    by every template evaluated against it."""

    inventory: Inventory
    classes: dict[str, list[str]]
    pools: list[dict]
    notes: list[str]
    gpu_devices: list[Device]
    rows: list[InventoryRow]
    profiles: list[str]
    by_key: dict[tuple[str, str, str], Device]


def cluster_state(snapshot: Snapshot, answer: dict, version: str) -> ClusterState:
    cached = snapshot.cache.get(("cluster_state", version))
    if cached is not None:
        return cached
    inventory = snapshot.inventory
    classes = {
        c["metadata"]["name"]: _selectors(c.get("spec") or {}) for c in snapshot.device_classes
    }
    per_pool = Counter((d.driver, d.pool) for d in inventory.devices)
    pools = [
        {
            "driver": p.driver, "pool": p.name, "generation": p.generation,
            "slices": len(p.slices), "resourceSliceCount": p.expected_slices,
            "complete": p.complete, "stale_slices": len(p.stale_slices),
            "devices": per_pool[(p.driver, p.name)], "counter_sets": sorted(p.counter_sets),
        }
        for p in inventory.pools.values()
    ]
    notes = _pool_notes(inventory, version) + _admin_access_notes(snapshot.claims)
    states = {(d["driver"], d["pool"], d["device"]): (d["state"], d.get("why", ""))
              for d in answer.get("inventory") or []}
    by_key = {d.key: d for d in inventory.devices}
    gpu_devices = [d for d in inventory.devices if d.driver not in IGNORED_DRIVERS]
    rows = []
    for d in gpu_devices:
        own = d.attributes.get(d.driver, {})
        kind = str(own.get("type", ""))
        state, why = states.get(d.key, (FREE, ""))
        rows.append(InventoryRow(
            node=d.node, driver=d.driver, device=d.name, type=kind,
            profile=str(own.get("profile", "") or ("full" if kind == "gpu" else "")),
            product=str(own.get("productName", "")), memory_gib=memory_gib(d.memory_text()),
            state=state, why=why, multiprocessors=count(d.multiprocessors_text()),
        ))
    profiles = sorted({str(d.attr("profile")) for d in gpu_devices if d.attr("profile")})
    state = ClusterState(inventory, classes, pools, notes, gpu_devices, rows, profiles, by_key)
    snapshot.cache[("cluster_state", version)] = state
    return state


def _pool_notes(inventory: Inventory, version: str) -> list[str]:
    skips = version != "1.34"  # the allocator skips pools being updated since 1.35
    notes = []
    for p in inventory.pools.values():
        if p.stale_slices:
            notes.append(
                f"pool {p.driver}/{p.name}: {len(p.stale_slices)} slice(s) of an older "
                f"generation ignored (newest is {p.generation})"
            )
        if not p.complete:
            notes.append(
                f"pool {p.driver}/{p.name} is incomplete: {len(p.slices)} of "
                f"{p.expected_slices} slices of generation {p.generation} (the driver is "
                "updating it); "
                + (f"the Kubernetes {version} allocator takes no device from it until the "
                   "driver publishes the rest" if skips else
                   "requests for all devices fail until it publishes the rest")
            )
        if p.expected_slices is None:
            notes.append(
                f"pool {p.driver}/{p.name}: resourceSliceCount missing in the dump; "
                "taken as complete"
            )
    return notes


def _admin_access_notes(claims: list[dict]) -> list[str]:
    admin = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if isinstance(result, dict) and result.get("adminAccess"):
                admin.append(f"{meta.get('namespace', '')}/{meta.get('name', '?')} "
                             f"({result.get('driver')}/{result.get('pool')}/"
                             f"{result.get('device')})")
    return ["adminAccess allocations (do not hold devices): " + ", ".join(admin)] if admin else []


# --- the report ------------------------------------------------------------------------------

def analyze(
    snapshot: Snapshot,
    template: dict | None = None,
    on_missing_dra: str = "skip",
    kubernetes_version: str | None = None,
) -> PreflightReport:
    """Everything preflight says about ``snapshot``, and ready / skip / fail for ``template``."""
    return analyze_many(snapshot, [template], on_missing_dra, kubernetes_version)[0]


def analyze_many(
    snapshot: Snapshot,
    templates: list[dict | None],
    on_missing_dra: str = "skip",
    kubernetes_version: str | None = None,
) -> list[PreflightReport]:
    """One report per template (None: the inventory only), from one allocator run."""
    version = allocator.check_version(kubernetes_version)
    missing = SKIP if on_missing_dra == "skip" else FAIL
    if not snapshot.dra_api:
        return [_no_dra_api(snapshot, t, version, missing) for t in templates]
    has_objects = bool(snapshot.device_classes or snapshot.slices)
    real = [t for t in templates if t is not None] if has_objects else []
    if has_objects:
        answer = ask_allocator(snapshot, real, version)
    else:
        answer = {"module": "", "results": []}
    results = iter(answer.get("results") or [])
    state = cluster_state(snapshot, answer, version)
    reports = []
    for template in templates:
        report = PreflightReport(
            decision=READY, reason="", source=snapshot.source, template=_name(template),
            kubernetes_version=version, allocator=answer.get("module", ""),
            classes=dict(state.classes), pools=list(state.pools),
            inventory=list(state.rows), profiles=list(state.profiles),
            notes=list(snapshot.notes) + state.notes,
        )
        result = next(results) if template is not None and has_objects else None
        if result is not None:
            _take_result(report, result, state)
            if not _requests_of(template):
                report.diagnosis.append(f"template {report.template} has no device requests")
        _decide(report, snapshot, state.gpu_devices, missing, result)
        reports.append(report)
    return reports


def _name(template: dict | None) -> str | None:
    return None if template is None else (template.get("metadata") or {}).get("name")


def _requests_of(template: dict) -> list:
    spec = template.get("spec") or {}
    claim_spec = spec if template.get("kind") == "ResourceClaim" else spec.get("spec", spec)
    return ((claim_spec or {}).get("devices") or {}).get("requests") or []


def _no_dra_api(snapshot: Snapshot, template: dict | None, version: str,
                missing: str) -> PreflightReport:
    report = PreflightReport(
        decision=missing, source=snapshot.source, template=_name(template),
        kubernetes_version=version, notes=list(snapshot.notes),
        reason="the cluster does not serve resource.k8s.io/v1: no DRA (Kubernetes 1.34+ "
               "serves it by default)",
    )
    report.diagnosis.append(
        "DRA is not available: upgrade to Kubernetes 1.34+ (or enable the "
        "DynamicResourceAllocation feature gate and resource.k8s.io API), then install "
        "the NVIDIA DRA driver"
    )
    return report


def _take_result(report: PreflightReport, result: dict, state: ClusterState) -> None:
    """The allocator's answer for one template, as requests with their matching devices."""
    report.node = result.get("node") if result.get("allocatable") else None
    report.allocation = list(result.get("devices") or [])
    report.unschedulable = list(result.get("unschedulable") or [])
    chosen = {d["request"] for d in report.allocation}
    by_parent: dict[str, list[dict]] = defaultdict(list)
    order: list[str] = []
    for item in result.get("requests") or []:
        key = item.get("parent") or item["name"]
        if key not in by_parent:
            order.append(key)
        by_parent[key].append(item)
    for key in order:
        items = by_parent[key]
        # firstAvailable: the subrequest the allocator chose, else the first one
        item = next((i for i in items if i["name"] in chosen), items[0])
        report.requests.append(RequestReport(
            name=item["name"], device_class=item["deviceClass"],
            selectors=list(item.get("selectors") or []),
            allocation_mode=item.get("allocationMode") or "ExactCount",
            count=int(item.get("count") or 1),
            matches=[
                Match(state.by_key[k], d["state"], d.get("why", ""))
                for d in item.get("devices") or []
                if (k := (d["driver"], d["pool"], d["device"])) in state.by_key
            ],
            errors=list(item.get("errors") or []),
        ))


def _decide(report: PreflightReport, snapshot: Snapshot, gpu_devices: list[Device],
            missing: str, result: dict | None) -> None:
    report.diagnosis += diagnose(report, snapshot, gpu_devices)
    if not snapshot.device_classes and not snapshot.slices:
        report.decision = missing
        report.reason = "no DRA at all: no DeviceClass and no ResourceSlice in the cluster"
        return
    if not gpu_devices:
        report.decision = missing
        report.reason = "no GPU driver publishes any device (no ResourceSlice with GPUs)"
        return
    if result is None:
        free = sum(1 for r in report.inventory if r.state == FREE)
        report.decision = READY if free else FAIL
        report.reason = f"{len(report.inventory)} GPU device(s) published, {free} free"
        return
    if not report.requests:
        report.decision, report.reason = FAIL, "the template has no device requests"
        return
    if result.get("error"):
        report.decision, report.reason = FAIL, compile_error_message(result["error"])
        return
    summary = "; ".join(
        f"request {r.name}: {len(r.matches)} match, {len(r.free)} free" for r in report.requests
    )
    if result.get("allocatable"):
        report.decision, report.reason = READY, f"{summary} (node {report.node} can serve it)"
    else:
        report.decision = FAIL
        report.reason = f"{summary}: no node can serve the claim now"
        report.diagnosis += [f"the allocator: {u}" for u in report.unschedulable]


def published_slices(snapshot: Snapshot) -> list[PublishedSlice]:
    """The kinds of GPU slice published (MIG profile or "full"), with total and free counts."""
    report = analyze(snapshot)
    groups: dict[tuple[str, str, float, int], list[InventoryRow]] = defaultdict(list)
    for row in report.inventory:
        if row.driver != DRIVER or row.type not in ("gpu", "mig"):
            continue
        groups[(row.profile, row.product, row.memory_gib or 0.0,
                row.multiprocessors or 0)].append(row)
    return [
        PublishedSlice(profile=p, product=prod, memory_gib=mem, total=len(rows),
                       free=sum(1 for r in rows if r.state == FREE), multiprocessors=sms or None)
        for (p, prod, mem, sms), rows in sorted(groups.items())
    ]
