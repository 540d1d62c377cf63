"""Think like the scheduler: which devices a claim template's requests can get, and why not.

For every request of the template: the devices that pass the DeviceClass selectors AND the
request's selectors (real CEL, see cel.py), minus devices that are taken (named in a
ResourceClaim's ``status.allocation.devices.results``, adminAccess results excepted), tainted
NoSchedule/NoExecute without a toleration, or blocked because allocated devices already consume
the shared counters they need (partitionable GPUs). An incomplete pool (fewer slices than
``resourceSliceCount``) is reported; as in the allocator, only ``allocationMode: All`` fails on
it. All devices of one claim sit on one node, so the verdict looks for one node that can serve
every request.

The diagnosis turns the seed guide's troubleshooting into messages with the command that fixes
the cause. ``published_slices`` is the summary ``draslice advise`` reads.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache

from kubernetes.utils import parse_quantity

from draslice.cluster.cel import (
    CelRuntimeError,
    DeviceActivation,
    Selector,
    cel_values,
    compile_selector,
    device_activation,
)
from draslice.cluster.resources import Device, Inventory
from draslice.cluster.snapshot import Snapshot

READY, SKIP, FAIL = "ready", "skip", "fail"
EXIT_CODES = {READY: 0, SKIP: 77, FAIL: 1}
GPU_DRIVER = "gpu.nvidia.com"
# Drivers whose devices are not GPUs a training pod claims (the ComputeDomain daemons/channels).
IGNORED_DRIVERS = frozenset({"compute-domain.nvidia.com"})
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
FREE, TAKEN, BLOCKED, TAINTED = "free", "taken", "blocked", "tainted"


@dataclass
class Match:
    device: Device
    state: str  # free | taken | blocked | tainted
    why: str = ""


@dataclass
class RequestReport:
    name: str
    device_class: str
    selectors: list[str]
    allocation_mode: str
    count: int
    matches: list[Match] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def free(self) -> list[Match]:
        return [m for m in self.matches if m.state == FREE]

    def counts(self) -> dict[str, int]:
        return dict(Counter(m.state for m in self.matches))


@dataclass
class InventoryRow:
    node: str
    driver: str
    device: str
    type: str
    profile: str
    product: str
    memory_gib: float | None
    state: str
    why: str = ""


@dataclass
class PublishedSlice:
    """One kind of slice the cluster publishes, for ``draslice advise``."""

    profile: str  # MIG profile string as published, or "full" for a whole GPU
    product: str
    memory_gib: float
    total: int
    free: int


@dataclass
class PreflightReport:
    decision: str
    reason: str
    source: str
    template: str | None = None
    classes: dict[str, list[str] | None] = field(default_factory=dict)  # name -> selectors
    pools: list[dict] = field(default_factory=list)
    inventory: list[InventoryRow] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)
    requests: list[RequestReport] = field(default_factory=list)
    node: str | None = None  # a node that can serve every request
    diagnosis: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.decision]


@lru_cache(maxsize=1024)
def memory_gib(text: str | None) -> float | None:
    if not text:
        return None
    return round(float(parse_quantity(text)) / 2**30, 2)


# --- device state ----------------------------------------------------------------------------

def _allocated(claims: list[dict]) -> tuple[dict[tuple, str], list[str]]:
    """Devices held by claims (adminAccess results do not hold a device) -> claim name."""
    taken: dict[tuple, str] = {}
    admin: list[str] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        who = f"{meta.get('namespace', '')}/{meta.get('name', '?')}"
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            key = (result.get("driver"), result.get("pool"), result.get("device"))
            if result.get("adminAccess"):
                admin.append(f"{who} ({'/'.join(map(str, key))})")
                continue
            taken[key] = who
    return taken, admin


def _consumed(inventory: Inventory, taken: dict[tuple, str]) -> dict[tuple, Decimal]:
    """(driver, pool, counterSet, counter) -> amount consumed by allocated devices."""
    used: dict[tuple, Decimal] = defaultdict(Decimal)
    for device in inventory.devices:
        if device.key in taken:
            for use in device.consumes_counters:
                for counter, amount in use["counters"].items():
                    used[(device.driver, device.pool, use["counterSet"], counter)] += (
                        parse_quantity(amount)
                    )
    return used


def _blocked_by_counters(
    device: Device, inventory: Inventory, used: dict[tuple, Decimal]
) -> str | None:
    pool = inventory.pool_of(device)
    for use in device.consumes_counters:
        available = pool.counter_sets.get(use["counterSet"])
        if available is None:
            return f"counter set {use['counterSet']} is not published in pool {pool.name}"
        for counter, amount in use["counters"].items():
            have = parse_quantity(available.get(counter, "0"))
            held = used.get((device.driver, device.pool, use["counterSet"], counter), 0)
            if held + parse_quantity(amount) > have:
                return (
                    f"shared counter {use['counterSet']}/{counter} is used by allocated "
                    f"devices ({held} of {have})"
                )
    return None


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol["key"] == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get(
            "value", ""
        ):
            return True
    return False


def _state(
    device: Device, inventory: Inventory, taken: dict, used: dict, tolerations: list[dict]
) -> tuple[str, str]:
    for taint in device.taints:
        if taint.get("effect") in _BLOCKING_EFFECTS and not _tolerated(taint, tolerations):
            return TAINTED, f"taint {taint.get('key')}={taint.get('value', '')}:{taint['effect']}"
    if device.key in taken and not device.allow_multiple_allocations:
        return TAKEN, f"allocated to claim {taken[device.key]}"
    blocked = _blocked_by_counters(device, inventory, used)
    if blocked:
        return BLOCKED, blocked
    return FREE, ""


# --- requests --------------------------------------------------------------------------------

def template_requests(template: dict) -> list[dict]:
    """Requests of a ResourceClaimTemplate (or a ResourceClaim), any API version, flattened:
    ``exactly`` (v1) and bare fields (v1beta1) alike; ``firstAvailable`` keeps its list."""
    spec = template.get("spec") or {}
    claim_spec = spec.get("spec", spec) if template.get("kind") != "ResourceClaim" else spec
    out = []
    for req in (claim_spec.get("devices") or {}).get("requests") or []:
        if "firstAvailable" in req:
            out.append({"name": req.get("name", "?"), "firstAvailable": req["firstAvailable"]})
        else:
            body = req.get("exactly", req)
            out.append({"name": req.get("name", "?"), **body})
    return out


def _selectors(obj: dict) -> list[str]:
    return [s["cel"]["expression"] for s in obj.get("selectors") or [] if s.get("cel")]


def _evaluate(
    name: str,
    body: dict,
    snapshot: Snapshot,
    states: dict[tuple, tuple[str, str]],
    activations: dict[tuple, DeviceActivation],
    compiled: dict[str, Selector],
    inventory: Inventory,
    taken: dict,
    used: dict,
) -> RequestReport:
    cls_name = body.get("deviceClassName", "")
    cls = snapshot.device_class(cls_name)
    class_selectors = _selectors(cls.get("spec") or {}) if cls else []
    report = RequestReport(
        name=name, device_class=cls_name, selectors=_selectors(body),
        allocation_mode=body.get("allocationMode", "ExactCount"),
        count=int(body.get("count", 1)),
    )
    if cls is None:
        report.errors.append(f"DeviceClass {cls_name!r} does not exist")
        return report
    if report.allocation_mode == "All":
        # The allocator cannot know what "all" is while a pool is being updated.
        for pool in inventory.pools.values():
            if not pool.complete:
                report.errors.append(
                    f"request {name} asks for all devices, but pool {pool.driver}/{pool.name} "
                    f"is incomplete ({len(pool.slices)} of {pool.expected_slices} slices of "
                    f"generation {pool.generation}): the scheduler fails it until the driver "
                    "has published the rest"
                )
    tolerations = body.get("tolerations") or []
    for device in inventory.devices:
        try:
            ok = all(
                compiled[e].matches(activations[device.key])
                for e in class_selectors + report.selectors
            )
        except CelRuntimeError as exc:
            report.errors.append(str(exc))
            continue
        if not ok:
            continue
        state, why = (
            _state(device, inventory, taken, used, tolerations) if tolerations
            else states[device.key]
        )
        report.matches.append(Match(device, state, why))
    return report


_ANYWHERE = ("(all nodes)", "(node selector)", "(per device)")  # not bound to one node


def _node_for(requests: list[RequestReport]) -> str | None:
    """A node on which every request gets its devices (greedy, no device used twice).

    ``All`` asks for every matching device the node can reach, and fails if one is not free.
    """
    free_at = [defaultdict(list) for _ in requests]
    matching_at = [Counter(m.device.node for m in r.matches) for r in requests]
    for i, req in enumerate(requests):
        for m in req.free:
            free_at[i][m.device.node].append(m.device.key)
    nodes = sorted({n for f in free_at for n in f})
    for node in [n for n in nodes if n not in _ANYWHERE] + [n for n in nodes if n in _ANYWHERE]:
        reach = (node, *_ANYWHERE)
        used: set[tuple] = set()
        for i, req in enumerate(requests):
            candidates = [k for n in reach for k in free_at[i].get(n, ()) if k not in used]
            if req.allocation_mode == "All":
                need = sum(matching_at[i][n] for n in reach)
                if need == 0 or len(candidates) < need:
                    break
            else:
                need = req.count
                if len(candidates) < need:
                    break
            used.update(candidates[:need])
        else:
            return node
    return None


# --- what does not depend on the template ----------------------------------------------------

@dataclass
class ClusterState:
    """Pools, allocations and each device's state: computed once per snapshot, shared by every
    template evaluated against it."""

    inventory: Inventory
    classes: dict[str, list[str]]
    pools: list[dict]
    notes: list[str]
    taken: dict[tuple, str]
    used: dict[tuple, Decimal]
    states: dict[tuple, tuple[str, str]]
    gpu_devices: list[Device]
    rows: list[InventoryRow]
    profiles: list[str]


def cluster_state(snapshot: Snapshot) -> ClusterState:
    cached = snapshot.cache.get("cluster_state")
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
                "updating it); requests for all devices fail until it publishes the rest"
            )
        if p.expected_slices is None:
            notes.append(
                f"pool {p.driver}/{p.name}: resourceSliceCount missing in the dump; "
                "taken as complete"
            )
    taken, admin = _allocated(snapshot.claims)
    if admin:
        notes.append("adminAccess allocations (do not hold devices): " + ", ".join(admin))
    used = _consumed(inventory, taken)
    states = {d.key: _state(d, inventory, taken, used, []) for d in inventory.devices}
    gpu_devices = [d for d in inventory.devices if d.driver not in IGNORED_DRIVERS]
    rows = []
    for d in gpu_devices:
        own = d.attributes.get(d.driver, {})
        kind = str(own.get("type", ""))
        rows.append(InventoryRow(
            node=d.node, driver=d.driver, device=d.name, type=kind,
            profile=str(own.get("profile", "") or ("full" if kind == "gpu" else "")),
            product=str(own.get("productName", "")), memory_gib=memory_gib(d.memory_text()),
            state=states[d.key][0], why=states[d.key][1],
        ))
    profiles = sorted({str(d.attr("profile")) for d in gpu_devices if d.attr("profile")})
    state = ClusterState(inventory, classes, pools, notes, taken, used, states, gpu_devices,
                         rows, profiles)
    snapshot.cache["cluster_state"] = state
    return state


# --- the report ------------------------------------------------------------------------------

def analyze(
    snapshot: Snapshot,
    template: dict | None = None,
    on_missing_dra: str = "skip",
) -> PreflightReport:
    """Everything preflight says about ``snapshot``, and ready / skip / fail for ``template``."""
    template_name = (template or {}).get("metadata", {}).get("name")
    report = PreflightReport(
        decision=READY, reason="", source=snapshot.source, template=template_name,
        notes=list(snapshot.notes),
    )
    missing = SKIP if on_missing_dra == "skip" else FAIL
    if not snapshot.dra_api:
        report.decision, report.reason = missing, (
            "the cluster does not serve resource.k8s.io/v1: no DRA (Kubernetes 1.34+ serves "
            "it by default)"
        )
        report.diagnosis.append(
            "DRA is not available: upgrade to Kubernetes 1.34+ (or enable the "
            "DynamicResourceAllocation feature gate and resource.k8s.io API), then install "
            "the NVIDIA DRA driver"
        )
        return report

    state = cluster_state(snapshot)
    inventory, taken, used, states = state.inventory, state.taken, state.used, state.states
    report.classes = dict(state.classes)
    report.pools = list(state.pools)
    report.notes += state.notes
    report.inventory = list(state.rows)
    report.profiles = list(state.profiles)
    gpu_devices = state.gpu_devices

    if template is not None:
        _analyze_template(report, snapshot, template, inventory, states, taken, used)
    _decide(report, snapshot, gpu_devices, missing)
    return report


def _analyze_template(report, snapshot, template, inventory, states, taken, used) -> None:
    requests = template_requests(template)
    expressions: list[str] = []
    for req in requests:
        bodies = req.get("firstAvailable") or [req]
        for body in bodies:
            expressions += _selectors(body)
            cls = snapshot.device_class(body.get("deviceClassName", ""))
            expressions += _selectors((cls or {}).get("spec") or {})
    compiled = {e: compile_selector(e) for e in dict.fromkeys(expressions)}
    domains = frozenset().union(*(s.domains for s in compiled.values()))
    names = (None if any(s.names is None for s in compiled.values())
             else frozenset().union(*(s.names for s in compiled.values())))
    activations = {
        d.key: device_activation(
            d.label, d.driver, d.attributes, d.capacity, d.allow_multiple_allocations, domains,
            values=cel_values(d.attributes, d.capacity, names),
        )
        for d in inventory.devices
    }
    for req in requests:
        if "firstAvailable" in req:
            # The scheduler takes the first subrequest that can be satisfied.
            subs = [
                _evaluate(f"{req['name']}/{s.get('name', '?')}", s, snapshot, states,
                          activations, compiled, inventory, taken, used)
                for s in req["firstAvailable"]
            ]
            best = next((s for s in subs if not s.errors and _node_for([s])), subs[0])
            report.requests.append(best)
        else:
            report.requests.append(
                _evaluate(req["name"], req, snapshot, states, activations, compiled,
                          inventory, taken, used)
            )
    if not requests:
        report.diagnosis.append(f"template {report.template} has no device requests")


def _decide(report: PreflightReport, snapshot: Snapshot, gpu_devices: list[Device],
            missing: str) -> None:
    from draslice.cluster.diagnosis import diagnose

    report.diagnosis += diagnose(report, snapshot, gpu_devices)
    if not snapshot.device_classes and not snapshot.slices:
        report.decision = missing
        report.reason = "no DRA at all: no DeviceClass and no ResourceSlice in the cluster"
        return
    if not gpu_devices:
        report.decision = missing
        report.reason = "no GPU driver publishes any device (no ResourceSlice with GPUs)"
        return
    if not report.requests:
        free = sum(1 for r in report.inventory if r.state == FREE)
        report.decision = READY if free else FAIL
        report.reason = f"{len(report.inventory)} GPU device(s) published, {free} free"
        if report.template is not None:
            report.decision, report.reason = FAIL, "the template has no device requests"
        return
    errors = [e for r in report.requests for e in r.errors]
    if errors:
        report.decision, report.reason = FAIL, errors[0]
        return
    report.node = _node_for(report.requests)
    summary = "; ".join(
        f"request {r.name}: {len(r.matches)} match, {len(r.free)} free" for r in report.requests
    )
    if report.node:
        report.decision, report.reason = READY, f"{summary} (node {report.node} can serve it)"
    else:
        report.decision, report.reason = FAIL, f"{summary}: no node can serve the claim now"


def published_slices(snapshot: Snapshot) -> list[PublishedSlice]:
    """The kinds of GPU slice published (MIG profile or "full"), with total and free counts."""
    report = analyze(snapshot)
    groups: dict[tuple[str, str, float], list[InventoryRow]] = defaultdict(list)
    for row in report.inventory:
        if row.driver != GPU_DRIVER or row.type not in ("gpu", "mig"):
            continue
        groups[(row.profile, row.product, row.memory_gib or 0.0)].append(row)
    return [
        PublishedSlice(profile=p, product=prod, memory_gib=mem, total=len(rows),
                       free=sum(1 for r in rows if r.state == FREE))
        for (p, prod, mem), rows in sorted(groups.items())
    ]
