"""The activation levers that work inside gradient checkpointing (``offload_activations``,
``tile_mlp``): refused without it, naming both knobs, and each says in the run's log what it
did (on a CPU: offloading has no effect there, the MLP still runs in tiles), and which kind of
checkpoint the loop took."""

from __future__ import annotations

import pytest

from draslice.errors import InvalidParameter
from draslice.trainer import loglines
from draslice.trainer.config import ModelShape, SFTConfig

LEVERS = [("offload_activations", loglines.offloaded(0, "cpu")), ("tile_mlp", loglines.tiled(2))]


@pytest.mark.parametrize(("knob", "_line"), LEVERS)
def test_without_checkpointing_the_lever_is_refused_naming_both_knobs(knob, _line):
    with pytest.raises(InvalidParameter, match=f"{knob}.*gradient_checkpointing"):
        SFTConfig(**{knob: True})


@pytest.mark.parametrize(("knob", "line"), LEVERS)
def test_a_cpu_run_says_what_the_lever_did(tmp_path, knob, line):
    from draslice.trainer.sft import train

    lines: list[str] = []
    cfg = SFTConfig(steps=2, batch_size=4, gradient_checkpointing=True, device="cpu",
                    shape=ModelShape(n_layer=2, n_embd=32, n_head=2, seq_len=16), **{knob: True})
    train(cfg, tmp_path / "out", tmp_path / "m.jsonl", log=lines.append)
    assert line in lines
    # a model this small, alone and eager: the reentrant checkpoint (grad_checkpointing.choose)
    assert loglines.checkpointed(reentrant=True) in lines
