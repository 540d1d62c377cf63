"""One device model for ResourceSlices of every API version the NVIDIA DRA driver has used.

``resource.k8s.io/v1`` (and ``v1beta2``) put attributes and capacity on the device; ``v1beta1``
and ``v1alpha3`` wrap them in ``basic:``, and ``v1alpha3`` writes capacities as bare quantities
instead of ``{value: ...}``. The inventory table, the notes and the diagnosis see one
:class:`Device`. This model is for *showing* what is published; the allocator program reads the
objects themselves (see :func:`served_form`) and converts them with Kubernetes' own code.

Pools as the scheduler groups them: only the newest generation of a pool counts, and a pool
whose newest generation has fewer slices than ``resourceSliceCount`` is incomplete (being
updated; what the allocator then does depends on the release). Shared counters (partitionable
devices, KEP-4815) are collected per pool, from slices with devices or — Kubernetes 1.35+ —
slices of their own.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

_ATTRIBUTE_KINDS = ("string", "int", "bool", "version")


@dataclass(frozen=True)
class Version:
    """A ``version`` attribute value (a semver string), kept apart from plain strings."""

    text: str


class SliceFormatError(ValueError):
    """A ResourceSlice that does not have the shape of any known API version."""


@dataclass
class Device:
    """A published device: what CEL selects on, and where it lives."""

    driver: str
    pool: str
    name: str
    node: str  # node name, "(all nodes)" or "(node selector)"
    attributes: dict[str, dict[str, object]]  # domain -> name -> bool | int | str | Version
    capacity: dict[str, dict[str, str]]  # domain -> name -> quantity text
    taints: list[dict] = field(default_factory=list)
    consumes_counters: list[dict] = field(default_factory=list)  # [{counterSet, counters}]
    allow_multiple_allocations: bool = False
    slice_name: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        """(driver, pool, device): how ResourceClaims name an allocated device."""
        return (self.driver, self.pool, self.name)

    @property
    def label(self) -> str:
        return f"{self.node}/{self.driver}/{self.name}"

    def attr(self, name: str, default=None):
        """An attribute of the driver's own domain (``type``, ``profile``, ...)."""
        value = self.attributes.get(self.driver, {}).get(name, default)
        return value.text if isinstance(value, Version) else value

    def memory_text(self) -> str | None:
        return self.capacity.get(self.driver, {}).get("memory")

    def multiprocessors_text(self) -> str | None:
        """The SMs the NVIDIA driver publishes for a MIG device (absent on most whole GPUs)."""
        return self.capacity.get(self.driver, {}).get("multiprocessors")


@dataclass
class Pool:
    driver: str
    name: str
    generation: int
    expected_slices: int | None  # resourceSliceCount (None: the dump omitted it)
    slices: list[str] = field(default_factory=list)
    stale_slices: list[str] = field(default_factory=list)  # older generations, ignored
    counter_sets: dict[str, dict[str, str]] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return self.expected_slices is None or len(self.slices) >= self.expected_slices


@dataclass
class Inventory:
    pools: dict[tuple[str, str], Pool]
    devices: list[Device]  # from the newest generation of every pool

    def pool_of(self, device: Device) -> Pool:
        return self.pools[(device.driver, device.pool)]


def split_qualified(name: str, driver: str) -> tuple[str, str]:
    """``resource.kubernetes.io/pciBusID`` -> (that domain, ``pciBusID``); bare -> driver's."""
    if "/" in name:
        domain, _, short = name.rpartition("/")
        return domain, short
    return driver, name


def _attribute_value(raw, where: str):
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in _ATTRIBUTE_KINDS:
        raise SliceFormatError(
            f"{where}: an attribute must have exactly one of {', '.join(_ATTRIBUTE_KINDS)}, "
            f"got {raw!r}"
        )
    kind, value = next(iter(raw.items()))
    if kind == "version":
        return Version(str(value))
    if kind == "int":
        return int(value)
    if kind == "bool":
        return bool(value)
    return str(value)


def _capacity_value(raw) -> str:
    """v1/v1beta1 ``{value: 40Gi}``; v1alpha3 a bare quantity."""
    if isinstance(raw, dict):
        raw = raw.get("value")
    return str(raw)


def _counters(raw: dict | None) -> dict[str, str]:
    return {name: _capacity_value(v) for name, v in (raw or {}).items()}


def parse_device(raw: dict, driver: str, pool: str, node: str, slice_name: str) -> Device:
    if not isinstance(raw, dict) or "name" not in raw:
        raise SliceFormatError(f"slice {slice_name}: a device without a name: {raw!r}")
    body = raw.get("basic", raw)  # v1beta1 / v1alpha3 wrap the device in `basic:`
    where = f"slice {slice_name}, device {raw['name']}"
    attributes: dict[str, dict[str, object]] = defaultdict(dict)
    for qname, value in (body.get("attributes") or {}).items():
        domain, short = split_qualified(qname, driver)
        attributes[domain][short] = _attribute_value(value, f"{where}, attribute {qname}")
    capacity: dict[str, dict[str, str]] = defaultdict(dict)
    for qname, value in (body.get("capacity") or {}).items():
        domain, short = split_qualified(qname, driver)
        capacity[domain][short] = _capacity_value(value)
    device_node = body.get("nodeName") or (
        "(all nodes)" if body.get("allNodes") else ("(node selector)"
                                                     if body.get("nodeSelector") else node)
    )
    return Device(
        driver=driver, pool=pool, name=str(raw["name"]), node=device_node,
        attributes=dict(attributes), capacity=dict(capacity),
        taints=list(body.get("taints") or []),
        consumes_counters=[
            {"counterSet": c.get("counterSet"), "counters": _counters(c.get("counters"))}
            for c in (body.get("consumesCounters") or [])
        ],
        allow_multiple_allocations=bool(body.get("allowMultipleAllocations")),
        slice_name=slice_name,
    )


def _slice_node(spec: dict) -> str:
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    if spec.get("allNodes"):
        return "(all nodes)"
    if spec.get("nodeSelector"):
        return "(node selector)"
    return "(per device)"


def _pool_int(obj: dict, key: str, default: int | None = 0) -> int | None:
    """``spec.pool.<key>`` as the integer the API requires, or a SliceFormatError naming it."""
    value = obj["spec"]["pool"].get(key, default)
    if value is default:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        name = (obj.get("metadata") or {}).get("name", "?")
        raise SliceFormatError(
            f"ResourceSlice {name}: spec.pool.{key} must be an integer, got {value!r}"
        )
    return value


def served_form(obj: dict) -> dict:
    """An object in a version the allocator reads. Kubernetes' conversion code (in the
    allocator program) turns v1beta1 and v1beta2 into v1; v1alpha3, which no release we support
    serves and Kubernetes no longer converts, differs from v1beta1 only in writing capacities as
    bare quantities, so it is relabelled v1beta1 here with ``{value: ...}`` capacities."""
    if obj.get("apiVersion") != "resource.k8s.io/v1alpha3":
        return obj
    out = {**obj, "apiVersion": "resource.k8s.io/v1beta1"}
    if obj.get("kind") == "ResourceSlice" and isinstance(obj.get("spec"), dict):
        devices = []
        for raw in obj["spec"].get("devices") or []:
            basic = raw.get("basic") if isinstance(raw, dict) else None
            if isinstance(basic, dict) and isinstance(basic.get("capacity"), dict):
                capacity = {k: v if isinstance(v, dict) else {"value": v}
                            for k, v in basic["capacity"].items()}
                raw = {**raw, "basic": {**basic, "capacity": capacity}}
            devices.append(raw)
        out["spec"] = {**obj["spec"], "devices": devices}
    return out


def build_inventory(slices: list[dict]) -> Inventory:
    """Pools and the devices of their newest generations, from ResourceSlice objects."""
    by_pool: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for obj in slices:
        name = (obj.get("metadata") or {}).get("name", "?")
        spec = obj.get("spec")
        if not isinstance(spec, dict) or not spec.get("driver") or not isinstance(
            spec.get("pool"), dict
        ):
            raise SliceFormatError(f"ResourceSlice {name}: spec.driver and spec.pool are required")
        by_pool[(spec["driver"], spec["pool"].get("name", ""))].append(obj)

    pools: dict[tuple[str, str], Pool] = {}
    devices: list[Device] = []
    for (driver, pool_name), members in sorted(by_pool.items()):
        generations = [_pool_int(m, "generation") for m in members]
        newest = max(generations)
        current = [m for m, g in zip(members, generations, strict=True) if g == newest]
        counts = {_pool_int(m, "resourceSliceCount", None) for m in current} - {None}
        pool = Pool(
            driver=driver, name=pool_name, generation=newest,
            expected_slices=max(counts) if counts else None,
            stale_slices=sorted(
                m["metadata"].get("name", "?") for m in members if m not in current
            ),
        )
        for obj in current:
            spec = obj["spec"]
            slice_name = obj["metadata"].get("name", "?")
            pool.slices.append(slice_name)
            node = _slice_node(spec)
            for counter_set in spec.get("sharedCounters") or []:
                pool.counter_sets[counter_set["name"]] = _counters(counter_set.get("counters"))
            for raw in spec.get("devices") or []:
                device = parse_device(raw, driver, pool_name, node, slice_name)
                pool.nodes.add(device.node)
                devices.append(device)
        pools[(driver, pool_name)] = pool
    return Inventory(pools=pools, devices=devices)
