"""Every component's function called directly, as the KFP executor would call it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kfp import dsl

from draslice.components.finetune import finetune
from draslice.components.gate import gate
from draslice.components.preflight import preflight
from draslice.components.smoke import smoke
from draslice.components.validate import validate
from draslice.errors import InvalidParameter, ModelLoadError, ValidationFailed
from draslice.tests.scratch import save_preset, write_demo_data


def _artifact(cls, tmp_path, name):
    return cls(name=name, uri=str(tmp_path / name), metadata={})


def test_preflight_outputs_a_decision_and_a_report(tmp_path):
    report = _artifact(dsl.Markdown, tmp_path, "report")
    out = preflight.python_func(claim_template="mig-1g-6gb", on_missing_dra="skip", report=report)
    assert out.decision == "ready"
    assert out.reason
    assert "mig-1g-6gb" in (tmp_path / "report").read_text()


@pytest.mark.parametrize(("template", "policy"), [("Bad_Name", "skip"), ("ok", "maybe")])
def test_preflight_rejects_bad_input(tmp_path, template, policy):
    with pytest.raises(InvalidParameter):
        preflight.python_func(claim_template=template, on_missing_dra=policy,
                              report=_artifact(dsl.Markdown, tmp_path, "report"))


def test_smoke_outputs_the_slice_facts_and_metrics(tmp_path):
    metrics = _artifact(dsl.Metrics, tmp_path, "metrics")
    out = smoke.python_func(metrics=metrics, device="cpu", matmul_size=256)
    assert out.cuda_available is False
    assert out.slice_total_mem_gib > 0
    assert out.tflops > 0
    assert metrics.metadata["matmul_rel_error"] < 1e-4


def test_demo_finetune_then_validate_then_gate(tmp_path):
    """The demo run is the fine-tune component with the built-in model and data."""
    adapter = _artifact(dsl.Model, tmp_path, "adapter")
    train_log = _artifact(dsl.Artifact, tmp_path, "train_log")
    sft_metrics = _artifact(dsl.Metrics, tmp_path, "sft_metrics")
    out = finetune.python_func(adapter=adapter, train_log=train_log, metrics=sft_metrics,
                               device="cpu", steps=30)
    assert out.loss_drop >= 0.3
    assert json.loads(out.device_json)["device"] == "cpu"
    assert sft_metrics.metadata["peak_mem_gib"] == out.peak_mem_gib
    assert adapter.metadata["framework"] == "peft"
    assert adapter.metadata["base_model"] == "demo"

    def run_validate(min_loss_drop):
        report = _artifact(dsl.HTML, tmp_path, f"report-{min_loss_drop}")
        summary = _artifact(dsl.Markdown, tmp_path, f"summary-{min_loss_drop}")
        metrics = _artifact(dsl.Metrics, tmp_path, f"metrics-{min_loss_drop}")
        result = validate.python_func(
            adapter=adapter, train_log=train_log, slice_total_mem_gib=out.slice_total_mem_gib,
            peak_mem_gib=out.peak_mem_gib, device_json=out.device_json,
            claim_template="mig-1g-6gb", claim_mode="policy", metrics=metrics, report=report,
            summary=summary, min_loss_drop=min_loss_drop,
        )
        return result, report, summary, metrics

    good, report, summary, metrics = run_validate(0.3)
    assert good.passed and good.verdict.startswith("verdict: PASS")
    assert metrics.metadata["passed"] == 1.0
    assert "<img" in Path(report.path).read_text()
    assert Path(summary.path).read_text().startswith("# draslice verdict: PASS")
    gate.python_func(verdict=good.verdict, passed=good.passed)  # does not raise

    bad, report, summary, _ = run_validate(0.99)
    assert not bad.passed
    assert Path(summary.path).read_text().startswith("# draslice verdict: FAIL")  # report kept
    with pytest.raises(ValidationFailed, match="verdict: FAIL"):
        gate.python_func(verdict=bad.verdict, passed=bad.passed)


def test_components_install_nothing_at_run_time():
    for component in (preflight, smoke, finetune, validate, gate):
        container = component.component_spec.implementation.container
        command = " ".join(container.command)
        assert "pip install" not in command, component.name
        assert container.image.startswith("ghcr.io/draslice/trainer:")


def test_preflight_reads_a_snapshot_source(tmp_path):
    dump = tmp_path / "no-dra.yaml"
    dump.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    report = _artifact(dsl.Markdown, tmp_path, "report")
    out = preflight.python_func(claim_template="mig-1g-6gb", on_missing_dra="skip",
                                report=report, source=str(dump))
    assert out.decision == "skip" and "no DRA at all" in out.reason
    assert "no DRA at all" in (tmp_path / "report").read_text()


def test_preflight_rejects_an_unknown_source(tmp_path):
    with pytest.raises(InvalidParameter, match="preflight_source"):
        preflight.python_func(claim_template="mig-1g-6gb", on_missing_dra="skip",
                              report=_artifact(dsl.Markdown, tmp_path, "report"),
                              source=str(tmp_path / "missing.yaml"))


def _finetune_outputs(tmp_path):
    return dict(adapter=_artifact(dsl.Model, tmp_path, "adapter"),
                train_log=_artifact(dsl.Artifact, tmp_path, "train_log"),
                metrics=_artifact(dsl.Metrics, tmp_path, "ft_metrics"))


@pytest.mark.parametrize("model_dir, with_artifact, message", [
    ("", False, "model_dir='': a real fine-tune needs both model_dir"),
    ("models/base", True, "model_dir='models/base': give the base model once.*not both"),
])
def test_finetune_takes_its_base_model_from_one_place(tmp_path, model_dir, with_artifact,
                                                      message):
    base = _artifact(dsl.Model, tmp_path, "base") if with_artifact else None
    with pytest.raises(InvalidParameter, match=message):
        finetune.python_func(**_finetune_outputs(tmp_path), data="d.jsonl", model_dir=model_dir,
                             base_model=base, mount_path=str(tmp_path), device="cpu")
    assert not (tmp_path / "adapter").exists()  # refused before any work


def test_finetune_from_a_model_artifact_then_validate_where_it_lands_elsewhere(tmp_path):
    """A Model artifact is downloaded to a path of the pod's own (/s3/..., /minio/...): the
    validate step must reload the base from its own copy, not the path the fine-tune saw."""
    seen_by_finetune = save_preset("tiny-llama", tmp_path / "pod-a" / "base")
    write_demo_data(tmp_path / "volume" / "chat.jsonl", "chat", 64)
    outputs = _finetune_outputs(tmp_path)
    out = finetune.python_func(
        **outputs, data="chat.jsonl", mount_path=str(tmp_path / "volume"),
        base_model=dsl.Model(name="base", uri=str(seen_by_finetune), metadata={}),
        max_length=64, steps=12, batch_size=8, learning_rate=3e-3, checkpoint_every=0,
        device="cpu",
    )
    assert outputs["adapter"].metadata["base_model"] == str(seen_by_finetune)
    seen_by_validate = seen_by_finetune.rename(tmp_path / "pod-b")

    def run_validate(base_model):
        name = "with" if base_model else "without"
        return validate.python_func(
            adapter=outputs["adapter"], train_log=outputs["train_log"],
            slice_total_mem_gib=out.slice_total_mem_gib, peak_mem_gib=out.peak_mem_gib,
            device_json=out.device_json, claim_template="mig-1g-6gb", claim_mode="policy",
            metrics=_artifact(dsl.Metrics, tmp_path, f"m-{name}"),
            report=_artifact(dsl.HTML, tmp_path, f"r-{name}"),
            summary=_artifact(dsl.Markdown, tmp_path, f"s-{name}"),
            min_loss_drop=0.02, base_model=base_model,
        )

    good = run_validate(dsl.Model(name="base", uri=str(seen_by_validate), metadata={}))
    assert good.passed, good.verdict
    assert "adapter: reloaded onto a fresh base" in good.verdict
    with pytest.raises(ModelLoadError, match="pod-a"):  # the recorded path is gone in this pod
        run_validate(None)
