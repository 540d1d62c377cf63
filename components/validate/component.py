"""Validate: one verdict on the fine-tune, and the report the KFP UI shows."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Artifact, Input, Markdown, Metrics, Model, Output

from draslice.components.image import TRAINER_IMAGE
from draslice.components.knob_docs import with_input_docs

# The inputs that are not verdict knobs (trainer/config.py's VerdictConfig declares those).
NOT_KNOBS = {
    "adapter": "The fine-tune step's adapter.",
    "train_log": "The fine-tune step's per-step JSON-lines metrics.",
    "slice_total_mem_gib": "Memory of the slice the fine-tune ran in.",
    "peak_mem_gib": "The fine-tune's peak memory.",
    "device_json": "The fine-tune's device facts (JSON) for the report.",
    "claim_template": "ResourceClaimTemplate the GPU steps claimed.",
    "claim_mode": "How the claim reached the pods (``policy`` or ``native``).",
    "metrics": "Scalars for the KFP UI.",
    "report": "HTML report: loss and eval loss, tokens/s over steps, memory against the "
              "slice, the smoke's TFLOP/s, device and claim.",
    "smoke_tflops": "The smoke task's matmul TFLOP/s, for the report (0: not measured).",
    "summary": "Markdown summary with the verdict and its reasons.",
    "base_model": "The base model artifact the adapter was trained on, when it came as one "
                  "(its local path differs from pod to pod); otherwise the base is reloaded "
                  "from the directory the run recorded.",
}


def validate(
    adapter: Input[Model],
    train_log: Input[Artifact],
    slice_total_mem_gib: float,
    peak_mem_gib: float,
    device_json: str,
    claim_template: str,
    claim_mode: str,
    metrics: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
    memory_headroom: float = 0.1,
    min_loss_drop: float = 0.3,
    base_model: Input[Model] = None,
    smoke_tflops: float = 0.0,
) -> NamedTuple("ValidateOutputs", verdict=str, passed=bool):
    """Checks memory, learning and the adapter; writes the report. Never fails the step on
    a FAIL verdict (the report must still reach the UI): the pipeline's gate does that.

    Runs on the CPU without a claim: the adapter check compares fp32 logits, and holding a
    slice only to write a report would keep it from the next job.

    Returns:
        verdict: ``PASS`` or ``FAIL`` followed by one reason per check.
        passed: Whether every check passed.
    """
    import json
    from collections import namedtuple

    from draslice.trainer import libraries

    libraries.settle()  # before the checks import peft: library lines no one can act on
    from draslice.trainer.tasks import report as rep
    from draslice.trainer.tasks.validate import read_records
    from draslice.trainer.tasks.validate import validate as run_validate

    device = json.loads(device_json)
    verdict = run_validate(
        model_dir=adapter.path,
        metrics_path=train_log.path,
        slice_total_mem_gib=slice_total_mem_gib,
        peak_mem_gib=peak_mem_gib,
        memory_headroom=memory_headroom,
        min_loss_drop=min_loss_drop,
        base_model_dir=base_model.path if base_model is not None else None,
        device=device,
        template=claim_template,
    )
    claim = {"template": claim_template, "mode": claim_mode}
    with open(report.path, "w") as f:
        f.write(rep.render_html(verdict, read_records(train_log.path), device, claim,
                                smoke={"tflops": smoke_tflops}))
    with open(summary.path, "w") as f:
        f.write(rep.render_markdown(verdict, device, claim))
    for name, value in verdict.figures.items():
        metrics.log_metric(name, round(float(value), 6))
    metrics.log_metric("passed", float(verdict.passed))
    print(verdict.text())
    return namedtuple("ValidateOutputs", ["verdict", "passed"])(verdict.text(), verdict.passed)


validate = dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)(
    with_input_docs(validate, NOT_KNOBS))
