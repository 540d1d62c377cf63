"""Real fine-tunes on a GPU under an emulated slice; run on a CUDA host (`pytest -m gpu`)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from draslice.errors import SliceOutOfMemory
from draslice.sizing.advise import advise
from draslice.sizing.profiles import SliceProfile
from draslice.tests.conftest import requires_cuda
from draslice.tests.scratch import save_preset, save_scratch_model, write_demo_data
from draslice.trainer import budget
from draslice.trainer.config import SFTConfig
from draslice.trainer.sft import train
from draslice.trainer.tasks.validate import check_adapter

pytestmark = [pytest.mark.gpu, requires_cuda]
has_bnb = importlib.util.find_spec("bitsandbytes") is not None


@pytest.fixture(scope="module")
def gpt2_124m(tmp_path_factory):
    return save_preset("gpt2-124m", tmp_path_factory.mktemp("m") / "gpt2-124m", device="cuda")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_demo_data(tmp_path_factory.mktemp("d") / "d.jsonl", "prompt-completion", 512)


def test_bf16_weights_and_grad_checkpointing_fit_a_6_gib_slice(gpt2_124m, data, tmp_path):
    cfg = SFTConfig(model_dir=str(gpt2_124m), data=str(data), max_length=512, pack=True,
                    batch_size=8, steps=20, learning_rate=1e-3, bf16_weights=True,
                    gradient_checkpointing=True, slice_memory_gib=6, eval_fraction=0.05)
    result = train(cfg, tmp_path, tmp_path / "m.jsonl", log=print)
    assert result.precision == "bf16" and result.slice_total_mem_gib == 6
    assert budget.fits(result.peak_mem_gib, 6)
    assert result.final_loss < result.initial_loss
    check, _ = check_adapter(tmp_path)
    assert check.passed, check.detail


def test_oom_in_a_tiny_slice_names_the_levers(gpt2_124m, data, tmp_path):
    cfg = SFTConfig(model_dir=str(gpt2_124m), data=str(data), max_length=512, steps=2,
                    slice_memory_gib=0.3)
    with pytest.raises(SliceOutOfMemory, match=r"the slice has 0\.30 GiB.*--gradient-check"):
        train(cfg, tmp_path, tmp_path / "m.jsonl", log=lambda _l: None)


def test_advise_measures_levers_for_the_next_smaller_profile(gpt2_124m, data):
    cfg = SFTConfig(model_dir=str(gpt2_124m), data=str(data), max_length=512, batch_size=8)
    tiny, roomy = SliceProfile("tiny", 0.5), SliceProfile("roomy", 100.0)
    advice = advise(cfg, [tiny, roomy], steps=2)
    assert advice.on_cuda and advice.recommendation.chosen == roomy
    assert advice.recommendation.next_smaller == tiny
    assert advice.trials and advice.trials[0].knobs == ["--gradient-checkpointing"]
    measured = [t.peak_gib for t in advice.trials if t.peak_gib is not None]
    assert measured and min(measured) < advice.peak_gib
    # The probe's steps give the time: on the device measured on, whole, it is the step itself
    step = advice.step
    assert step is not None and step.steady_s > 0 and 0 < step.tokens <= 8 * 512
    assert step.multiprocessors == torch.cuda.get_device_properties(0).multi_processor_count
    whole = advice.pace(SliceProfile("full", 100.0, step.device))
    assert whole.share == 1.0 and whole.step_s == step.steady_s
    assert isinstance(advice.pace(roomy), str)  # no GPU model named: no estimate
    from draslice.sizing.profiles import TABLE
    from draslice.sizing.timing import Pace, same_model

    mine = [p for rows in TABLE.values() for p in rows if same_model(step.device, p.gpu)]
    if mine:  # the table has this GPU's profiles: its 1g takes longer than the whole GPU
        assert isinstance(advice.pace(mine[0]), Pace)
        assert advice.pace(mine[0]).step_s > step.steady_s
    print({"peak": advice.peak_gib, "step": step, "trials": [t.__dict__ for t in advice.trials]})


@pytest.mark.skipif(not has_bnb, reason="bitsandbytes is not installed")
def test_qlora_trains_a_4bit_base_and_its_adapter_reloads(data, tmp_path):
    model = save_scratch_model(tmp_path / "llama", "llama", hidden_size=512, num_layers=4,
                               num_heads=8, num_kv_heads=2, intermediate_size=1024,
                               vocab_size=2048, max_positions=1024, device="cuda")
    cfg = SFTConfig(model_dir=str(model), data=str(data), load_in_4bit=True,
                    gradient_checkpointing=True, max_length=256, steps=15,
                    learning_rate=1e-3, slice_memory_gib=2)
    result = train(cfg, tmp_path / "out", tmp_path / "m.jsonl", log=print)
    assert result.final_loss < result.initial_loss
    assert budget.fits(result.peak_mem_gib, 2)
    check, _ = check_adapter(tmp_path / "out")
    assert check.passed, check.detail
