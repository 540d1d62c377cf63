"""A preflight report as a readable table (terminal, KFP Markdown) or as JSON (``--json``)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

from draslice.cluster.report import PreflightReport


def to_dict(report: PreflightReport) -> dict:
    """Plain data: stable keys that scripts can rely on."""
    return {
        "decision": report.decision,
        "exit_code": report.exit_code,
        "reason": report.reason,
        "source": report.source,
        "template": report.template,
        "kubernetes_version": report.kubernetes_version,
        "allocator": report.allocator,
        "node": report.node,
        "allocation": report.allocation,
        "unschedulable": report.unschedulable,
        "device_classes": report.classes,
        "pools": report.pools,
        "profiles": report.profiles,
        "inventory": [vars(row) for row in report.inventory],
        "requests": [
            {
                "name": r.name,
                "device_class": r.device_class,
                "selectors": r.selectors,
                "allocation_mode": r.allocation_mode,
                "count": r.count,
                "matching": len(r.matches),
                "free": len(r.free),
                "states": r.counts(),
                "devices": [
                    {"node": m.device.node, "driver": m.device.driver, "pool": m.device.pool,
                     "device": m.device.name, "state": m.state, "why": m.why}
                    for m in r.matches
                ],
                "errors": r.errors,
            }
            for r in report.requests
        ],
        "diagnosis": report.diagnosis,
        "notes": report.notes,
    }


def to_json(report: PreflightReport) -> str:
    return json.dumps(to_dict(report), indent=2, sort_keys=False)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


def _fmt_gib(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def inventory_rows(report: PreflightReport) -> list[list[str]]:
    """One row per (node, type, profile, product, memory): a count per state."""
    groups: dict[tuple, Counter] = defaultdict(Counter)
    for row in report.inventory:
        groups[(row.node, row.type, row.profile, row.product, _fmt_gib(row.memory_gib))][
            row.state
        ] += 1
    return [
        [*key, str(sum(c.values())), str(c.get("free", 0)),
         ", ".join(f"{n} {s}" for s, n in sorted(c.items()) if s != "free")]
        for key, c in sorted(groups.items())
    ]


def to_text(report: PreflightReport) -> str:
    lines = [f"preflight: {report.decision.upper()} — {report.reason}", f"source: {report.source}"]
    if report.template:
        lines.append(f"claim template: {report.template}")
    if report.allocator:
        lines.append(f"decided by: {report.allocator} (Kubernetes {report.kubernetes_version})")
    lines.append("")
    lines.append("DeviceClasses:")
    if report.classes:
        for name, selectors in sorted(report.classes.items()):
            lines.append(f"  {name}: {' && '.join(selectors) if selectors else '(no selector)'}")
    else:
        lines.append("  (none)")
    lines.append("")
    lines.append("ResourceSlice pools:")
    if report.pools:
        lines += ["  " + line for line in _table(
            ["DRIVER", "POOL", "GEN", "SLICES", "COMPLETE", "DEVICES", "STALE"],
            [[p["driver"], p["pool"], str(p["generation"]),
              f"{p['slices']}/{p['resourceSliceCount'] if p['resourceSliceCount'] else '?'}",
              "yes" if p["complete"] else "NO", str(p["devices"]), str(p["stale_slices"])]
             for p in report.pools],
        )]
    else:
        lines.append("  (none)")
    lines.append("")
    lines.append("Inventory (GPU devices):")
    rows = inventory_rows(report)
    if rows:
        lines += ["  " + line for line in _table(
            ["NODE", "TYPE", "PROFILE", "PRODUCT", "MEMORY_GiB", "TOTAL", "FREE", "OTHER"], rows
        )]
        if report.profiles:
            lines.append(f"  MIG profiles published: {', '.join(report.profiles)}")
    else:
        lines.append("  (none)")
    for req in report.requests:
        lines.append("")
        lines.append(
            f"Request {req.name}: class {req.device_class}, "
            f"{req.allocation_mode} {req.count if req.allocation_mode != 'All' else ''}".rstrip()
        )
        for sel in req.selectors:
            lines.append(f"  selector: {sel}")
        counts = ", ".join(f"{n} {s}" for s, n in sorted(req.counts().items())) or "none"
        lines.append(f"  matching devices: {len(req.matches)} ({counts}); free: {len(req.free)}")
        for err in req.errors:
            lines.append(f"  ERROR: {err}")
    if report.node:
        devices = ", ".join(f"{d['request']}: {d['pool']}/{d['device']}" for d in report.allocation)
        lines.append(f"  a node that can serve the claim: {report.node} ({devices})")
    if report.diagnosis:
        lines.append("")
        lines.append("Diagnosis:")
        lines += [f"  - {d}" for d in report.diagnosis]
    if report.notes:
        lines.append("")
        lines.append("Notes:")
        lines += [f"  - {n}" for n in report.notes]
    return "\n".join(lines) + "\n"

