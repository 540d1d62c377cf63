"""The sweep pipeline: many fine-tunes on one card, each run in its own slice of
``template`` (the seed's "four 1g.6gb slices, four isolated jobs").

plan (check every run and complete it from a preset) -> preflight -> for each run, at most
``parallelism`` at a time: smoke matmul, fine-tune, validate -> compare (a table and a plot of
eval loss and tokens/s; the best adapter becomes the pipeline's Model output) -> gate.

Each run's GPU tasks carry their own claim: the claim binding (``pipelines/claim.py``) puts the
template on the task, and every pod of every iteration gets a claim of its own from it, so N
runs hold N slices. A failing verdict does not stop the sweep: compare reports it beside the
others, and the gate fails the run only when no run passed. A run whose task fails (out of
memory in its slice, a NaN loss) fails the sweep: KFP starts no fan-in step after a failed
iteration; the other runs' outputs stay in their tasks.

A sweep must end with a Model, so preflight runs with ``on_missing_dra=fail``: a cluster
without DRA fails the sweep, with the reason, before any slice is claimed (the other pipelines
may skip their GPU steps instead). ``parallelism`` is fixed when compiling (KFP's
``iteratorPolicy``); the PVC (models, datasets, checkpoints) is mounted on the fine-tune and
validate tasks as in the finetune pipeline.

No ``from __future__ import annotations``: kfp reads the pipeline signature's types.
"""

from collections.abc import Callable

from kfp import dsl, kubernetes
from kfp.dsl import Model

from draslice.cluster.names import validate_template_name
from draslice.components.compare import compare
from draslice.components.finetune import finetune
from draslice.components.gate import gate
from draslice.components.sweep_plan import sweep_plan
from draslice.errors import InvalidParameter
from draslice.pipelines.claim import ClaimMode
from draslice.pipelines.steps import (
    DEFAULT_MOUNT,
    DEFAULT_PVC,
    DEFAULT_TEMPLATE,
    checks,
    on_the_slice,
    pipeline_name,
    smoke_test,
    validate_step,
)
from draslice.trainer.config import FINETUNE_KNOBS, VERDICT_KNOBS

KIND = "sweep"
DEFAULT_PARALLELISM = 4  # four 1g.6gb slices of an A30, or four of the seven of an A100/H100
# What a sweep compiled for the UI proposes: the finetune preset's rate and rank, each varied.
# One knob per run: KFP writes a default's mappings in hash order into the compiled file's
# header, and compiled/ must be byte-for-byte reproducible.
DEFAULT_CONFIGS = [{"learning_rate": 1e-4}, {"learning_rate": 2e-4}, {"learning_rate": 4e-4},
                   {"lora_r": 32}]


def build(template: str = DEFAULT_TEMPLATE, mode: str | ClaimMode = ClaimMode.POLICY,
          kueue_queue: str | None = None, pvc_name: str = DEFAULT_PVC,
          mount_path: str = DEFAULT_MOUNT, parallelism: int = DEFAULT_PARALLELISM) -> Callable:
    validate_template_name(template)
    mode = ClaimMode.parse(mode)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 0:
        raise InvalidParameter("parallelism", parallelism,
                               "must be an integer >= 0 (0: every run at once)")

    @dsl.pipeline(
        name=pipeline_name(KIND, template, mode),
        description=(
            f"A sweep of LoRA/QLoRA fine-tunes, each in its own DRA GPU slice (claim template "
            f"{template}, claim mode {mode.value}, at most {parallelism or 'all'} at once; "
            f"PVC {pvc_name} at {mount_path}): plan, preflight, then per run smoke, fine-tune, "
            "validate; compare picks the best adapter."
        ),
    )
    def sweep(
        configs: list = DEFAULT_CONFIGS,
        preset: str = "finetune",
        preflight_source: str = "auto",
    ) -> Model:
        plan = sweep_plan(configs=configs, preset=preset)
        plan.set_display_name("plan")
        pre = checks(template, "fail", preflight_source).after(plan)
        with dsl.ParallelFor(plan.output, parallelism=parallelism) as run:
            smoke_task = smoke_test(template, mode, run.device, run.slice_memory_gib,
                                    kueue_queue).after(pre)
            train = finetune(
                mount_path=mount_path,
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                **{name: getattr(run, name) for name in FINETUNE_KNOBS},
            ).after(smoke_task)
            on_the_slice(train, "fine-tune", template, mode, kueue_queue, pvc_name, mount_path)
            check = validate_step(train, template, mode, smoke=smoke_task,
                                  **{name: getattr(run, name) for name in VERDICT_KNOBS})
            kubernetes.mount_pvc(check, pvc_name=pvc_name, mount_path=mount_path)  # the base
        best = compare(
            configs=plan.output,
            adapters=dsl.Collected(train.outputs["adapter"]),
            train_logs=dsl.Collected(train.outputs["train_log"]),
            passed=dsl.Collected(check.outputs["passed"]),
            verdicts=dsl.Collected(check.outputs["verdict"]),
        )
        gate(verdict=best.outputs["verdict"], passed=best.outputs["passed"])
        return best.outputs["best_adapter"]

    return sweep
