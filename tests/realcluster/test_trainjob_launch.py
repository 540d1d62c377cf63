"""The finetune-trainjob step's create/wait logic (components/trainjob/launch.py) against the
real API server with Kubeflow Trainer's own CRDs (v2.0.0, strict schema and CEL rules), as
KFP's pipeline-runner with only the Role `draslice manifests rbac --trainjobs` gives it.

No Trainer controller runs here, so the test plays its part in one place only: it sets the
TrainJob's ``Complete`` or ``Failed`` condition through the status subresource, as the
controller does when the JobSet ends. Creating, reading, the retry that finds the same
TrainJob, the deletion on timeout and the
refusal without the Role are the real server's.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from draslice.tests.realcluster.conftest import NAMESPACE
from draslice.tests.realcluster.crds import crd_files

REPO = Path(__file__).resolve().parents[2]
SA = "pipeline-runner"
TEMPLATE = "mig-1g-6gb"


def _check(result, what: str) -> str:
    assert result.returncode == 0, f"{what}: exit {result.returncode}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def api(cluster):
    from kubernetes import client

    from draslice.cluster.live import api_client

    trainer = [p for p in crd_files() if "trainer.kubeflow.org" in p.name]
    for path in trainer:
        _check(cluster.cp.kubectl("apply", "--server-side", "-f", str(path)), f"CRD {path}")
    _check(cluster.cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                              "crd/trainjobs.trainer.kubeflow.org"), "CRD established")
    for doc in yaml.safe_load_all((REPO / "manifests" / "21-rbac-trainjob.yaml").read_text()):
        if doc:
            cluster.admin.apply(doc)
    cluster.admin.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": SA, "namespace": NAMESPACE}})
    _, kubeconfig = cluster.cp.as_service_account(NAMESPACE, SA)
    yield client.CustomObjectsApi(api_client(str(kubeconfig)))
    cluster.cp.kubectl("delete", "trainjobs.trainer.kubeflow.org", "--all", "-n", NAMESPACE,
                       "--wait=false")


def _job(cluster, name: str) -> dict | None:
    got = cluster.cp.kubectl("get", "trainjobs.trainer.kubeflow.org", name, "-n", NAMESPACE,
                             "-o", "json")
    return json.loads(got.stdout) if got.returncode == 0 else None


def end_when_created(cluster, name: str, kind: str, message: str) -> threading.Thread:
    """What the Trainer controller does when the JobSet ends: set the condition."""
    def run():
        for _ in range(300):
            if _job(cluster, name) is not None:
                break
            time.sleep(0.1)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {"status": {"conditions": [{"type": kind, "status": "True", "reason": kind,
                                             "message": message, "lastTransitionTime": now}]}}
        _check(cluster.cp.kubectl("patch", "trainjobs.trainer.kubeflow.org", name, "-n",
                                  NAMESPACE, "--subresource=status", "--type=merge", "-p",
                                  json.dumps(status)), f"status of {name}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _launch(api, run_id: str, **kw):
    from draslice.components.trainjob.launch import launch

    return launch(api, TEMPLATE, NAMESPACE, run_id, {"steps": 5, "lora_r": 4},
                  volume=("draslice-data", "/data"), poll_s=0.2, output_dir="/data/runs/x",
                  **kw)


def test_complete_returns_the_stored_trainjob_and_a_retry_waits_for_the_same(cluster, api):
    from draslice.components.trainjob.launch import job_name

    name = job_name("run-complete")
    end_when_created(cluster, name, "Complete", "JobSet completed").join(timeout=0)
    job = _launch(api, "run-complete", num_nodes=2, timeout_s=60)
    assert job["metadata"]["name"] == name
    assert job["spec"]["trainer"]["numNodes"] == 2
    assert job["spec"]["trainer"]["args"] == ["--output-dir", "/data/runs/x", "--steps", "5",
                                              "--lora-r", "4"]
    assert job["spec"]["podSpecOverrides"][0]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "draslice-data"}
    again = _launch(api, "run-complete", num_nodes=2, timeout_s=5)  # the step retried
    assert again["metadata"]["uid"] == job["metadata"]["uid"]


def test_failed_fails_the_step_with_the_controllers_message(cluster, api):
    from draslice.components.trainjob.launch import TrainJobFailed, job_name

    end_when_created(cluster, job_name("run-failed"), "Failed", "node-1 exited 4 (NaN loss)")
    with pytest.raises(TrainJobFailed, match=r"failed: node-1 exited 4 \(NaN loss\)"):
        _launch(api, "run-failed", timeout_s=60)


def test_timeout_deletes_the_trainjob(cluster, api):
    from draslice.components.trainjob.launch import TrainJobFailed, job_name

    with pytest.raises(TrainJobFailed, match="did not end within 1 s: deleted"):
        _launch(api, "run-stuck", timeout_s=1)
    cluster.admin.wait("the stuck TrainJob gone",
                       lambda: _job(cluster, job_name("run-stuck")) is None, timeout=60)


def test_without_the_role_the_step_says_what_to_apply(cluster, api):
    from kubernetes import client

    from draslice.cluster.live import api_client
    from draslice.components.trainjob.launch import TrainJobFailed

    cluster.admin.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": "no-role", "namespace": NAMESPACE}})
    _, kubeconfig = cluster.cp.as_service_account(NAMESPACE, "no-role")
    other = client.CustomObjectsApi(api_client(str(kubeconfig)))
    with pytest.raises(TrainJobFailed, match=r"HTTP 403 .*draslice manifests rbac --trainjobs"):
        _launch(other, "run-denied", timeout_s=5)


def test_the_component_copies_what_the_trainjob_wrote(cluster, api, tmp_path, monkeypatch):
    """The whole step (trainjob.python_func) as KFP runs it, with the volume a local folder:
    the 'controller' writes rank 0's outputs where the TrainJob's args say, then Complete."""
    from kfp import dsl

    from draslice.cluster import live
    from draslice.components.trainjob import trainjob
    from draslice.components.trainjob.launch import RUNS_DIR, job_name

    _, kubeconfig = cluster.cp.as_service_account(NAMESPACE, SA)
    as_runner = live.api_client
    # In a task pod the step loads the pod's service account; here, that account's kubeconfig.
    monkeypatch.setattr(live, "api_client", lambda: as_runner(str(kubeconfig)))
    name = job_name("run-component")
    out = tmp_path / "volume" / RUNS_DIR / name
    (out / "adapter").mkdir(parents=True)
    (out / "adapter" / "adapter_config.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 5, "loss": 1.5}\n')
    end_when_created(cluster, name, "Complete", "JobSet completed")
    adapter = dsl.Model(name="adapter", uri=str(tmp_path / "adapter"), metadata={})
    report = dsl.Markdown(name="report", uri=str(tmp_path / "report.md"), metadata={})
    result = trainjob.python_func(
        claim_template=TEMPLATE, adapter=adapter, report=report, num_nodes=2,
        mount_path=str(tmp_path / "volume"), run_id="run-component", namespace=NAMESPACE,
        timeout_minutes=1, steps=5)
    assert result.job == f"{NAMESPACE}/{name}" and result.state == "Complete"
    assert (tmp_path / "adapter" / "adapter" / "adapter_config.json").is_file()
    assert adapter.metadata["num_nodes"] == 2 and adapter.metadata["num_proc_per_node"] == 1
    text = (tmp_path / "report.md").read_text()
    assert "2 pod(s) × 1 process(es)" in text and '"loss": 1.5' in text
    stored = _job(cluster, name)
    assert stored["spec"]["trainer"]["args"][:2] == ["--output-dir", str(out)]
