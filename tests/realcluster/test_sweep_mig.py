"""N runs of one sweep on one GPU: each pod the compiled sweep makes for a GPU task gets a MIG
device of its own, all of the same GPU, from the real API server, resourceclaim controller and
scheduler (`make test-cluster`).

The GPU is the A100 80GB of ``a100-80gb-mig-1g10gb.v1alpha3.list.yaml`` in static MIG. That
dump shows one of the GPU's seven ``1g.10gb`` placements (its author elided the others with
``...``); the other six are that device at the other placements: start ``0..6`` in the name
(``gpu-0-mig-<profile id>-<start>-<size>``), ``index`` and ``memorySlice<start>``, a uuid of
their own, and the same ``parentUUID``. The sweep is compiled for ``mig-1g-10gb`` (the
template draslice renders for that profile) with the code that writes ``compiled/``, and each
GPU executor becomes a pod as KFP 2.17 on Argo builds it: in policy mode the executor's labels
and the admission policy adding the claim at CREATE, in native mode the claim the driver
writes from ``podResourceClaims``.
"""

from __future__ import annotations

import copy
import re
import time

import pytest

from draslice.cluster.manifests.podclaim import with_claim
from draslice.cluster.names import CLAIM_LABEL
from draslice.cluster.templates import mig_claim_template
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.sweep.pipeline import DEFAULT_PARALLELISM
from draslice.pipelines.variants import GPU_EXECUTORS, Variant, compile_variant
from draslice.tests.cluster.conftest import load_fixture_objects
from draslice.tests.realcluster.conftest import publish
from draslice.tests.realcluster.pods import claim_of
from draslice.tests.realcluster.scenarios import publishable
from draslice.tests.realcluster.test_admission_policy import (
    OPTED_IN,
    _executors,
    _images,
    _policy_docs,
    _wait_mutating,
    kfp_argo_pod,
)

FIXTURE = "a100-80gb-mig-1g10gb.v1alpha3.list.yaml"
PROFILE, TEMPLATE = "1g.10gb", "mig-1g-10gb"
PLACEMENTS = 7  # 1g.10gb instances an A100 80GB holds


def seven_mig_devices() -> list[dict]:
    """The fixture's GPU with all seven 1g.10gb placements, published as on a 1.37 server."""
    (obj,) = [publishable(o) for o in load_fixture_objects(FIXTURE)]
    (device,) = obj["spec"]["devices"]
    match = re.fullmatch(r"gpu-0-mig-(\d+)-(\d+)-(\d+)", device["name"])
    assert match, device["name"]
    profile_id, start, size = match.groups()
    slice_key = f"memorySlice{start}"
    devices = []
    for placement in range(PLACEMENTS):
        if placement == int(start):  # the dump's own device, as it is
            devices.append(device)
            continue
        d = copy.deepcopy(device)
        d["name"] = f"gpu-0-mig-{profile_id}-{placement}-{size}"
        attrs, capacity = d["basic"]["attributes"], d["basic"]["capacity"]
        attrs["index"] = {"int": placement}
        attrs["uuid"] = {"string": re.sub(r"[0-9a-f]{12}$", f"{placement:012x}",
                                          attrs["uuid"]["string"])}
        capacity[f"memorySlice{placement}"] = capacity.pop(slice_key)
        devices.append(d)
    assert len({d["basic"]["attributes"]["uuid"]["string"] for d in devices}) == PLACEMENTS
    obj["spec"]["devices"] = devices
    return [obj]


def sweep_gpu_pods(tmp_path, mode: ClaimMode) -> list[tuple[str, dict]]:
    """(executor, the pod KFP makes for it) for each GPU executor of the compiled sweep."""
    variant = Variant("sweep", TEMPLATE, mode)
    path = compile_variant(variant, tmp_path)
    executors, images = _executors(path), _images(path)
    pods = []
    for name in GPU_EXECUTORS["sweep"]:
        cfg = executors[name]
        if mode is ClaimMode.POLICY:
            labels = cfg["podMetadata"]["labels"]
            assert labels[CLAIM_LABEL] == TEMPLATE
            pod = kfp_argo_pod("x", OPTED_IN, labels, images[name])
        else:
            assert cfg["podResourceClaims"] == [{"resourceClaimTemplateName": TEMPLATE}]
            pod = kfp_argo_pod("x", OPTED_IN, {}, images[name])
            pod["spec"] = with_claim(pod["spec"], TEMPLATE)  # what the driver writes
        pods.append((name, pod))
    return pods


@pytest.fixture
def one_gpu(cluster):
    kube = cluster.admin
    cluster.reset()
    kube.apply({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": OPTED_IN,
                             "labels": {"draslice.dev/claim-injection": "enabled"}}})
    kube.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "pipeline-runner", "namespace": OPTED_IN}})
    kube.wait(f"the {OPTED_IN}/default service account",
              lambda: kube.get("ServiceAccount", "default", OPTED_IN))
    for doc in _policy_docs():
        kube.apply(doc)
    _wait_mutating(kube)
    kube.apply(mig_claim_template(PROFILE, namespace=OPTED_IN))
    publish(cluster, seven_mig_devices())
    yield kube
    cluster.reset()
    kube.delete("ResourceClaimTemplate", TEMPLATE, OPTED_IN)
    for doc in _policy_docs():
        kube.delete(doc["kind"], doc["metadata"]["name"])


def _bound_device(kube, name: str, timeout: float = 60.0) -> tuple[str, dict]:
    """(node, the allocation result) once the scheduler has bound the pod."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = kube.get("Pod", name, OPTED_IN)
        claim = claim_of(kube, pod)
        results = (((claim or {}).get("status") or {}).get("allocation") or {}).get(
            "devices", {}).get("results") or []
        if pod["spec"].get("nodeName") and results:
            (result,) = results
            return pod["spec"]["nodeName"], result
        time.sleep(0.05)
    conditions = (kube.get("Pod", name, OPTED_IN).get("status") or {}).get("conditions")
    raise TimeoutError(f"pod {name} was not bound within {timeout:.0f} s: {conditions}")


@pytest.mark.parametrize("mode", list(ClaimMode), ids=str)
def test_each_run_of_a_sweep_gets_its_own_mig_device_of_the_same_gpu(one_gpu, tmp_path, mode):
    kube = one_gpu
    parent = {d["name"]: d["basic"]["attributes"]["parentUUID"]["string"]
              for d in seven_mig_devices()[0]["spec"]["devices"]}
    pods = dict(sweep_gpu_pods(tmp_path, mode))
    smoke, train = pods["exec-smoke"], pods["exec-finetune"]
    assert smoke["metadata"]["labels"] == train["metadata"]["labels"]  # the same claim
    assert smoke["spec"].get("resourceClaims") == train["spec"].get("resourceClaims")
    placed = []
    for run in range(DEFAULT_PARALLELISM):  # one sweep, its fine-tunes in flight at once
        pod = copy.deepcopy(train)
        pod["metadata"]["name"] = f"sweep-abc12-run-{run}-finetune"
        created = kube.create(pod)
        assert created["spec"]["resourceClaims"] == [
            {"name": TEMPLATE, "resourceClaimTemplateName": TEMPLATE}]
        node, result = _bound_device(kube, pod["metadata"]["name"])
        print(f"{mode} run {run}: {node} {result['pool']}/{result['device']}")  # -rP
        placed.append((node, result["device"]))
    devices = [device for _, device in placed]
    assert len(set(devices)) == DEFAULT_PARALLELISM, placed  # a device of its own each
    assert {parent[d] for d in devices} == {next(iter(parent.values()))}  # one GPU
    assert {node for node, _ in placed} == {"k8s-dra-driver-cluster-worker"}
