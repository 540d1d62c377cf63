"""Workloads for users outside KFP: the same image, the same claim, the same commands.

- the seed guide's smoke Pod (``draslice smoke``: nvidia-smi -L, the slice's memory, a checked
  matmul), labelled ``app: dra-smoke`` as in the guide;
- a plain batch Job running ``draslice train`` (what Volcano users adapt: the claim hooks are
  in the pod template, so they carry over unchanged);
- a Kubeflow Trainer v2 TrainingRuntime + TrainJob running ``draslice train`` under torchrun
  (the seed's main path; Trainer v2 has no DRA field of its own yet, the runtime's pod template
  carries it): ``numNodes`` pods, each with its own claim, of ``numProcPerNode`` processes.

Every pod gets its claim from :func:`.podclaim.with_claim`, the shape KFP task pods get.
"""

from __future__ import annotations

from draslice.cluster.manifests.kueue import QUEUE_LABEL, check_queue_name
from draslice.cluster.manifests.podclaim import with_claim
from draslice.cluster.names import validate_dns_label, validate_template_name
from draslice.cluster.templates import devices_per_pod
from draslice.errors import InvalidParameter

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_API = f"{TRAINER_GROUP}/v1alpha1"
TRAINER_JOB = "node"  # the replicated job Trainer v2's torch plugin configures
SMOKE_CONTAINER = "smoke"
TRAIN_CONTAINER = "train"
TRAINER_CONTAINER = "node"  # Trainer v2 runs the trainer in the container "node"
# torchrun (rank and world from Trainer's PET_* variables) starting the `draslice` console
# script once per process: the TrainJob's args are `draslice train` options only.
TORCHRUN = ("python", "-m", "torch.distributed.run", "--no-python", "draslice", "train")
OUTPUT_DIR = "/tmp/draslice-out"
DATA_VOLUME = "data"
# Trainer names the JobSet, its Job and the pods' hostnames after a TrainJob
# (<name>-node-0-0.<name> is torchrun's master address): a short name keeps them DNS labels.
MAX_TRAINJOB_NAME = 40

# The pod security the trainer image is built for (uid 1000, Pod Security "restricted").
_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _container(name: str, image: str, args: list[str]) -> dict:
    return {"name": name, "image": image, "command": ["draslice"], "args": args,
            "securityContext": dict(_SECURITY)}


def _train_options() -> list[str]:
    """``draslice train``'s options in these workloads (outputs in the pod, read its log)."""
    return ["--output-dir", OUTPUT_DIR]


def _meta(name: str, namespace: str | None, labels: dict | None = None) -> dict:
    meta: dict = {"name": name}
    if namespace:
        meta["namespace"] = validate_dns_label(namespace, "namespace")
    if labels:
        meta["labels"] = labels
    return meta


def smoke_pod(template: str, image: str, namespace: str | None = None) -> dict:
    """The seed's smoke Pod: claims one slice, prints what it sees, runs a checked matmul."""
    validate_template_name(template)
    spec = with_claim(
        {"restartPolicy": "Never",
         "containers": [_container(SMOKE_CONTAINER, image, ["smoke"])]},
        template, SMOKE_CONTAINER,
    )
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(f"dra-smoke-{template}"[:63].rstrip("-"), namespace,
                              {"app": "dra-smoke"}),
            "spec": spec}


def train_job(template: str, image: str, namespace: str | None = None) -> dict:
    """A batch Job running the LoRA SFT on one slice (Volcano users: same pod template)."""
    validate_template_name(template)
    pod = with_claim(
        {"restartPolicy": "Never",
         "containers": [_container(TRAIN_CONTAINER, image, ["train", *_train_options()])]},
        template, TRAIN_CONTAINER,
    )
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(f"dra-sft-{template}"[:63].rstrip("-"), namespace,
                              {"app": "dra-sft"}),
            "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 86400,
                     "template": {"metadata": {"labels": {"app": "dra-sft"}}, "spec": pod}}}


def check_topology(template: str, num_nodes: int, num_proc_per_node: int) -> tuple[int, int]:
    """Pods and processes per pod: whole numbers from 1, one process per device the pod's claim
    gives (``gpus-K``: K; a MIG slice or a shared GPU: 1). One error line, exit 2, otherwise."""
    for name, value in (("num_nodes", num_nodes), ("num_proc_per_node", num_proc_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameter(name, value, "must be a whole number >= 1")
    devices = devices_per_pod(template)
    if num_proc_per_node != devices:
        raise InvalidParameter(
            "num_proc_per_node", num_proc_per_node,
            f"must be {devices}: a pod claiming {template} gets {devices} device(s), one per "
            "process (a CUDA process uses one MIG device; for K whole GPUs in a pod claim "
            "gpus-K)")
    return num_nodes, num_proc_per_node


def runtime_name(template: str) -> str:
    """The TrainingRuntime of a claim template: one per template, its pods claim it."""
    return f"draslice-sft-{validate_template_name(template)}"[:63].rstrip("-")


def training_runtime(template: str, image: str, namespace: str | None = None) -> dict:
    """A Trainer v2 TrainingRuntime whose every trainer pod claims ``template``.

    The pod template carries the claim (Trainer v2.0 has no DRA field, and a TrainJob's
    ``podSpecOverrides`` cannot add one), so each of a TrainJob's ``numNodes`` pods gets its own
    ResourceClaim from the template. The torch ML policy makes the controller set torchrun's
    ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and
    ``PET_MASTER_PORT``, which ``torch.distributed.run`` reads as its defaults: the launcher
    needs no option of its own, and ``numNodes``/``numProcPerNode`` are decided by the TrainJob.
    """
    pod = with_claim(
        {"restartPolicy": "Never",
         "containers": [{**_container(TRAINER_CONTAINER, image, _train_options()),
                         "command": list(TORCHRUN)}]},
        template, TRAINER_CONTAINER,
    )
    return {
        "apiVersion": TRAINER_API, "kind": "TrainingRuntime",
        "metadata": _meta(runtime_name(template), namespace,
                          {"trainer.kubeflow.org/framework": "torch"}),
        "spec": {
            "mlPolicy": {"numNodes": 1,
                         "torch": {"numProcPerNode": devices_per_pod(template)}},
            "template": {"spec": {"replicatedJobs": [{
                "name": TRAINER_JOB,
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step":
                                            "trainer"}},
                    "spec": {"template": {"spec": pod}},
                },
            }]}},
        },
    }


def trainjob(template: str, namespace: str | None = None, num_nodes: int = 1,
             num_proc_per_node: int | None = None, name: str | None = None,
             args: list[str] | None = None, volume: tuple[str, str] | None = None,
             queue: str | None = None) -> dict:
    """A TrainJob on the runtime of ``template`` (:func:`training_runtime`): ``num_nodes`` pods,
    each with its own claim from the template, of ``num_proc_per_node`` torchrun processes
    (default: one per device a pod gets). ``args`` replace the runtime's ``draslice train``
    options; ``volume`` (PVC name, mount path) is mounted on every trainer pod; with ``queue``
    Kueue admits the TrainJob against that LocalQueue's quota."""
    if num_proc_per_node is None:
        num_proc_per_node = devices_per_pod(template)
    check_topology(template, num_nodes, num_proc_per_node)
    runtime_ref = runtime_name(template)
    trainer: dict = {"numNodes": num_nodes, "numProcPerNode": num_proc_per_node}
    if args is not None:
        trainer["args"] = list(args)
    default = runtime_ref.replace("draslice-sft-", "draslice-sft-run-", 1)
    if num_nodes != 1:
        default += f"-{num_nodes}-pods"
    spec: dict = {"runtimeRef": {"apiGroup": TRAINER_GROUP, "kind": "TrainingRuntime",
                                 "name": runtime_ref},
                  "trainer": trainer}
    if volume is not None:
        pvc, mount_path = volume
        spec["podSpecOverrides"] = [{
            "targetJobs": [{"name": TRAINER_JOB}],
            "volumes": [{"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": pvc}}],
            "containers": [{"name": TRAINER_CONTAINER,
                            "volumeMounts": [{"name": DATA_VOLUME, "mountPath": mount_path}]}],
        }]
    return {"apiVersion": TRAINER_API, "kind": "TrainJob",
            "metadata": _meta(name or default[:MAX_TRAINJOB_NAME].rstrip("-"), namespace,
                              {QUEUE_LABEL: check_queue_name(queue)} if queue else None),
            "spec": spec}


def workloads(template: str, image: str, namespace: str | None = None, num_nodes: int = 1,
              num_proc_per_node: int | None = None) -> dict[str, list[dict]]:
    """``{purpose: documents}`` for one claim template; the TrainJob runs ``num_nodes`` pods of
    ``num_proc_per_node`` processes (default: one per device the template gives a pod)."""
    runtime = training_runtime(template, image, namespace)
    return {
        "smoke-pod": [smoke_pod(template, image, namespace)],
        "job": [train_job(template, image, namespace)],
        "trainjob": [runtime, trainjob(template, namespace, num_nodes, num_proc_per_node)],
    }
