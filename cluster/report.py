"""What preflight reports: the decision with its reason, the inventory, each request's matching
devices and their states, the diagnosis and notes.

Its own module so that ``analysis`` (which fills it in) and ``diagnosis`` (which reads it) both
import it, and neither the other's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from draslice.cluster import allocator
from draslice.cluster.resources import Device

READY, SKIP, FAIL = "ready", "skip", "fail"
EXIT_CODES = {READY: 0, SKIP: 77, FAIL: 1}
FREE, TAKEN, BLOCKED, TAINTED, INCOMPLETE = "free", "taken", "blocked", "tainted", "incomplete"


@dataclass
class Match:
    device: Device
    state: str  # free | taken | blocked | tainted | incomplete (the allocator program's words)
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
    multiprocessors: int | None = None


@dataclass
class PublishedSlice:
    """One kind of slice the cluster publishes, for ``draslice advise``."""

    profile: str  # MIG profile string as published, or "full" for a whole GPU
    product: str
    memory_gib: float
    total: int
    free: int
    multiprocessors: int | None = None  # capacity the driver publishes for a MIG device


@dataclass
class PreflightReport:
    decision: str
    reason: str
    source: str
    template: str | None = None
    kubernetes_version: str = allocator.NEWEST
    allocator: str = ""  # the module and version that decided
    classes: dict[str, list[str] | None] = field(default_factory=dict)  # name -> selectors
    pools: list[dict] = field(default_factory=list)
    inventory: list[InventoryRow] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)
    requests: list[RequestReport] = field(default_factory=list)
    node: str | None = None  # the node the allocator found for the claim
    allocation: list[dict] = field(default_factory=list)  # its devices (request, driver, ...)
    unschedulable: list[str] = field(default_factory=list)  # the allocator's per-node reasons
    diagnosis: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.decision]
