"""Workloads for users outside KFP: the same image, the same claim, the same commands.

- the seed guide's smoke Pod (``draslice smoke``: nvidia-smi -L, the slice's memory, a checked
  matmul), labelled ``app: dra-smoke`` as in the guide;
- a plain batch Job running ``draslice train`` (what Volcano users adapt: the claim hooks are
  in the pod template, so they carry over unchanged);
- a Kubeflow Trainer v2 TrainingRuntime + TrainJob running ``draslice train`` (the seed's main
  path; Trainer v2 has no DRA field of its own yet, the runtime's pod template carries it).

Every pod gets its claim from :func:`.podclaim.with_claim`, the shape KFP task pods get.
"""

from __future__ import annotations

from draslice.cluster.manifests.podclaim import with_claim
from draslice.cluster.names import validate_dns_label, validate_template_name

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
SMOKE_CONTAINER = "smoke"
TRAIN_CONTAINER = "train"
TRAINER_CONTAINER = "node"  # Trainer v2 runs the trainer in the replicated job "node"
OUTPUT_DIR = "/tmp/draslice-out"

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


def _train_args() -> list[str]:
    return ["train", "--output-dir", OUTPUT_DIR]


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
         "containers": [_container(TRAIN_CONTAINER, image, _train_args())]},
        template, TRAIN_CONTAINER,
    )
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(f"dra-sft-{template}"[:63].rstrip("-"), namespace,
                              {"app": "dra-sft"}),
            "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 86400,
                     "template": {"metadata": {"labels": {"app": "dra-sft"}}, "spec": pod}}}


def training_runtime(template: str, image: str, namespace: str | None = None) -> dict:
    """A Trainer v2 TrainingRuntime whose trainer pod claims ``template`` (the seed's two hooks)."""
    validate_template_name(template)
    pod = with_claim(
        {"restartPolicy": "Never",
         "containers": [_container(TRAINER_CONTAINER, image, _train_args())]},
        template, TRAINER_CONTAINER,
    )
    return {
        "apiVersion": TRAINER_API, "kind": "TrainingRuntime",
        "metadata": _meta(f"draslice-sft-{template}"[:63].rstrip("-"), namespace,
                          {"trainer.kubeflow.org/framework": "torch"}),
        "spec": {
            "mlPolicy": {"numNodes": 1},
            "template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step":
                                            "trainer"}},
                    "spec": {"template": {"spec": pod}},
                },
            }]}},
        },
    }


def train_job_for_runtime(runtime: dict, namespace: str | None = None) -> dict:
    """A TrainJob that runs ``runtime`` as it is."""
    name = runtime["metadata"]["name"]
    return {"apiVersion": TRAINER_API, "kind": "TrainJob",
            "metadata": _meta(name.replace("draslice-sft-", "draslice-sft-run-", 1)[:63]
                              .rstrip("-"), namespace),
            "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org",
                                    "kind": "TrainingRuntime", "name": name}}}


def workloads(template: str, image: str, namespace: str | None = None) -> dict[str, list[dict]]:
    """``{purpose: documents}`` for one claim template."""
    runtime = training_runtime(template, image, namespace)
    return {
        "smoke-pod": [smoke_pod(template, image, namespace)],
        "job": [train_job(template, image, namespace)],
        "trainjob": [runtime, train_job_for_runtime(runtime, namespace)],
    }
