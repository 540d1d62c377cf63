"""The seed guide's troubleshooting, as messages that name the cause and the fixing command.

- no DeviceClass -> the NVIDIA DRA driver is not installed;
- a DeviceClass but no ResourceSlices -> the kubelet plugin publishes nothing: its DaemonSet's
  nodeSelector does not match the GPU nodes (the ``kubectl label node ...`` that fixes it);
- a MIG class but no MIG devices -> MIG mode is off or no instances exist
  (``nvidia-smi mig -cgi ... -C`` on the node, then restart the plugin pod);
- a selector that matches nothing -> the profiles and products that do exist;
- every matching device taken, blocked or tainted -> say so, and by whom.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from draslice.cluster.templates import DRIVER, GPU_CLASS, MIG_CLASS

if TYPE_CHECKING:
    from draslice.cluster.report import PreflightReport
    from draslice.cluster.resources import Device
    from draslice.cluster.snapshot import Snapshot

# Labels by which a node shows it has an NVIDIA GPU (GPU feature discovery, NFD's PCI vendor).
_GPU_NODE_LABELS = ("nvidia.com/gpu.present", "nvidia.com/gpu.product",
                    "feature.node.kubernetes.io/pci-10de.present")


def diagnose(report: PreflightReport, snapshot: Snapshot, gpu_devices: list[Device]) -> list[str]:
    out: list[str] = []
    wanted = [r.device_class for r in report.requests] or (
        [GPU_CLASS, MIG_CLASS] if report.template is None else []
    )
    missing = [c for c in dict.fromkeys(wanted) if snapshot.device_class(c) is None]
    nvidia_classes = [c for c in report.classes if c.endswith("nvidia.com")]
    if not nvidia_classes:
        out.append(
            "no NVIDIA DeviceClass (gpu.nvidia.com, mig.nvidia.com): the NVIDIA DRA driver is "
            "not installed — install the nvidia-dra-driver-gpu Helm chart"
            + (f" (classes present: {', '.join(sorted(report.classes))})" if report.classes
               else "")
        )
    elif missing and report.template is not None:
        out.append(
            f"DeviceClass {', '.join(missing)} not found (present: "
            f"{', '.join(sorted(report.classes))}): the driver version installed does not "
            "create it; check the class name in the claim template"
        )
    if report.classes and not [d for d in gpu_devices if d.driver == DRIVER]:
        out += _plugin_publishes_nothing(snapshot)
    mig_wanted = MIG_CLASS in wanted and snapshot.device_class(MIG_CLASS) is not None
    has_mig = any(d.attr("type") == "mig" for d in gpu_devices)
    full = [d for d in gpu_devices if d.attr("type") == "gpu"]
    if mig_wanted and not has_mig and full and report.template is not None:
        out.append(
            f"the MIG class exists but no MIG device is published ({len(full)} full GPU(s) "
            "only): MIG mode is off or no MIG instances exist. On each GPU node: "
            "`nvidia-smi -i 0 -mig 1`, then create instances, e.g. "
            "`nvidia-smi mig -cgi 19,19,19,19 -C` (1g profiles) or `nvidia-smi mig -cgi 14,14 -C`"
            ", then restart the kubelet plugin pod so it publishes them"
        )
    for req in report.requests:
        if req.errors or snapshot.device_class(req.device_class) is None:
            continue
        if not req.matches and (has_mig or full):
            out.append(_nothing_matches(req, gpu_devices))
        elif req.matches and not req.free:
            states = Counter(m.state for m in req.matches)
            whys = sorted({m.why for m in req.matches if m.why})[:5]
            out.append(
                f"request {req.name}: every matching device is unavailable "
                f"({', '.join(f'{n} {s}' for s, n in sorted(states.items()))}): "
                + "; ".join(whys)
            )
    return out


def _nothing_matches(req, gpu_devices: list[Device]) -> str:
    kinds = Counter(
        (str(d.attr("type", "?")), str(d.attr("profile") or ""), str(d.attr("productName", "?")))
        for d in gpu_devices
    )
    listing = ", ".join(
        f"{n}x {t}{(' ' + p) if p else ''} ({prod})" for (t, p, prod), n in sorted(kinds.items())
    )
    profiles = sorted({p for (_, p, _) in kinds if p})
    hint = (
        f"; MIG profiles published: {', '.join(profiles)} (use one of these exact strings)"
        if profiles else ""
    )
    return (
        f"request {req.name}: no device matches DeviceClass {req.device_class} with selector(s) "
        f"{' && '.join(req.selectors) or '(none)'}; published: {listing}{hint}"
    )


def _plugin_publishes_nothing(snapshot: Snapshot) -> list[str]:
    head = (
        "the NVIDIA DeviceClasses exist but no ResourceSlice publishes a GPU: the driver's "
        "kubelet plugin publishes nothing on any node"
    )
    plugins = [
        ds for ds in snapshot.daemonsets
        if "kubelet-plugin" in ds.get("metadata", {}).get("name", "")
    ]
    if not plugins:
        return [
            head + ". Compare its DaemonSet's nodeSelector with your GPU nodes' labels: "
            "`kubectl get ds -A -l app.kubernetes.io/name=nvidia-dra-driver-gpu -o "
            "jsonpath='{..nodeSelector}'`, then `kubectl label node <gpu-node> <key>=<value>` "
            "(add DaemonSets and Nodes to the snapshot and preflight prints the exact command)"
        ]
    out = []
    gpu_nodes = [n for n in snapshot.nodes if _is_gpu_node(n)]
    for ds in plugins:
        meta = ds["metadata"]
        selector = (((ds.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
            "nodeSelector"
        ) or {}
        where = f"DaemonSet {meta.get('namespace', '')}/{meta['name']}"
        if not selector:
            out.append(f"{head}. {where} has no nodeSelector: check its pods' logs "
                       f"(`kubectl -n {meta.get('namespace', '')} logs ds/{meta['name']}`)")
            continue
        wanted = " ".join(f"{k}={v}" for k, v in sorted(selector.items()))
        if not snapshot.nodes:
            out.append(f"{head}. {where} runs only on nodes labelled {wanted}: "
                       f"`kubectl label node <gpu-node> {wanted}`")
            continue
        fixes = []
        for node in gpu_nodes:
            labels = node.get("metadata", {}).get("labels") or {}
            lacking = {k: v for k, v in selector.items() if labels.get(k) != v}
            if lacking:
                fixes.append(
                    f"kubectl label node {node['metadata']['name']} "
                    + " ".join(f"{k}={v}" for k, v in sorted(lacking.items()))
                    + (" --overwrite" if any(k in labels for k in lacking) else "")
                )
        if fixes:
            out.append(f"{head}. {where} selects nodes labelled {wanted}, which "
                       f"{len(fixes)} GPU node(s) lack: " + "; ".join(f"`{f}`" for f in fixes))
        elif gpu_nodes:
            out.append(f"{head}. {where} selects {wanted} and the GPU nodes have it: check the "
                       f"plugin pods (`kubectl -n {meta.get('namespace', '')} get pods -o wide`"
                       "; a crash loop with `invalid CDI Spec: no devices` means MIG mode is on "
                       "without instances)")
        else:
            out.append(f"{head}. {where} selects {wanted}; no node in the snapshot looks like a "
                       f"GPU node (labels {', '.join(_GPU_NODE_LABELS)} or capacity "
                       "nvidia.com/gpu)")
    return out


def _is_gpu_node(node: dict) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    return any(k in labels for k in _GPU_NODE_LABELS) or "nvidia.com/gpu" in capacity
