"""The rendered set committed under ``manifests/``: ``draslice manifests all`` writes exactly this.

A test re-renders it and fails when a committed file is stale. Everything is for KFP's
single-user defaults (namespace ``kubeflow``, service account ``pipeline-runner``) and the two
templates the committed pipelines claim (``mig-1g-6gb``, ``shared-gpu-timeslice``), plus one
bigger MIG profile and MPS sharing as examples.
"""

from __future__ import annotations

from draslice.cluster.manifests import admission, kueue, rbac, workloads, yamlio
from draslice.cluster.manifests.claim_templates import claim_templates, sharing_from_options

NAMESPACE = rbac.DEFAULT_NAMESPACE
PROFILES = ("1g.6gb", "2g.12gb")
GPU_COUNTS = (2,)  # whole GPUs in one pod (gpus-2), for a TrainJob of 2 processes in a pod
WORKLOAD_TEMPLATE = "mig-1g-6gb"
# Distributed TrainJobs: (file, template, pods); processes per pod follow the template.
DISTRIBUTED = (("trainjob.2-pods", WORKLOAD_TEMPLATE, 2), ("trainjob.gpus-2", "gpus-2", 1))
REGENERATE = "draslice manifests all --out manifests"


def header(what: str, command: str) -> str:
    """The comment every rendered file starts with."""
    return (f"{what}\nRendered by: {command}\n"
            f"Generated file: do not edit; regenerate with `{REGENERATE}`.")


def files(image: str) -> dict[str, str]:
    """``{filename: YAML text}`` of the committed set, in install order."""
    out: dict[str, str] = {}
    templates = claim_templates(
        PROFILES, [sharing_from_options("timeslicing"), sharing_from_options("mps")], NAMESPACE,
        GPU_COUNTS,
    )
    out["10-claim-templates.yaml"] = yamlio.dump(templates, header(
        "ResourceClaimTemplates: one MIG slice per pod, a shared full GPU, or 2 whole GPUs.",
        f"draslice manifests claim-templates --profile 1g.6gb --profile 2g.12gb "
        f"--shared timeslicing --shared mps --gpus 2 --namespace {NAMESPACE}"))
    out["20-rbac.yaml"] = yamlio.dump(rbac.rbac(NAMESPACE), header(
        "Read-only DRA access for KFP's pipeline-runner (preflight reads the cluster).",
        f"draslice manifests rbac --namespace {NAMESPACE}"))
    out["21-rbac-trainjob.yaml"] = yamlio.dump(rbac.trainjob_rbac(NAMESPACE), header(
        "For the finetune-trainjob pipelines: pipeline-runner may create, get and delete "
        "TrainJobs.",
        f"draslice manifests rbac --trainjobs --namespace {NAMESPACE}"))
    for engine in admission.ENGINES:
        out[f"30-admission-policy.{engine}.yaml"] = yamlio.dump(
            admission.admission_policy(engine), header(
                f"Policy claim mode, engine {engine}: labelled task pods get their claim. "
                f"Opt a namespace in with: {admission.opt_in_command(NAMESPACE)}",
                f"draslice manifests admission-policy --engine {engine}"))
    for purpose, docs in workloads.workloads(WORKLOAD_TEMPLATE, image, NAMESPACE).items():
        out[f"40-workload.{purpose}.yaml"] = yamlio.dump(docs, header(
            f"Outside KFP: {purpose} on claim template {WORKLOAD_TEMPLATE}.",
            f"draslice manifests workloads --kind {purpose} --template {WORKLOAD_TEMPLATE} "
            f"--namespace {NAMESPACE}"))
    for purpose, template, pods in DISTRIBUTED:
        docs = workloads.workloads(template, image, NAMESPACE, pods)["trainjob"]
        out[f"40-workload.{purpose}.yaml"] = yamlio.dump(docs, header(
            f"Outside KFP: a TrainJob of {pods} pod(s) on claim template {template}, each pod "
            "its own claim, one torchrun process per device.",
            f"draslice manifests workloads --kind trainjob --template {template} "
            f"--num-nodes {pods} --namespace {NAMESPACE}"))
    out["50-kueue.yaml"] = yamlio.dump(kueue.queues(NAMESPACE), header(
        f"Kueue quota on slices (Kueue {kueue.MIN_VERSION}+); pair with 50-kueue-config.yaml.",
        f"draslice manifests kueue --namespace {NAMESPACE}"))
    out["50-kueue-config.yaml"] = yamlio.dump([kueue.configuration_fragment()], header(
        "Merge into Kueue's controller Configuration (ConfigMap kueue-manager-config), "
        "then restart kueue-controller-manager. Not an object to kubectl apply.",
        "draslice manifests kueue --config"))
    return out
