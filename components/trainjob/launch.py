"""Launch the fine-tune as a Kubeflow Trainer v2 TrainJob and wait for it: the logic of the
``trainjob`` component, free of kfp so it is tested against a real API server.

The TrainJob is the one :func:`draslice.cluster.manifests.workloads.trainjob` builds (what
``draslice manifests workloads --kind trainjob`` renders), on the TrainingRuntime of the claim
template the admin installed: each of its pods claims its own slice (or its K GPUs), torchrun
starts one process per device. The step creates it through the Kubernetes API (the
``kubernetes`` client the preflight step uses too), reads its ``Complete``/``Failed``
conditions (set by the Trainer controller from the JobSet's) until one is true, and deletes it
when the time is up, so a stuck job does not hold the slices. A retried step finds its TrainJob
by name (the run id) and waits for it instead of starting a second one.

Kubeflow's own LoRA component (kubeflow/pipelines-components) goes through the ``kubeflow``
SDK's TrainerClient, whose trainers build the TrainJob from its own types; here the TrainJob
must be exactly the rendered one (claim, torchrun, runtime by template), so it is sent as is.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from draslice.cluster.manifests.workloads import TRAINER_API, TRAINER_GROUP, trainjob
from draslice.errors import DrasliceError, InvalidParameter

VERSION = TRAINER_API.rpartition("/")[2]
PLURAL = "trainjobs"
COMPLETE, FAILED = "Complete", "Failed"  # trainer.kubeflow.org/v1alpha1 condition types
RUNS_DIR = "runs"  # <mount>/runs/<run id>/: what the TrainJob writes on the volume


class TrainJobFailed(DrasliceError):
    """The TrainJob ended Failed, timed out, or could not be created: the step fails."""

    exit_code = 1


def job_name(run_id: str) -> str:
    """A TrainJob name for a pipeline run: a DNS label, stable across retries of the step.

    Trainer names the JobSet and its pods after it, so it stays short (``MAX_TRAINJOB_NAME``)."""
    if not run_id:
        raise InvalidParameter("run_id", run_id, "must name the pipeline run (its job id)")
    text = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    return f"draslice-{text[:22].strip('-')}-{digest}"  # 9 + 22 + 1 + 8 characters at most


def train_args(knobs: Mapping[str, Any], output_dir: str) -> list[str]:
    """``draslice train`` options for ``knobs``, checked first by the config (bad input: one
    line, exit 2, before anything is created). A knob at the config's default is left out
    unless the finetune preset has a value for it, which ``draslice train`` would start from
    for a real fine-tune instead (a constant rate would become cosine)."""
    from draslice.trainer.config import FINETUNE_KNOBS, KNOBS, SFTConfig, flag
    from draslice.trainer.presets import FINETUNE

    SFTConfig.from_params(dict(knobs))
    preset = FINETUNE.fill({}, FINETUNE_KNOBS)  # what the command fills in where not passed
    args = ["--output-dir", output_dir]
    for name, value in knobs.items():
        if value == KNOBS[name].default and name not in preset:
            continue
        if isinstance(value, bool):
            args.append(flag(name) if value else f"--no-{flag(name)[2:]}")
        else:
            args += [flag(name), str(value)]
    return args


def condition(job: dict) -> tuple[str, str] | None:
    """``(Complete|Failed, message)`` once the TrainJob has ended, else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in (COMPLETE, FAILED) and cond.get("status") == "True":
            return cond["type"], cond.get("message") or cond.get("reason") or ""
    return None


def _api_error(exc, what: str, namespace: str) -> TrainJobFailed:
    hint = {
        403: "the step's service account may not; apply `draslice manifests rbac --trainjobs "
             f"--namespace {namespace}`",
        404: "is Kubeflow Trainer v2 installed (CRD trainjobs.trainer.kubeflow.org) and the "
             "namespace right?",
    }.get(exc.status, "")
    reason = str(exc.reason or "").strip()
    body = str(exc.body or "").strip()[:300]
    return TrainJobFailed(f"{what} in namespace {namespace}: HTTP {exc.status} {reason}"
                          f"{': ' + body if body else ''}{'; ' + hint if hint else ''}")


def create(api, body: dict) -> dict:
    """Create the TrainJob; one of the same name already there (a retried step) is returned
    as it is, and waited for."""
    from kubernetes.client.exceptions import ApiException

    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        return api.create_namespaced_custom_object(TRAINER_GROUP, VERSION, namespace, PLURAL,
                                                   body)
    except ApiException as exc:
        if exc.status != 409:
            raise _api_error(exc, f"creating TrainJob {name}", namespace) from None
    try:
        return api.get_namespaced_custom_object(TRAINER_GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        raise _api_error(exc, f"reading TrainJob {name}", namespace) from None


def wait(api, namespace: str, name: str, timeout_s: float, poll_s: float = 10.0,
         clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> dict:
    """Read the TrainJob every ``poll_s`` until ``Complete`` (returned) or ``Failed`` (raised);
    past ``timeout_s`` it is deleted (its pods and claims go with it) and the step fails."""
    from kubernetes.client.exceptions import ApiException

    deadline = clock() + timeout_s
    while True:
        try:
            job = api.get_namespaced_custom_object(TRAINER_GROUP, VERSION, namespace, PLURAL,
                                                   name)
        except ApiException as exc:
            raise _api_error(exc, f"reading TrainJob {name}", namespace) from None
        ended = condition(job)
        if ended and ended[0] == COMPLETE:
            return job
        if ended:
            raise TrainJobFailed(f"TrainJob {namespace}/{name} failed: {ended[1]} (kubectl -n "
                                 f"{namespace} logs -l jobset.sigs.k8s.io/jobset-name={name})")
        if clock() >= deadline:
            try:
                api.delete_namespaced_custom_object(TRAINER_GROUP, VERSION, namespace, PLURAL,
                                                    name, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise _api_error(exc, f"deleting TrainJob {name}", namespace) from None
            raise TrainJobFailed(f"TrainJob {namespace}/{name} did not end within "
                                 f"{timeout_s:g} s: deleted (its pods and claims with it)")
        sleep(poll_s)


def launch(api, template: str, namespace: str, run_id: str, knobs: Mapping[str, Any],
           num_nodes: int = 1, num_proc_per_node: int | None = None,
           volume: tuple[str, str] | None = None, timeout_s: float = 86400.0,
           poll_s: float = 10.0, output_dir: str = "", queue: str | None = None) -> dict:
    """Build, create and wait for the TrainJob of one pipeline run; returns it, ended."""
    body = trainjob(template, namespace, num_nodes, num_proc_per_node, name=job_name(run_id),
                    args=train_args(knobs, output_dir), volume=volume, queue=queue)
    create(api, body)
    return wait(api, namespace, body["metadata"]["name"], timeout_s, poll_s)
