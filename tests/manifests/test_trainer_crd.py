"""Every TrainingRuntime and TrainJob draslice renders, validated against Kubeflow Trainer's own
CRD schemas (kubeflow/trainer v2.0.0's ``manifests/base/crds``, taken from its Go module as
tests/realcluster/crds.py pins it), strictly: a field the CRD does not declare fails, as it
does on an API server with ``--validate=strict``.

The CRD's ``openAPIV3Schema`` is JSON Schema except for two Kubernetes extensions, mapped here:
``x-kubernetes-int-or-string`` (an integer or a string) and structural pruning (an object with
``properties`` and no ``additionalProperties`` takes no other field). Its CEL rules
(``x-kubernetes-validations``) and ObjectMeta are checked by the real API server in
tests/realcluster/test_manifests_apply.py, not here.
"""

from __future__ import annotations

import copy
from functools import cache

import jsonschema
import pytest
import yaml

from draslice.cluster.manifests import committed, workloads
from draslice.tests.realcluster.crds import CRD_SOURCES, module_dir

IMAGE = "registry.example.com/draslice/trainer:0.1.0"


def strict(schema: dict) -> dict:
    """The CRD schema as strict JSON Schema (see the module docstring)."""
    node = {k: v for k, v in schema.items() if k != "x-kubernetes-validations"}
    if node.pop("x-kubernetes-int-or-string", False):
        node.pop("type", None)
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node:
        node["properties"] = {k: strict(v) for k, v in node["properties"].items()}
        node.setdefault("additionalProperties", False)
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = strict(node["additionalProperties"])
    if "items" in node:
        node["items"] = strict(node["items"])
    return node


@cache
def validators() -> dict[str, jsonschema.Draft7Validator]:
    """``{kind: validator}`` for the Trainer CRDs."""
    out = {}
    ((module, release, files),) = [s for s in CRD_SOURCES if "kubeflow/trainer" in s[0]]
    for path in files:
        crd = yaml.safe_load((module_dir(module, release) / path).read_text())
        (served,) = [v for v in crd["spec"]["versions"]
                     if f"{crd['spec']['group']}/{v['name']}" == workloads.TRAINER_API]
        out[crd["spec"]["names"]["kind"]] = jsonschema.Draft7Validator(
            strict(served["schema"]["openAPIV3Schema"]))
    return out


def errors(doc: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validators()[doc["kind"]].iter_errors(doc)]


def _rendered() -> list[tuple[str, dict]]:
    docs = [(name, d) for name, text in committed.files(IMAGE).items()
            for d in yaml.safe_load_all(text) if d.get("apiVersion") == workloads.TRAINER_API]
    for template, pods in (("gpus-8", 2), ("shared-gpu-mps", 1), ("mig-2g-12gb", 4)):
        docs += [(f"{template}x{pods}", d) for d in workloads.workloads(
            template, IMAGE, "team-a", pods)["trainjob"]]
    docs.append(("kfp-step", workloads.trainjob(
        "gpus-4", "team-a", 2, name="run-1", args=["--steps", "5"],
        volume=("draslice-data", "/data"), queue="gpu-slices")))
    return docs


RENDERED = _rendered()


def test_the_committed_set_has_distributed_trainjobs():
    jobs = [d for _, d in RENDERED if d["kind"] == "TrainJob"]
    shapes = {(d["spec"]["runtimeRef"]["name"], d["spec"]["trainer"]["numNodes"],
               d["spec"]["trainer"]["numProcPerNode"]) for d in jobs}
    assert ("draslice-sft-mig-1g-6gb", 2, 1) in shapes
    assert ("draslice-sft-gpus-2", 1, 2) in shapes


@pytest.mark.parametrize(("source", "doc"), RENDERED,
                         ids=[f"{n}:{d['kind']}:{d['metadata']['name']}" for n, d in RENDERED])
def test_valid_against_the_trainer_crd(source, doc):
    assert errors(doc) == [], source


@pytest.mark.parametrize("where", ["trainer", "runtime-pod", "ml-policy"])
def test_the_check_fails_on_an_unknown_or_wrong_field(where):
    """Proves the check can fail, at the depths our objects use."""
    runtime = workloads.training_runtime("gpus-2", IMAGE, "team-a")
    job = workloads.trainjob("gpus-2", "team-a")
    if where == "trainer":
        doc = copy.deepcopy(job)
        doc["spec"]["trainer"]["numGPUs"] = 2
    elif where == "runtime-pod":
        doc = copy.deepcopy(runtime)
        pod = doc["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
            "template"]["spec"]
        pod["resourceClaims"][0]["templateName"] = "gpus-2"
    else:
        doc = copy.deepcopy(runtime)
        doc["spec"]["mlPolicy"]["torch"]["numProcPerNode"] = 1.5
    assert errors(doc), where


def test_the_kfp_steps_trainjob_joins_the_queue_and_mounts_the_volume():
    ((_, job),) = [(n, d) for n, d in RENDERED if n == "kfp-step"]
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "gpu-slices"}
    (override,) = job["spec"]["podSpecOverrides"]
    assert override["targetJobs"] == [{"name": "node"}]
    assert override["containers"] == [{"name": "node", "volumeMounts": [
        {"name": "data", "mountPath": "/data"}]}]


def test_each_pod_claims_and_the_processes_match_its_devices():
    runtime, job = workloads.workloads("gpus-2", IMAGE, "kubeflow")["trainjob"]
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpus-2", "resourceClaimTemplateName": "gpus-2"}]
    (node,) = pod["containers"]
    assert node["resources"] == {"claims": [{"name": "gpus-2"}]}
    # torchrun takes nnodes, nproc-per-node, rank and master from Trainer's PET_* variables.
    assert node["command"][:3] == ["python", "-m", "torch.distributed.run"]
    assert "--nnodes" not in node["command"] + node["args"]
    assert runtime["spec"]["mlPolicy"]["torch"] == {"numProcPerNode": 2}
    assert job["spec"]["trainer"] == {"numNodes": 1, "numProcPerNode": 2}


@pytest.mark.slow  # torchrun starts two Python processes: about 10 s on a busy CI machine
def test_the_runtime_command_starts_numprocpernode_processes_from_trainers_variables():
    """The runtime's command, as the Trainer controller runs it: with only the PET_* variables
    its torch plugin sets, torchrun starts PET_NPROC_PER_NODE copies of `draslice train`."""
    import os
    import shutil
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    runtime = workloads.training_runtime("gpus-2", IMAGE)
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]["containers"]
    command = [sys.executable if node["command"][0] == "python" else node["command"][0],
               *node["command"][1:], "--help"]
    bin_dir = str(Path(shutil.which("draslice") or Path(sys.executable).with_name("draslice"))
                  .parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
           "PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "0",
           "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (done.stdout + done.stderr).count("Usage: draslice train") == 2
