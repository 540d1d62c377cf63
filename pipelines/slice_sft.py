"""The main pipeline, ``preflight -> smoke -> sft -> validate -> gate``, its canary, and
``finetune``: the same flow on a user's model (from a PVC or a Model artifact) and data.

The claim template and claim mode are fixed when compiling (pod labels and platform specs are
static in KFP), so each is a factory that returns a pipeline for one template and mode. Only
``smoke`` and ``sft`` claim the slice: preflight must answer without one, and validate/gate
work on files.

No ``from __future__ import annotations`` here: kfp reads the pipeline signature's types.
"""


import inspect
from collections.abc import Callable

from kfp import dsl, kubernetes

from draslice.cluster.names import validate_template_name
from draslice.components.finetune import finetune
from draslice.components.gate import gate
from draslice.components.preflight import preflight
from draslice.components.sft import sft
from draslice.components.smoke import smoke
from draslice.components.validate import validate
from draslice.errors import InvalidParameter
from draslice.pipelines.claim import ClaimMode, bind_claim

DEFAULT_TEMPLATE = "mig-1g-6gb"
# Where the finetune pipeline's base model comes from -> the pipeline's kind (its name, and
# its file stem in compiled/).
MODEL_SOURCES = {"pvc": "finetune", "artifact": "finetune-artifact"}
DEFAULT_PVC = "draslice-data"
DEFAULT_MOUNT = "/data"
READY = "ready"


def pipeline_name(kind: str, template: str, mode: ClaimMode) -> str:
    suffix = "" if mode is ClaimMode.POLICY else f"-{mode.value}"
    return f"draslice-{kind}-{template}{suffix}"


def _checks(claim_template: str, on_missing_dra: str, source: str):
    pre = preflight(claim_template=claim_template, on_missing_dra=on_missing_dra, source=source)
    pre.set_caching_options(False)  # it reports on the cluster as it is now
    pre.set_display_name("preflight")
    return pre


def _smoke(template: str, mode: ClaimMode, device: str, slice_memory_gib: float,
           kueue_queue: str | None):
    task = smoke(device=device, slice_memory_gib=slice_memory_gib)
    task.set_caching_options(False)  # a cached smoke proves nothing about today's slice
    task.set_display_name("smoke matmul")
    return bind_claim(task, template, mode, kueue_queue=kueue_queue)


def build_sft_pipeline(
    template: str = DEFAULT_TEMPLATE, mode: str | ClaimMode = ClaimMode.POLICY,
    kueue_queue: str | None = None,
) -> Callable:
    """The seed guide's flow as a KFP pipeline whose GPU tasks claim ``template``.

    With ``kueue_queue`` the GPU tasks' pods join that Kueue LocalQueue.
    """
    validate_template_name(template)
    mode = ClaimMode.parse(mode)

    @dsl.pipeline(
        name=pipeline_name("sft", template, mode),
        description=(
            f"LoRA SFT on a DRA GPU slice (claim template {template}, claim mode {mode.value}): "
            "preflight, smoke matmul, fine-tune, validate."
        ),
    )
    def slice_sft(
        on_missing_dra: str = "skip",
        preflight_source: str = "auto",
        device: str = "auto",
        precision: str = "auto",
        slice_memory_gib: float = 0.0,
        steps: int = 30,
        batch_size: int = 8,
        seq_len: int = 64,
        learning_rate: float = 3e-3,
        lora_r: int = 8,
        lora_alpha: int = 16,
        lora_targets: str = "c_attn,c_proj,c_fc",
        seed: int = 0,
        memory_headroom: float = 0.1,
        min_loss_drop: float = 0.3,
    ):
        pre = _checks(template, on_missing_dra, preflight_source)
        with dsl.If(pre.outputs["decision"] == READY, name="slice-available"):
            smoke_task = _smoke(template, mode, device, slice_memory_gib, kueue_queue)
            train = sft(
                device=device,
                precision=precision,
                slice_memory_gib=slice_memory_gib,
                steps=steps,
                batch_size=batch_size,
                seq_len=seq_len,
                learning_rate=learning_rate,
                lora_r=lora_r,
                lora_alpha=lora_alpha,
                lora_targets=lora_targets,
                seed=seed,
            ).after(smoke_task)
            train.set_display_name("LoRA SFT")
            bind_claim(train, template, mode, kueue_queue=kueue_queue)
            check = validate(
                adapter=train.outputs["adapter"],
                train_log=train.outputs["train_log"],
                slice_total_mem_gib=train.outputs["slice_total_mem_gib"],
                peak_mem_gib=train.outputs["peak_mem_gib"],
                device_json=train.outputs["device_json"],
                claim_template=template,
                claim_mode=mode.value,
                memory_headroom=memory_headroom,
                min_loss_drop=min_loss_drop,
            )
            gate(verdict=check.outputs["verdict"], passed=check.outputs["passed"])

    return slice_sft


def build_canary_pipeline(
    template: str = DEFAULT_TEMPLATE, mode: str | ClaimMode = ClaimMode.POLICY,
    kueue_queue: str | None = None,
) -> Callable:
    """``preflight -> smoke``: a cheap recurring check that a slice can be had and computes."""
    validate_template_name(template)
    mode = ClaimMode.parse(mode)

    @dsl.pipeline(
        name=pipeline_name("canary", template, mode),
        description=f"Canary for DRA GPU slices of claim template {template}: preflight, smoke.",
    )
    def slice_canary(
        on_missing_dra: str = "skip", preflight_source: str = "auto", device: str = "auto"
    ):
        pre = _checks(template, on_missing_dra, preflight_source)
        with dsl.If(pre.outputs["decision"] == READY, name="slice-available"):
            _smoke(template, mode, device, 0.0, kueue_queue)

    return slice_canary


def build_finetune_pipeline(
    template: str = DEFAULT_TEMPLATE,
    mode: str | ClaimMode = ClaimMode.POLICY,
    pvc_name: str = DEFAULT_PVC,
    mount_path: str = DEFAULT_MOUNT,
    kueue_queue: str | None = None,
    model_source: str = "pvc",
) -> Callable:
    """Fine-tune a model on data from the PVC ``pvc_name``, in a slice of ``template``.

    ``model_source`` says where the base model comes from: ``pvc`` (a directory on the same
    PVC, the ``model_dir`` parameter) or ``artifact`` (a Model artifact imported from the
    ``base_model_uri`` parameter: ``s3://``, ``gs://``, ``minio://``, an ``oci://`` model
    image, or the URI of another run's model output). The PVC (data, checkpoints, and the
    model when it lives there) is mounted at ``mount_path`` on the fine-tune task and on
    validate, which reloads the base to check the adapter. Checkpoints live on the PVC under
    the run id, so a retried task resumes.
    """
    validate_template_name(template)
    mode = ClaimMode.parse(mode)
    if model_source not in MODEL_SOURCES:
        raise InvalidParameter("model_source", model_source,
                               f"must be one of {', '.join(MODEL_SOURCES)}")
    kind = MODEL_SOURCES[model_source]
    what = (f"a model on PVC {pvc_name}" if model_source == "pvc"
            else f"a model imported as a Model artifact, on data from PVC {pvc_name}")
    description = (
        f"LoRA/QLoRA fine-tune of {what} (mounted at {mount_path}) on a DRA GPU slice "
        f"(claim template {template}, claim mode {mode.value}): preflight, smoke matmul, "
        "fine-tune, validate."
    )

    def flow(base: dict, p: dict) -> None:
        """The steps both variants share; ``base`` is how the base model reaches the tasks
        (``model_dir`` or ``base_model``), ``p`` the pipeline's parameters."""
        pre = _checks(template, p["on_missing_dra"], p["preflight_source"])
        with dsl.If(pre.outputs["decision"] == READY, name="slice-available"):
            smoke_task = _smoke(template, mode, p["device"], p["slice_memory_gib"], kueue_queue)
            # A pipeline parameter named like a finetune input goes to it as it is.
            same_name = {k: v for k, v in p.items() if k in finetune.component_spec.inputs}
            train = finetune(
                **base, **same_name, mount_path=mount_path,
                checkpoint_root=p["checkpoint_dir"], run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            ).after(smoke_task)
            train.set_display_name("fine-tune")
            train.set_caching_options(False)  # the data on the PVC can change under one name
            kubernetes.mount_pvc(train, pvc_name=pvc_name, mount_path=mount_path)
            bind_claim(train, template, mode, kueue_queue=kueue_queue)  # last: see bind_claim
            check = validate(
                adapter=train.outputs["adapter"],
                train_log=train.outputs["train_log"],
                slice_total_mem_gib=train.outputs["slice_total_mem_gib"],
                peak_mem_gib=train.outputs["peak_mem_gib"],
                device_json=train.outputs["device_json"],
                claim_template=template,
                claim_mode=mode.value,
                memory_headroom=p["memory_headroom"],
                min_loss_drop=p["min_loss_drop"],
                **({"base_model": base["base_model"]} if "base_model" in base else {}),
            )
            kubernetes.mount_pvc(check, pvc_name=pvc_name, mount_path=mount_path)
            gate(verdict=check.outputs["verdict"], passed=check.outputs["passed"])

    if model_source == "pvc":
        first = inspect.Parameter("model_dir", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  default="models/base", annotation=str)

        def body(params: dict) -> None:
            flow({"model_dir": params.pop("model_dir")}, params)
    else:
        first = inspect.Parameter("base_model_uri", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  annotation=str)  # required: no model is a sensible default

        def body(params: dict) -> None:
            base = dsl.importer(artifact_uri=params.pop("base_model_uri"),
                                artifact_class=dsl.Model, reimport=False)
            base.set_display_name("base model")
            flow({"base_model": base.output}, params)

    return dsl.pipeline(name=pipeline_name(kind, template, mode), description=description)(
        _with_parameters(first, body))


def _finetune_parameters(
    data: str = "data/train.jsonl",
    data_format: str = "auto",
    max_length: int = 512,
    pack: bool = False,
    eval_fraction: float = 0.05,
    gradient_checkpointing: bool = False,
    bf16_weights: bool = True,
    load_in_4bit: bool = False,
    lora_r: int = 16,
    lora_alpha: int = 32,
    lora_targets: str = "auto",
    batch_size: int = 8,
    steps: int = 200,
    learning_rate: float = 2e-4,
    lr_schedule: str = "cosine",
    warmup_steps: int = 10,
    checkpoint_every: int = 50,
    checkpoint_dir: str = "checkpoints",
    merge: bool = False,
    seed: int = 0,
    on_missing_dra: str = "skip",
    preflight_source: str = "auto",
    device: str = "auto",
    precision: str = "auto",
    slice_memory_gib: float = 0.0,
    memory_headroom: float = 0.1,
    min_loss_drop: float = 0.05,
    compile_mode: str = "off",
):
    """The finetune pipelines' parameters after the base model's own, declared once for both
    variants (see :func:`_with_parameters`); never called."""


def _with_parameters(first: inspect.Parameter, body: Callable[[dict], None]) -> Callable:
    """A pipeline function whose signature is ``first`` then :func:`_finetune_parameters`'.

    KFP reads a pipeline's parameters from its function's signature and calls it with one
    channel per parameter, positionally; ``body`` gets them as a dict by name.
    """
    shared = inspect.signature(_finetune_parameters).parameters.values()
    signature = inspect.Signature([first, *shared])

    def pipeline_func(*args, **kwargs):
        body(dict(signature.bind(*args, **kwargs).arguments))

    pipeline_func.__signature__ = signature
    return pipeline_func
