"""The Job `draslice manifests workloads --kind job` renders (manifests/40-workload.job.yaml),
applied as an admin would, runs to completion on the real node with its claimed slice."""

from __future__ import annotations

from draslice.tests.node.conftest import NAMESPACE, REPO, load
from draslice.tests.node.pods import allocated, log_of, release

JOB = REPO / "manifests" / "40-workload.job.yaml"


def test_the_rendered_job_completes_on_the_node(node_cluster):
    admin = node_cluster.admin
    job = load(JOB)[0]
    name = job["metadata"]["name"]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == \
        node_cluster.trainer_image
    node_cluster.kubectl_apply(JOB)
    devices: list[str] = []

    def ended():
        # the devices are read while the pod runs: the claim goes once the pod is done
        for pod in admin.list("Pod", NAMESPACE, labelSelector=f"job-name={name}"):
            if not devices and pod.get("status", {}).get("resourceClaimStatuses"):
                devices.extend(allocated(admin, pod))
        j = admin.get("Job", name, NAMESPACE)
        return j if any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
                        for c in j.get("status", {}).get("conditions") or []) else None

    try:
        done = admin.wait(f"Job {name} complete", ended, timeout=600)
        pods = admin.list("Pod", NAMESPACE, labelSelector=f"job-name={name}")
        assert len(pods) == 1
        log = log_of(node_cluster.node, pods[0], "train")
        assert done["status"].get("succeeded") == 1, log
        assert "LoRA SFT on CPU: OK" in log
        assert len(devices) == 1 and devices[0].startswith("gpu.nvidia.com/draslice-node/")
    finally:
        admin.delete("Job", name, NAMESPACE)
        release(admin, [p["metadata"]["name"] for p in
                        admin.list("Pod", NAMESPACE, labelSelector=f"job-name={name}")])
