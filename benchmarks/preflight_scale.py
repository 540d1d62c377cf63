"""How fast preflight judges a big cluster: 1,000 nodes x 8 devices, 2 claim templates.

Target (issues 4 and 12): the evaluation of both templates in under 1 s on one core, decided by
the upstream Go allocator (cluster/allocator). The script pins itself to one CPU (the allocator
process inherits it), generates a snapshot in memory (v1 ResourceSlices as the NVIDIA driver
publishes them: per node 7 MIG devices of mixed profiles and 1 full GPU, plus the driver's
DeviceClasses and ResourceClaims holding a third of the devices), then times

- ``build``: turning the ResourceSlices into the device model (pools, generations, counters),
- ``evaluate``: both templates (a MIG 1g.10gb slice and a time-shared full GPU) in one run of
  the allocator program: the input as JSON, Kubernetes' CEL on every device for the counts,
  the allocator node by node until one serves the claim, and the report built from the answer.

Prints each repeat, the best and median, and the load average beside them (the machine is
shared, so read the figures with it).

    python benchmarks/preflight_scale.py [--nodes 1000] [--devices 8] [--repeats 5]
        [--kubernetes-version 1.37]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

PROFILES = ("1g.10gb", "1g.10gb", "1g.10gb", "2g.20gb", "2g.20gb", "3g.40gb", "1g.20gb")
MEMORY = {"1g.10gb": "9728Mi", "2g.20gb": "19968Mi", "3g.40gb": "40192Mi", "1g.20gb": "19968Mi"}


def _attrs(**values) -> dict:
    out = {}
    for k, v in values.items():
        kind = "version" if k.endswith("Version") or k == "cudaComputeCapability" else "string"
        out[k] = {kind: v}
    return out


def generate(nodes: int, per_node: int) -> list[dict]:
    """ResourceSlices, DeviceClasses and ResourceClaims of a large MIG cluster (v1 shape)."""
    from draslice.cluster.snapshot import NVIDIA_DEVICE_CLASSES

    objects: list[dict] = [dict(c) for c in NVIDIA_DEVICE_CLASSES]
    results = []
    for n in range(nodes):
        node = f"gpu-node-{n:04d}"
        common = dict(productName="NVIDIA A100-SXM4-80GB", architecture="Ampere", brand="Nvidia",
                      driverVersion="580.126.20", cudaDriverVersion="13.0.0",
                      cudaComputeCapability="8.0.0")
        devices = [{
            "name": "gpu-0",
            "attributes": {**_attrs(type="gpu", uuid=f"GPU-{n:08d}-0", **common),
                           "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"}},
            "capacity": {"memory": {"value": "81920Mi"}},
        }]
        for i in range(per_node - 1):
            profile = PROFILES[i % len(PROFILES)]
            devices.append({
                "name": f"gpu-1-mig-{profile.replace('.', '')}-{i}",
                "attributes": _attrs(type="mig", profile=profile, uuid=f"MIG-{n:08d}-{i}",
                                     parentUUID=f"GPU-{n:08d}-1", **common),
                "capacity": {"memory": {"value": MEMORY[profile]},
                             "multiprocessors": {"value": "14"}},
            })
        objects.append({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com-abcde"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices},
        })
        for d in devices[::3]:  # a third of the devices are allocated
            results.append({"request": "gpu-slice", "driver": "gpu.nvidia.com", "pool": node,
                            "device": d["name"]})
    for i in range(0, len(results), 2):
        objects.append({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"job-{i}", "namespace": "team"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results[i:i + 2]}}},
        })
    return objects


def _children_cpu() -> float:
    """CPU seconds of finished child processes (the allocator program) so far."""
    usage = os.times()
    return usage.children_user + usage.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=8, help="devices per node")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kubernetes-version", default=None, help="1.34 .. 1.37 (the newest)")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    from draslice.cluster import allocator
    from draslice.cluster.analysis import analyze_many
    from draslice.cluster.snapshot import Snapshot
    from draslice.cluster.templates import mig_claim_template, shared_gpu_claim_template

    objects = generate(args.nodes, args.devices)
    templates = [mig_claim_template("1g.10gb"), shared_gpu_claim_template()]
    version = allocator.check_version(args.kubernetes_version)
    allocator.binary(version)  # built (or found) before timing
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(f"snapshot: {args.nodes} nodes x {args.devices} devices = "
          f"{args.nodes * args.devices} devices, 2 claim templates; pinned to {cpus} CPU; "
          f"Kubernetes {version} allocator")
    builds, evals, cpus_used = [], [], []
    for r in range(args.repeats):
        snap = Snapshot(source="generated")
        for obj in objects:
            snap.add(obj)
        t0 = time.perf_counter()
        snap.inventory  # noqa: B018 (builds and caches the device model)
        t1 = time.perf_counter()
        c1 = time.process_time() + _children_cpu()
        reports = analyze_many(snap, templates, kubernetes_version=version)
        t2 = time.perf_counter()
        c2 = time.process_time() + _children_cpu()
        builds.append(t1 - t0)
        evals.append(t2 - t1)
        cpus_used.append(c2 - c1)
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        summary = "; ".join(
            f"{rep.template}: {rep.decision}, {len(rep.requests[0].matches)} match, "
            f"{len(rep.requests[0].free)} free" for rep in reports
        )
        print(f"repeat {r + 1}: build {t1 - t0:.3f} s, evaluate {t2 - t1:.3f} s wall "
              f"({c2 - c1:.3f} s CPU)  load average {load}  [{summary}]")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"evaluate: best {min(evals):.3f} s, median {statistics.median(evals):.3f} s wall; "
          f"CPU median {statistics.median(cpus_used):.3f} s (this process and the allocator; "
          f"target < 1 s); build: median {statistics.median(builds):.3f} s; load average "
          f"{load} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
