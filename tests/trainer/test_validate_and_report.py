"""The verdict: each check passes on a good run and fails on the fault it exists for."""

from __future__ import annotations

import base64
import json
import re
import shutil

import pytest
from safetensors.torch import load_file, save_file

from draslice.errors import DrasliceError, InvalidParameter
from draslice.trainer import outputs
from draslice.trainer.outputs import ADAPTER_DIR
from draslice.trainer.tasks import report
from draslice.trainer.tasks.validate import read_losses, read_records, validate


def _validate(trained, **kw):
    args = {"model_dir": trained["dir"], "metrics_path": trained["metrics"],
            "slice_total_mem_gib": 5.75, "peak_mem_gib": trained["result"].peak_mem_gib}
    args.update(kw)
    return validate(**args)


def test_good_run_passes_every_check(trained):
    verdict = _validate(trained)
    assert verdict.passed, verdict.text()
    assert [c.name for c in verdict.checks] == ["memory", "loss", "adapter"]
    assert verdict.text().startswith("verdict: PASS")
    assert verdict.figures["adapter_max_logit_diff"] < 1e-3
    assert verdict.figures["adapter_effect"] > 0.1


def test_peak_above_the_budget_fails_memory(trained):
    verdict = _validate(trained, slice_total_mem_gib=1.0, peak_mem_gib=0.95)
    memory = verdict.checks[0]
    assert not verdict.passed and not memory.passed
    assert "0.95 GiB > 0.90 GiB" in memory.detail


def test_too_little_learning_fails_loss(trained):
    verdict = _validate(trained, min_loss_drop=0.95)
    assert not verdict.passed
    assert not verdict.checks[1].passed
    assert "need >= 95%" in verdict.checks[1].detail


def _recommit(folder):
    """Rewrite the run's record for files changed on purpose: a whole set with those files,
    so the check under test (not the set's size record) is what must notice."""
    raw = json.loads((folder / outputs.RUN_FILE).read_text())
    outputs.commit(folder, {k: v for k, v in raw.items() if k != outputs.FILES_KEY})


def test_tampered_adapter_fails_the_reload_check(trained, tmp_path):
    copy = tmp_path / "adapter"
    shutil.copytree(trained["dir"], copy)
    weights = copy / ADAPTER_DIR / "adapter_model.safetensors"
    tensors = load_file(weights)
    name = next(k for k in tensors if "lora_B" in k)
    tensors[name] = tensors[name] * 3
    save_file(tensors, weights)
    _recommit(copy)
    verdict = _validate(trained, model_dir=copy)
    assert not verdict.passed
    assert not verdict.checks[2].passed


def test_zeroed_adapter_fails_even_though_it_reproduces_nothing(trained, tmp_path):
    """An adapter that changes nothing must not pass as 'reproduces the logits'."""
    import torch

    copy = tmp_path / "adapter"
    shutil.copytree(trained["dir"], copy)
    weights = copy / ADAPTER_DIR / "adapter_model.safetensors"
    tensors = {k: torch.zeros_like(v) if "lora_B" in k else v
               for k, v in load_file(weights).items()}
    save_file(tensors, weights)
    ref = torch.load(copy / "reference_logits.pt", weights_only=True)
    # Make the reference the base's own logits: the check must still notice no effect.
    from draslice.trainer.model import ModelShape, build_base
    with torch.no_grad():
        ref["logits"] = build_base(ModelShape(), 0)(input_ids=ref["input_ids"]).logits
    torch.save(ref, copy / "reference_logits.pt")
    _recommit(copy)
    verdict = _validate(trained, model_dir=copy)
    assert not verdict.checks[2].passed
    assert "no effect" in verdict.checks[2].detail


def test_missing_adapter_is_a_failed_check_not_a_crash(trained, tmp_path):
    verdict = _validate(trained, model_dir=tmp_path)
    assert not verdict.checks[2].passed
    assert "is missing" in verdict.checks[2].detail


def test_malformed_metrics_line_is_named_by_number(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "loss": 6.2}\n{"step": 2, "loss": \n')
    with pytest.raises(DrasliceError, match=r"m\.jsonl:2: expected a JSON object"):
        read_losses(path)


@pytest.mark.parametrize(("kw", "name"), [({"memory_headroom": 1.5}, "memory_headroom"),
                                          ({"min_loss_drop": -0.1}, "min_loss_drop"),
                                          ({"slice_total_mem_gib": 0}, "slice_total_mem_gib")])
def test_bad_thresholds_are_refused(trained, kw, name):
    with pytest.raises(InvalidParameter) as err:
        _validate(trained, **kw)
    assert err.value.name == name


def test_html_report_has_every_picture_and_the_facts(trained):
    device = trained["result"].device
    verdict = _validate(trained, device=device, template="mig-1g-6gb")
    html = report.render_html(verdict, read_records(trained["metrics"]), device,
                              {"template": "mig-1g-6gb", "mode": "policy"},
                              smoke={"tflops": 1.234})
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == 3  # loss and eval loss, tokens/s, memory
    for data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG")
    assert "PASS" in html and "mig-1g-6gb" in html and "cpu (no CUDA device)" in html
    assert "1.23" in html  # the smoke's TFLOP/s
    assert "<script" not in html  # the KFP UI sandboxes HTML; nothing to run or fetch


def test_on_the_cpu_the_memory_check_says_what_it_compared(trained):
    """Host RAM, not a slice: the template's size was not applied, and the check says so."""
    verdict = _validate(trained, slice_total_mem_gib=23.54, device=trained["result"].device,
                        template="mig-1g-6gb")
    detail = verdict.checks[0].detail
    assert "host RAM 23.54 GiB" in detail
    assert "no GPU here, so the mig-1g-6gb template's memory was not applied" in detail


def test_markdown_summary_states_the_verdict_and_reasons(trained):
    verdict = _validate(trained, min_loss_drop=0.95)
    md = report.render_markdown(verdict, trained["result"].device, {"template": "t"})
    assert md.startswith("# draslice verdict: FAIL")
    assert "❌ **loss**" in md and "✅ **memory**" in md
