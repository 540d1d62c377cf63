"""The finetune pipelines: a user's model and data fine-tuned in slices of ``template``, built by
one :func:`build` along two choices.

- ``model``: ``volume`` reads the model from ``model_dir`` on the PVC ``pvc_name``;
  ``artifact`` imports it as a Model artifact from the ``base_model_uri`` parameter
  (``s3://``, ``gs://``, ``minio://``, an ``oci://`` model image, or another run's model output).
- ``runner``: ``task`` fine-tunes in one KFP task that claims its slice, after the smoke
  matmul, then validates the adapter (validate reloads the base from the PVC) and gates the run;
  ``trainjob`` creates a Kubeflow Trainer v2 TrainJob of ``num_nodes`` pods, each claiming its
  own slice of ``template`` (with a ``gpus-K`` template, K whole GPUs), torchrun in each pod.
  The step itself claims nothing: it waits for the TrainJob and copies its outputs from the
  volume into the ``adapter`` Model (components/trainjob). The volume must be ReadWriteMany when
  the pods land on several nodes; the template's TrainingRuntime (`draslice manifests workloads
  --kind trainjob --template T`) and the step's Role (`draslice manifests rbac --trainjobs`)
  are installed first. Preflight checks the template as for one pod (``draslice preflight
  --pods N`` checks N before submitting).

Each choice that is compiled has its kind (:data:`KINDS`: the compiled file's stem). A TrainJob's
pods read the model from the volume, so ``artifact`` with ``trainjob`` is refused.

The PVC (model, data, checkpoints) is mounted at ``mount_path`` on the fine-tune task and on
validate. Checkpoints live on the PVC under the run id, so a retried task resumes. The
parameters are the finetune preset's knobs (``trainer/presets.py``) with the preset's values and
the knobs' types (``trainer/config.py``): the signature is built from them, so it cannot drift
from either; a TrainJob's outputs are not validated here, so it leaves validate's knobs out.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from inspect import Parameter

from kfp import dsl, kubernetes

from draslice.cluster.names import validate_template_name
from draslice.components.finetune import finetune
from draslice.components.trainjob import trainjob
from draslice.errors import InvalidParameter
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.steps import (
    DEFAULT_MOUNT,
    DEFAULT_PVC,
    DEFAULT_TEMPLATE,
    READY,
    checks,
    on_the_slice,
    pipeline_name,
    smoke_test,
    verdict,
)
from draslice.trainer.config import KNOBS, VERDICT_KNOBS
from draslice.trainer.presets import FINETUNE

MODELS = ("volume", "artifact")
RUNNERS = ("task", "trainjob")
# The compiled kinds by their choices: the compiled file's stem and the pipeline's name.
KINDS = {"finetune": {"model": "volume", "runner": "task"},
         "finetune-artifact": {"model": "artifact", "runner": "task"},
         "finetune-trainjob": {"model": "volume", "runner": "trainjob"}}

# The pipeline's own parameters, before the knobs; preflight's after them.
_ARTIFACT = [Parameter("base_model_uri", Parameter.POSITIONAL_OR_KEYWORD,
                       annotation=str)]  # required: no model is a sensible default
_TRAINJOB = [Parameter("num_nodes", Parameter.POSITIONAL_OR_KEYWORD, default=2, annotation=int),
             Parameter("num_proc_per_node", Parameter.POSITIONAL_OR_KEYWORD, default=0,
                       annotation=int),
             Parameter("timeout_minutes", Parameter.POSITIONAL_OR_KEYWORD, default=1440,
                       annotation=int)]
_PREFLIGHT = [Parameter("on_missing_dra", Parameter.POSITIONAL_OR_KEYWORD, default="skip",
                        annotation=str),
              Parameter("preflight_source", Parameter.POSITIONAL_OR_KEYWORD, default="auto",
                        annotation=str)]


def kind_of(model: str, runner: str) -> str:
    """The kind compiled for these choices; an unknown or refused choice names itself."""
    if model not in MODELS:
        raise InvalidParameter("model", model, "must be one of " + ", ".join(MODELS))
    if runner not in RUNNERS:
        raise InvalidParameter("runner", runner, "must be one of " + ", ".join(RUNNERS))
    for kind, choice in KINDS.items():
        if choice == {"model": model, "runner": runner}:
            return kind
    raise InvalidParameter("model", model, "must be 'volume' with runner 'trainjob' (a "
                                           "TrainJob's pods read the model from the volume)")


def knobs_of(model: str, runner: str) -> tuple[str, ...]:
    """The knobs these choices expose as parameters, in the preset's order."""
    left_out = {"model_dir"} if model == "artifact" else set()
    if runner == "trainjob":
        left_out |= set(VERDICT_KNOBS)
    return tuple(name for name in FINETUNE.exposed if name not in left_out)


def signature(model: str, runner: str) -> inspect.Signature:
    """The pipeline's parameters: its own, then each knob with its type and the preset's
    value, then preflight's."""
    knobs = [Parameter(name, Parameter.POSITIONAL_OR_KEYWORD, default=FINETUNE.default(name),
                       annotation=KNOBS[name].type) for name in knobs_of(model, runner)]
    own = (_ARTIFACT if model == "artifact" else []) + (_TRAINJOB if runner == "trainjob" else [])
    return inspect.Signature([*own, *knobs, *_PREFLIGHT])


def _description(model: str, runner: str, template: str, mode: ClaimMode, pvc_name: str,
                 mount_path: str) -> str:
    if runner == "trainjob":
        return (f"LoRA/QLoRA fine-tune of a model on PVC {pvc_name} (mounted at {mount_path}) "
                f"as a Kubeflow Trainer v2 TrainJob of num_nodes pods, each claiming "
                f"{template}: preflight, then the TrainJob.")
    what = ("a model imported as a Model artifact, on data from PVC" if model == "artifact"
            else "a model on PVC")
    return (f"LoRA/QLoRA fine-tune of {what} {pvc_name} (mounted at {mount_path}) on a DRA GPU "
            f"slice (claim template {template}, claim mode {mode.value}): preflight, smoke "
            "matmul, fine-tune, validate, gate.")


def build(template: str = DEFAULT_TEMPLATE, mode: str | ClaimMode = ClaimMode.POLICY,
          kueue_queue: str | None = None, pvc_name: str = DEFAULT_PVC,
          mount_path: str = DEFAULT_MOUNT, *, model: str = "volume",
          runner: str = "task") -> Callable:
    """The finetune pipeline for ``model`` x ``runner`` whose GPU pods claim ``template``.

    ``mode`` changes nothing for a TrainJob (its pods get their claims from the
    TrainingRuntime, not from KFP), so its name carries none.
    """
    validate_template_name(template)
    mode = ClaimMode.parse(mode)
    kind = kind_of(model, runner)
    params = signature(model, runner)
    knobs = knobs_of(model, runner)

    def pipeline_func(*args) -> None:  # kfp passes the parameters in signature order
        given = params.bind(*args).arguments
        values = {name: given[name] for name in knobs}
        base = None
        if model == "artifact":
            base = dsl.importer(artifact_uri=given["base_model_uri"], artifact_class=dsl.Model,
                                reimport=False)
            base.set_display_name("base model")
        pre = checks(template, given["on_missing_dra"], given["preflight_source"])
        with dsl.If(pre.outputs["decision"] == READY, name="slice-available"):
            if runner == "trainjob":
                _trainjob(template, kueue_queue, pvc_name, mount_path, given, values)
            else:
                _task(template, mode, kueue_queue, pvc_name, mount_path, base, values)

    pipeline_func.__signature__ = params
    pipeline_func.__name__ = kind.replace("-", "_")
    return dsl.pipeline(
        name=pipeline_name(kind, template, ClaimMode.POLICY if runner == "trainjob" else mode),
        description=_description(model, runner, template, mode, pvc_name, mount_path),
    )(pipeline_func)


def _task(template: str, mode: ClaimMode, kueue_queue: str | None, pvc_name: str,
          mount_path: str, base, values: dict) -> None:
    """Smoke, the fine-tune on the slice, then validate and the gate."""
    verdict_knobs = {name: values.pop(name) for name in VERDICT_KNOBS}
    smoke_task = smoke_test(template, mode, values["device"], values["slice_memory_gib"],
                            kueue_queue)
    model = {"base_model": base.output} if base is not None else {}
    train = finetune(mount_path=mount_path, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, **model,
                     **values).after(smoke_task)
    on_the_slice(train, "fine-tune", template, mode, kueue_queue, pvc_name, mount_path)
    verdict(train, template, mode, verdict_knobs["memory_headroom"],
            verdict_knobs["min_loss_drop"], base.output if base is not None else None,
            pvc_name=pvc_name, mount_path=mount_path, smoke=smoke_task)


def _trainjob(template: str, kueue_queue: str | None, pvc_name: str, mount_path: str,
              given: dict, values: dict) -> None:
    """The TrainJob step: it creates the TrainJob, waits for it, and copies its outputs."""
    train = trainjob(
        claim_template=template,
        num_nodes=given["num_nodes"],
        num_proc_per_node=given["num_proc_per_node"],
        pvc_name=pvc_name,
        mount_path=mount_path,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        kueue_queue=kueue_queue or "",
        timeout_minutes=given["timeout_minutes"],
        **values,
    )
    train.set_display_name("fine-tune (TrainJob)")
    train.set_caching_options(False)  # data on a PVC can change under one name
    kubernetes.mount_pvc(train, pvc_name=pvc_name, mount_path=mount_path)
