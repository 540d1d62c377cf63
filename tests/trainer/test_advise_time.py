"""``advise``'s time estimate (sizing/timing.py): a measured step scaled to each slice's share
of the SMs, what the share rests on, when no estimate is given, and how the command shows it.

The GPU half (a real probe's steps on CUDA) is in test_gpu_finetune.py; here the steps are
given as a run's metrics lines would record them."""

from __future__ import annotations

import json

import pytest

from draslice.cli.commands.advise_cmd import render
from draslice.sizing.advise import Advice, KnobTrial
from draslice.sizing.profiles import TABLE, SliceProfile, recommend
from draslice.sizing.timing import MeasuredStep, Pace, duration, gpu_model, pace, same_model

H200 = {"device": "cuda:0", "name": "NVIDIA H200", "multiprocessors": 132, "is_mig": False}
H200_1G = {**H200, "name": "NVIDIA H200 MIG 1g.18gb", "multiprocessors": 16, "is_mig": True}


def _records(first: float, *steady: float, tokens: int = 16384) -> list[dict]:
    return [{"step": i + 1, "step_seconds": s, "tokens": tokens}
            for i, s in enumerate((first, *steady))]


def _profile(name: str, gpu: str = "H200-141GB") -> SliceProfile:
    return next(p for p in TABLE[gpu] if p.name == name)


def test_measured_step_takes_the_median_steady_step_and_keeps_the_first_apart():
    step = MeasuredStep.from_run(_records(9.0, 0.30, 0.50, 0.32), H200)
    assert (step.first_s, step.steady_s, step.tokens) == (9.0, 0.32, 16384)
    assert step.multiprocessors == 132 and not step.is_mig


def test_no_measured_step_from_one_step():
    assert MeasuredStep.from_run(_records(1.0), H200) is None


def test_a_run_time_counts_the_first_steps_set_up_once_and_unscaled():
    step = MeasuredStep.from_run(_records(10.0, 0.5, 0.5), H200)
    assert step.run_seconds(100) == pytest.approx(9.5 + 50)
    assert step.run_seconds(100, share=0.5) == pytest.approx(9.5 + 100)


@pytest.mark.parametrize(("a", "b", "same"), [
    ("NVIDIA H200", "H200-141GB", True),
    ("NVIDIA H100 80GB HBM3", "H100-80GB", True),
    ("NVIDIA A100-SXM4-40GB", "A100-80GB", False),  # the memory tells the two A100s apart
    ("NVIDIA A100 80GB PCIe MIG 1g.10gb", "A100-80GB", True),  # the GPU's memory, not the MIG's
    ("NVIDIA H200 MIG 1g.18gb", "H200-141GB", True),
    ("NVIDIA GH200 480GB", "H200-141GB", False),
    ("NVIDIA H200", "A30-24GB", False),
    ("Tesla T4", "A30-24GB", False),
])
def test_gpu_models_are_matched_by_model_and_memory(a, b, same):
    assert same_model(a, b) is same


def test_gpu_model_reads_table_keys_and_product_names():
    assert gpu_model("A30-24GB") == ("A30", 24)
    assert gpu_model("NVIDIA H200") == ("H200", None)
    assert gpu_model("Tesla T4") is None


def test_a_whole_gpu_step_scales_by_the_profiles_fraction_of_the_sms():
    step = MeasuredStep.from_run(_records(10.0, 0.5, 0.5, tokens=16384), H200)
    one, three = pace(_profile("1g.18gb"), step, 100), pace(_profile("3g.71gb"), step, 100)
    assert one.share == pytest.approx(1 / 7) and three.share == pytest.approx(3 / 7)
    assert one.step_s == pytest.approx(3.5) and one.tokens_per_s == pytest.approx(16384 / 3.5)
    assert one.run_s == pytest.approx(9.5 + 100 * 3.5)  # the first step's set-up, unscaled
    assert one.basis == "1/7 of its SMs, by NVIDIA's MIG guide; approximate"


def test_an_a30_has_four_compute_slices():
    step = MeasuredStep.from_run(_records(1.0, 0.2), {**H200, "name": "NVIDIA A30"})
    assert pace(_profile("1g.6gb", "A30-24GB"), step, 10).share == pytest.approx(1 / 4)


def test_published_sms_are_used_over_the_fraction():
    a100 = {**H200, "name": "NVIDIA A100 80GB PCIe", "multiprocessors": 108}
    step = MeasuredStep.from_run(_records(1.0, 0.14), a100)
    published = SliceProfile("1g.10gb", 9.5, "NVIDIA A100 80GB PCIe", multiprocessors=14)
    found = pace(published, step, 10)
    assert found.share == pytest.approx(14 / 108) and found.step_s == pytest.approx(1.08)
    assert found.basis == "14 of its 108 SMs, as the cluster publishes"


def test_a_step_measured_on_a_mig_slice_scales_by_compute_slices():
    step = MeasuredStep.from_run(_records(5.0, 2.0), H200_1G)
    found = pace(_profile("2g.35gb"), step, 10)
    assert found.share == 2 and found.step_s == pytest.approx(1.0)
    assert found.basis == "2 compute slices for its 1"
    assert pace(SliceProfile("full", 140.0, "NVIDIA H200"), step, 10).startswith(
        "measured on a MIG slice")


def test_no_estimate_across_gpu_models_or_for_unknown_profiles():
    step = MeasuredStep.from_run(_records(1.0, 0.5), H200)
    assert pace(_profile("1g.10gb", "H100-80GB"), step, 10) == (
        "measured on NVIDIA H200, not on a H100-80GB")
    assert "no compute share" in pace(SliceProfile("shared", 40.0, "NVIDIA H200"), step, 10)
    whole = pace(SliceProfile("full", 140.0, "NVIDIA H200"), step, 10)
    assert isinstance(whole, Pace) and whole.share == 1.0


def test_durations_read_at_an_estimates_precision():
    assert [duration(s) for s in (42, 450, 3 * 3600)] == ["42 s", "7.5 min", "3.0 h"]


def _advice(step: MeasuredStep | None, peak: float = 20.0, **kw) -> Advice:
    rec = recommend(peak, TABLE["H200-141GB"])
    return Advice(peak, step.device if step else "cpu", step is not None, rec, step=step,
                  run_steps=200, **kw)


def test_the_command_says_the_run_time_on_the_recommended_slice_and_its_basis():
    step = MeasuredStep.from_run(_records(10.0, 0.5, 0.5), H200)
    advice = _advice(step)  # 20 GiB: 1g.35gb is chosen, 1g.18gb the next smaller
    lines = render(advice)
    assert "recommended: H200-141GB 1g.35gb (34.25 GiB, estimated)" in lines
    at = lines.index("recommended: H200-141GB 1g.35gb (34.25 GiB, estimated)")
    assert lines[at + 1:at + 4] == [
        "  time: ~3.50 s a step, ~4,681 tokens/s; 200 steps (--steps) in ~11.8 min",
        "    estimated: 0.500 s a step measured on NVIDIA H200, scaled to 1/7 of its SMs, by "
        "NVIDIA's MIG guide; approximate",
        "    (--verbose: what the estimate leaves out)"]
    verbose = render(advice, verbose=True)
    assert any("share of memory bandwidth and L2" in line for line in verbose)
    assert any(line.endswith("~32,768 tokens/s") and "7g.141gb" in line for line in lines)
    found = json.loads(json.dumps(advice.to_dict()))  # what --json prints
    assert found["candidates"][0]["time"]["step_s"] == 3.5
    assert found["measured_step"]["steady_s"] == 0.5 and found["run_steps"] == 200


def test_each_lever_trial_says_its_step_time_on_the_smaller_slice():
    step = MeasuredStep.from_run(_records(10.0, 0.5, 0.5), H200)
    slower = MeasuredStep.from_run(_records(10.0, 0.6, 0.6), H200)
    advice = _advice(step, trials=[KnobTrial(["--gradient-checkpointing"], 15.0, True,
                                             step=slower)])
    assert ("  --gradient-checkpointing: peak 15.00 GiB, fits, ~4.20 s a step there"
            in render(advice))
    trial = advice.to_dict()["knob_trials"][0]
    assert trial["time_on_target"]["step_s"] == pytest.approx(4.2)


def test_no_time_without_a_gpu_measurement_and_the_reason_is_given():
    cpu = _advice(None, measured=True)
    assert "  time: not predicted: measured on the CPU" in render(cpu)
    given = Advice(5.0, "", True, recommend(5.0, TABLE["A30-24GB"]), measured=False)
    assert "  time: not predicted: given with --peak-gib" in render(given)
    assert given.to_dict()["candidates"][0]["time"] == {
        "none": "not predicted: given with --peak-gib"}


@pytest.mark.parametrize(("pack", "compile_mode", "probed"), [
    (False, "auto", "off"),  # varying widths: the real run is eager, so is the probe
    (True, "auto", "auto"),  # packed: the real run captures its graph, so does the probe
    (False, "default", "default"),  # an explicit mode is the user's
])
def test_the_probe_runs_the_compile_mode_the_real_run_gets(monkeypatch, pack, compile_mode,
                                                           probed):
    """The probe pads every batch to one width; left at auto it would capture a CUDA graph
    (another step time, another memory pool) that the real run of varying widths never has."""
    import draslice.trainer.sft
    from draslice.sizing.advise import measure
    from draslice.trainer.config import SFTConfig

    seen = []

    def probe(cfg, *_args, **_kw):
        seen.append(cfg)
        raise KeyboardInterrupt  # the config is all this test needs

    monkeypatch.setattr(draslice.trainer.sft, "train", probe)
    cfg = SFTConfig(model_dir="m", data="x.jsonl", pack=pack, compile=compile_mode)
    with pytest.raises(KeyboardInterrupt):
        measure(cfg)
    assert seen[0].compile == probed and seen[0].pad_to_max_length and seen[0].steps == 3
