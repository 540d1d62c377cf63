"""What the preflight-vs-scheduler test publishes and claims.

Scenarios: every ResourceSlice fixture (tests/fixtures/resourceslices), made publishable the
way the driver would publish it today, plus some derived from them for what the fixtures lack:
device taints, a node with two kinds of GPU, and a partitionable GPU whose MIG devices draw on
shared counters (free, and with one placement already held).

Templates: the four committed ones (manifests/10-claim-templates.yaml), the MIG templates
draslice renders for the profiles the fixtures publish, two with two requests (any two GPUs;
any GPU and an H100, which needs backtracking on a node with one H100) and one with a
``firstAvailable`` list (a MIG slice, else a whole GPU).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml

from draslice.cluster.templates import mig_claim_template
from draslice.tests.cluster.conftest import ALL_FIXTURES, load_fixture_objects

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "kubeflow"
DRIVER = "gpu.nvidia.com"
# Placeholders the fixtures' authors put where a name was (not valid object names).
PLACEHOLDERS = {"<node-name>": "gke-h200-node", "<suffix>": "fixture"}
TAINT = {"key": "draslice.dev/test-maintenance", "value": "planned", "effect": "NoSchedule"}


HOLDERS = "holders"  # namespace of the pods that hold devices before a scenario's pairs run


@dataclass(frozen=True)
class Scenario:
    name: str
    slices: tuple[dict, ...]
    holders: tuple[dict, ...] = ()  # templates (namespace HOLDERS) claimed before the pairs

    def __str__(self) -> str:
        return self.name


def _replace_placeholders(value):
    if isinstance(value, str):
        for old, new in PLACEHOLDERS.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {k: _replace_placeholders(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_placeholders(v) for v in value]
    return value


def publishable(obj: dict) -> dict:
    """The slice as the driver would create it on a 1.37 API server.

    - v1 and v1beta1 slices go in unchanged in their own version (the server converts);
    - v1alpha3 (no longer served for slices) becomes v1beta1, whose device shape it shares
      except that each capacity is ``{value: Q}`` instead of a bare quantity;
    - a pool without ``resourceSliceCount`` (an excerpt lost it; the driver always sets it)
      gets 1; the authors' ``<node-name>``/``<suffix>`` placeholders get names;
    - device names with dots (only the driver reference page's illustrative ``gpu-0-mig-1g.5gb-0``,
      which SOURCES.md says is not what the driver publishes, and which the API server refuses:
      "must not contain dots") get dashes instead.
    """
    obj = _replace_placeholders(copy.deepcopy(obj))
    for device in obj["spec"].get("devices", []):
        device["name"] = device["name"].replace(".", "-")
    if obj["apiVersion"] == "resource.k8s.io/v1alpha3":
        obj["apiVersion"] = "resource.k8s.io/v1beta1"
        for device in obj["spec"].get("devices", []):
            basic = device.get("basic", {})
            basic["capacity"] = {k: v if isinstance(v, dict) else {"value": v}
                                 for k, v in (basic.get("capacity") or {}).items()}
    obj["spec"]["pool"].setdefault("resourceSliceCount", 1)
    meta = obj.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName", "slice-").rstrip("-") + "-fixture"
    obj["metadata"] = {"name": name}
    obj.pop("status", None)
    return obj


def _tainted_h100() -> tuple[dict, ...]:
    """The two H100 nodes with every GPU tainted NoSchedule except gpu-7 of gpu-node-2."""
    out = []
    for obj in map(publishable, load_fixture_objects("h100-80gb-x8-two-nodes.k8s-1.35.list.yaml")):
        if obj["spec"]["driver"] == DRIVER:
            for device in obj["spec"]["devices"]:
                if not (obj["spec"]["nodeName"] == "gpu-node-2" and device["name"] == "gpu-7"):
                    device["taints"] = [dict(TAINT)]
        obj["metadata"]["name"] += "-tainted"
        out.append(obj)
    return tuple(out)


def _partitionable_a100() -> tuple[dict, ...]:
    """One A100 40GB published as partitionable devices, as the driver does with dynamic MIG:
    a counter set (8 memory slices, 98 multiprocessors; counter names are DNS labels) in one
    slice, and in another the full GPU and its MIG placements, each consuming the counters it
    occupies. Attributes are the driver reference page's
    (tests/fixtures/resourceslices/driver-reference-*)."""
    node = "a100-partitionable-node"
    (mig_excerpt,) = load_fixture_objects("driver-reference-mig-device.illustrative.yaml")
    base = mig_excerpt["spec"]["devices"][0]["attributes"]
    counters = {f"memory-slice-{i}": {"value": "1"} for i in range(8)}
    counters["multiprocessors"] = {"value": "98"}

    def device(name, kind, profile, memory, sms, slices):
        attrs = {k: v for k, v in base.items() if k not in ("profile", "uuid", "parentUUID")}
        attrs["type"] = {"string": kind}
        if profile:
            attrs["profile"] = {"string": profile}
        consumed = {f"memory-slice-{i}": {"value": "1"} for i in slices}
        consumed["multiprocessors"] = {"value": str(sms)}
        return {"name": name, "attributes": attrs, "capacity": {"memory": {"value": memory}},
                "consumesCounters": [{"counterSet": "gpu-0-counter-set",
                                      "counters": consumed}]}

    devices = [device("gpu-0", "gpu", None, "40Gi", 98, range(8))]
    devices += [device(f"gpu-0-mig-1g-5gb-{i}", "mig", "1g.5gb", "4864Mi", 14, [i])
                for i in range(7)]
    devices += [device(f"gpu-0-mig-3g-20gb-{i}", "mig", "3g.20gb", "19968Mi", 42,
                       range(i, i + 4)) for i in (0, 4)]
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
    spec = {"driver": DRIVER, "nodeName": node, "pool": pool}
    return (
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
         "metadata": {"name": f"{node}-counters"},
         "spec": {**spec, "sharedCounters": [{"name": "gpu-0-counter-set",
                                              "counters": counters}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
         "metadata": {"name": f"{node}-devices"}, "spec": {**spec, "devices": devices}},
    )


def _mixed_node() -> tuple[dict, ...]:
    """One node with an H100 (gpu-0, from the H100 fixture) and a P100 (gpu-1, from the P100
    fixture, in v1 shape): a claim for "any GPU and an H100" fits only if the any-GPU request
    does not take the H100, which an allocator must find by backtracking."""
    node = "mixed-gpu-node"
    h100 = next(o for o in load_fixture_objects("h100-80gb-x8-two-nodes.k8s-1.35.list.yaml")
                if o["spec"]["driver"] == DRIVER)["spec"]["devices"][0]
    (p100_slice,) = load_fixture_objects("p100-16gb.v1beta1.yaml")
    p100 = copy.deepcopy(p100_slice["spec"]["devices"][0]["basic"])
    devices = [{**copy.deepcopy(h100), "name": "gpu-0"}, {"name": "gpu-1", **p100}]
    return ({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{node}-gpus"},
             "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                      "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}},)


def scenarios() -> list[Scenario]:
    out = [Scenario(name.removesuffix(".yaml"),
                    tuple(publishable(o) for o in load_fixture_objects(name)))
           for name in ALL_FIXTURES]
    out.append(Scenario("h100-x8-two-nodes+device-taints", _tainted_h100()))
    out.append(Scenario("mixed-node-h100+p100", _mixed_node()))
    out.append(Scenario("a100-40gb-partitionable+shared-counters", _partitionable_a100()))
    # one 3g.20gb placement already held: its counters block half the 1g.5gb placements and
    # the whole GPU, though none of those devices is allocated
    out.append(Scenario("a100-40gb-partitionable+3g.20gb-held", _partitionable_a100(),
                        holders=(mig_claim_template("3g.20gb", namespace=HOLDERS),)))
    return out


def committed_templates() -> list[dict]:
    text = (REPO / "manifests" / "10-claim-templates.yaml").read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def _gpu_request(name: str) -> dict:
    return {"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com",
                                      "allocationMode": "ExactCount", "count": 1}}


def templates() -> list[dict]:
    """Every template the comparison claims from, in namespace ``kubeflow``."""
    def template(name: str, requests: list[dict]) -> dict:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"spec": {"devices": {"requests": requests}}}}

    mig_or_gpu = {"name": "gpu-slice", "firstAvailable": [
        {"name": "mig", "deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount",
         "count": 1, "selectors": [{"cel": {"expression":
                                            f'device.attributes["{DRIVER}"].profile == '
                                            '"1g.10gb"'}}]},
        {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
         "count": 1},
    ]}
    h100 = _gpu_request("h100")
    h100_only = f'device.attributes["{DRIVER}"].productName == "NVIDIA H100 80GB HBM3"'
    h100["exactly"]["selectors"] = [{"cel": {"expression": h100_only}}]
    return [
        *committed_templates(),
        mig_claim_template("1g.10gb", namespace=NAMESPACE),
        mig_claim_template("1g.5gb", namespace=NAMESPACE),
        template("two-gpus", [_gpu_request("first"), _gpu_request("second")]),
        template("any-gpu-and-an-h100", [_gpu_request("any"), h100]),
        template("mig-1g-10gb-or-gpu", [mig_or_gpu]),
    ]
