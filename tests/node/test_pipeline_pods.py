"""The demo pipeline's pods (compiled/sft.policy.mig-1g-6gb.yaml) on a real node, task by task,
as KFP 2.17 runs a policy-mode run: the admission policy adds the claim to the labelled smoke and
finetune pods, the scheduler allocates a device the DRA driver published, the kubelet asks the
driver to prepare it, containerd starts the container with the claim's CDI edits, the component
prints the guide's lines and exits 0; validate's pod then reloads the adapter the finetune pod
wrote on the shared volume and gives PASS, and gate passes.

Before the first pod, `draslice preflight` says ``ready`` and names the device; the scheduler
must then allocate exactly that device.
"""

from __future__ import annotations

import re
import time

import pytest

from draslice.cluster.names import CLAIM_LABEL
from draslice.tests.node import summary
from draslice.tests.node.conftest import NAMESPACE, REPO
from draslice.tests.node.kfp_pods import CompiledRun
from draslice.tests.node.pods import container_spec, release, run_to_end

PIPELINE = REPO / "compiled" / "sft.policy.mig-1g-6gb.yaml"
TEMPLATE = "mig-1g-6gb"
TASKS = ("smoke", "finetune", "validate", "gate")


def _claim_env(pod: dict) -> str:
    """The variable Kubernetes' test driver sets for the claim's request (claim_<claim>_<req>)."""
    claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    return re.sub(r"[^a-zA-Z0-9]", "_", f"claim_{claim}_gpu_slice")


@pytest.fixture(scope="module")
def sft_run(node_cluster, preflight):
    """Run the pipeline's tasks in order; every pod is kept for the tests below."""
    code, before, output = preflight("--template", TEMPLATE, "-n", NAMESPACE)
    run = CompiledRun(PIPELINE, f"r{int(time.time())}", node_cluster.data_host)
    ended = {}
    for task in TASKS:
        task_pod = run.pod(task, NAMESPACE, node_cluster.trainer_image)
        ended[task] = run_to_end(node_cluster.node, task_pod.pod, timeout=600)
        if ended[task].phase != "Succeeded":
            break
        run.collect(task_pod)
    yield {"preflight": (code, before, output), "ended": ended, "run": run}
    release(node_cluster.admin, [e.name for e in ended.values()])


def test_preflight_said_ready_and_named_the_device_the_scheduler_allocated(sft_run,
                                                                           node_cluster):
    code, report, output = sft_run["preflight"]
    assert code == 0 and report and report["decision"] == "ready", output
    predicted = [f"{d['driver']}/{d['pool']}/{d['device']}" for d in report["allocation"]]
    assert sft_run["ended"]["smoke"].devices == predicted


def test_smoke_pod_got_its_slice_from_the_driver_and_passed(sft_run, node_cluster):
    smoke = sft_run["ended"]["smoke"]
    assert smoke.phase == "Succeeded", smoke.log
    assert smoke.pod["metadata"]["labels"][CLAIM_LABEL] == TEMPLATE
    # the admission policy put the claim on the pod and on its container main
    assert smoke.pod["spec"]["resourceClaims"] == [
        {"name": TEMPLATE, "resourceClaimTemplateName": TEMPLATE}]
    assert smoke.pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": TEMPLATE}]
    devices = smoke.devices
    assert len(devices) == 1 and devices[0].startswith("gpu.nvidia.com/draslice-node/")
    assert "matmul_on_slice: OK" in smoke.log
    # the claim reached the container: the driver's CDI edit is in the spec containerd ran
    spec = container_spec(node_cluster.node, smoke.pod)
    assert f"{_claim_env(smoke.pod)}=true" in spec["process"]["env"]
    summary.record("pod smoke", f"pod smoke: Succeeded (claim {devices[0]})")


def test_finetune_pod_trained_on_its_slice(sft_run, node_cluster):
    finetune = sft_run["ended"]["finetune"]
    assert finetune.phase == "Succeeded", finetune.log
    assert "LoRA SFT on CPU: OK" in finetune.log
    assert "[slice] peak_mem=" in finetune.log
    assert len(finetune.devices) == 1
    spec = container_spec(node_cluster.node, finetune.pod)
    assert f"{_claim_env(finetune.pod)}=true" in spec["process"]["env"]
    summary.record("pod finetune", "pod finetune: Succeeded")


def test_validate_reloads_the_adapter_from_the_volume_and_passes(sft_run):
    validate = sft_run["ended"]["validate"]
    assert validate.phase == "Succeeded", validate.log
    assert "resourceClaims" not in validate.pod["spec"]  # no label, no claim: a CPU step
    outputs = sft_run["run"].outputs["validate"]
    assert outputs["passed"] is True, outputs["verdict"]
    assert outputs["verdict"].startswith("verdict: PASS"), outputs["verdict"]
    gate = sft_run["ended"]["gate"]
    assert gate.phase == "Succeeded", gate.log


def test_every_container_ran_as_uid_1000_under_restricted(sft_run, node_cluster):
    admin = node_cluster.admin
    ns = admin.get("Namespace", NAMESPACE)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for task in TASKS:
        spec = container_spec(node_cluster.node, sft_run["ended"][task].pod)
        assert spec["process"]["user"]["uid"] == 1000, task
        assert spec["process"]["noNewPrivileges"] is True, task
    # the namespace really enforces it: the same pod as root is refused at admission
    from draslice.tests.realcluster.kube import KubeError

    pod = sft_run["run"].pod("smoke", NAMESPACE, node_cluster.trainer_image).pod
    pod["metadata"]["name"] = "as-root"
    pod["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0}
    with pytest.raises(KubeError) as refused:
        admin.create(pod, dry_run=True)
    assert "violates PodSecurity \"restricted:latest\"" in str(refused.value)
