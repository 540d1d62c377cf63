"""Checkpoints: a SIGKILLed training resumes from its last checkpoint to the same adapter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from draslice.errors import DrasliceError
from draslice.trainer import checkpoint
from draslice.trainer.config import FINETUNE_KNOBS, SFTConfig
from draslice.trainer.outputs import ADAPTER_DIR, CHECKPOINT_DIR
from draslice.trainer.presets import FINETUNE
from draslice.trainer.sft import train

STEPS, EVERY, KILL_AFTER = 120, 10, 25



def _args(model, data) -> list[str]:
    return ["--model-dir", str(model), "--data", str(data), "--steps", str(STEPS),
            "--checkpoint-every", str(EVERY), "--log-every", "1000", "--device", "cpu",
            "--batch-size", "4", "--max-length", "48", "--eval-fraction", "0.1"]


def _cfg(model, data) -> SFTConfig:
    """What `draslice train` builds from :func:`_args`: those, and the finetune preset."""
    given = dict(model_dir=str(model), data=str(data), steps=STEPS, checkpoint_every=EVERY,
                 log_every=1000, device="cpu", batch_size=4, max_length=48, eval_fraction=0.1)
    return SFTConfig(**FINETUNE.fill(given, FINETUNE_KNOBS), **given)


def _kill_mid_training(out, args) -> int:
    """Start `draslice train`, SIGKILL it once KILL_AFTER steps are recorded; the step count."""
    cmd = [sys.executable, "-c", "from draslice.cli import main; main()", "train",
           "--output-dir", str(out), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= KILL_AFTER:
                proc.kill()  # SIGKILL: no handler, no cleanup, like a preempted pod
                break
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -9, "training ended before it could be killed"
    return len(metrics.read_text().splitlines())


def test_sigkill_mid_training_then_rerun_resumes_to_the_uninterrupted_adapter(
        tiny_gpt2, demo_data, tmp_path):
    data = demo_data["prompt-completion"]
    killed = tmp_path / "killed"
    recorded = _kill_mid_training(killed, _args(tiny_gpt2, data))
    assert KILL_AFTER <= recorded < STEPS
    last = checkpoint.latest(killed / CHECKPOINT_DIR)
    assert last is not None
    resumed_at = int(last.name.removeprefix(checkpoint.PREFIX))
    assert resumed_at % EVERY == 0 and resumed_at <= recorded

    lines: list[str] = []
    resumed = train(_cfg(tiny_gpt2, data), killed, killed / "metrics.jsonl", log=lines.append)
    assert f"[checkpoint] resumed at step {resumed_at} from {last}" in lines
    assert any(line.startswith(f"[lock] {killed}: took over the lock of a run that is gone "
                               "(pid ") for line in lines), lines  # the killed one's, named
    assert resumed.resumed_from_step == resumed_at

    straight = tmp_path / "straight"
    reference = train(_cfg(tiny_gpt2, data), straight, straight / "metrics.jsonl",
                      log=lambda _l: None)
    a = load_file(killed / ADAPTER_DIR / "adapter_model.safetensors")
    b = load_file(straight / ADAPTER_DIR / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-5, worst
    assert resumed.final_loss == pytest.approx(reference.final_loss, abs=1e-5)
    assert resumed.eval_loss == pytest.approx(reference.eval_loss, abs=1e-5)
    # The metrics are one line per step: the steps after the checkpoint are not doubled.
    steps = [json.loads(x)["step"] for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))


def test_a_half_written_checkpoint_is_never_used(tiny_gpt2, demo_data, tmp_path):
    cfg = SFTConfig(model_dir=str(tiny_gpt2), data=str(demo_data["chat"]), steps=4,
                    checkpoint_every=2, device="cpu", batch_size=4, max_length=48)
    train(cfg, tmp_path, tmp_path / "m.jsonl", log=lambda _l: None)
    root = tmp_path / CHECKPOINT_DIR
    assert [p.name for p in checkpoint.completed(root)] == ["step-00000002", "step-00000004"]
    # What a kill during a write leaves: a temporary directory with a partial adapter.
    partial = root / ".tmp-step-00000006-999"
    (partial / "adapter").mkdir(parents=True)
    (partial / "adapter" / "adapter_model.safetensors").write_bytes(b"\0" * 10)
    assert checkpoint.latest(root).name == "step-00000004"
    lines: list[str] = []
    train(cfg, tmp_path, tmp_path / "m.jsonl", log=lines.append)
    assert not partial.exists()
    assert any("resumed at step 4" in line for line in lines)


def test_a_checkpoint_of_another_run_is_refused(tiny_gpt2, demo_data, tmp_path):
    cfg = SFTConfig(model_dir=str(tiny_gpt2), data=str(demo_data["chat"]), steps=2,
                    checkpoint_every=1, device="cpu", batch_size=4, max_length=48)
    train(cfg, tmp_path, tmp_path / "m.jsonl", log=lambda _l: None)
    other = SFTConfig(**{**cfg.__dict__, "learning_rate": 1e-4, "steps": 3})
    with pytest.raises(DrasliceError, match=r"checkpoint of a different run \(learning_rate: "
                                            r"0\.003 there, 0\.0001 now\)"):
        train(other, tmp_path, tmp_path / "m.jsonl", log=lambda _l: None)


def test_rng_state_round_trips():
    state = checkpoint.rng_state()
    first = torch.rand(3)
    checkpoint.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
