"""benchmarks/loss_match.py: our loop's loss curve against HF Trainer + peft's.

The fast tests check the parts that make the comparison fair and able to fail (the batch
order HF is given, the LoRA digest, the curve comparison, the refusals and the control); the
slow one runs the script's whole CPU smoke; the GPU one the full 200-step comparison, which
keeps target 6 of issue 39: speed never changes what is learned.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from draslice.benchmarks import loss_match as lm
from draslice.tests.conftest import REPO, requires_cuda
from draslice.trainer.data.examples import IGNORE, TokenRows
from draslice.trainer.data.sampler import BatchSampler

SCRIPT = REPO / "benchmarks" / "loss_match.py"


def _rows(n: int = 10, width: int = 16) -> TokenRows:
    """Rows with distinct ids, the last one short (a packed run's remainder)."""
    ids = [[i * 100 + t for t in range(width if i < n - 1 else width - 5)] for i in range(n)]
    labels = [[IGNORE] * 2 + row[2:] for row in ids]
    return TokenRows(ids, labels, pad_id=0)


def test_hf_is_given_the_loops_batches_in_the_loops_order():
    rows, batch, seed, steps = _rows(), 3, 5, 7
    order = lm.loop_order(len(rows), batch, seed, steps)
    sampler = BatchSampler(len(rows), batch, seed + 1)  # as build.assemble makes it
    assert order == [sampler.next().tolist() for _ in range(steps)]

    dataset = lm.hf_dataset(order)
    trainer_cls = lm.in_order_trainer({})
    hf_sampler = trainer_cls._get_train_sampler(SimpleNamespace(train_dataset=dataset))
    assert isinstance(hf_sampler, torch.utils.data.SequentialSampler)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=hf_sampler,
                                         collate_fn=lm.RowCollator(rows))
    seen = list(loader)
    assert len(seen) == steps
    for step_rows, got in zip(order, seen, strict=True):
        ours = rows.collate(step_rows)
        assert got["rows"].tolist() == step_rows
        assert torch.equal(got["input_ids"], ours["input_ids"])
        assert torch.equal(got["labels"], ours["labels"])
        # Right padding: the loop gives the model no mask, and neither does HF's collator.
        assert "attention_mask" not in got


def test_the_lora_digest_is_the_same_for_the_same_seed_and_differs_for_another():
    from draslice.trainer.config import ModelShape
    from draslice.trainer.model import build_base, wrap_lora

    shape = ModelShape(vocab_size=32, n_layer=1, n_embd=16, n_head=2, seq_len=8)

    def lora(seed: int):
        torch.manual_seed(seed)  # as sft._train before build.assemble
        return wrap_lora(build_base(shape, 0), 4, 8, 0.0, "c_attn")

    first, again, other = (lm.lora_digest(lora(s)) for s in (0, 0, 1))
    assert first == again
    assert first["sha256"] != other["sha256"] and first["tensors"] == 2
    assert first["abs_sum_A"] > 0 and first["abs_sum_B"] == 0  # peft starts B at zero


def test_a_curve_that_differs_fails_and_one_within_the_tolerance_passes():
    ref = [12.0 - 0.03 * k for k in range(50)]
    close = [x + (1e-3 if k % 2 else -1e-3) for k, x in enumerate(ref)]
    m = lm.compare_curves(close, ref, 2e-2)
    assert m.passed and m.max_abs == pytest.approx(1e-3) and m.steps == 50
    assert m.final == close[-1] and m.final_ref == ref[-1]

    off = list(ref)
    off[30] += 0.05  # one step learned something else
    m = lm.compare_curves(off, ref, 2e-2)
    assert not m.passed and m.worst_step == 31 and m.max_abs == pytest.approx(0.05)
    assert m.max_rel == pytest.approx(0.05 / ref[30])
    assert not lm.compare_curves(ref[:40], ref, 2e-2).passed  # stopped early


def _run(sha: str = "a", order: list | None = None, shift: float = 0.0) -> dict:
    losses = [12.0 - 0.03 * k + shift * (k > 10) for k in range(40)]
    return {"init": {"sha256": sha}, "order": order or [[0, 1], [2, 3]], "losses": losses}


def test_runs_from_other_initial_lora_weights_or_batches_are_refused_not_compared():
    runs = {"hf": _run(), "hf-other-seed": _run("b", [[1, 0], [3, 2]], shift=0.5),
            "eager": _run(), "no-groups": _run(sha="c"), "tiled": _run(order=[[0, 1], [3, 2]])}
    judged = lm.judge(runs, 2e-2)
    verdicts = {n: m["verdict"] for n, m in judged["matches"].items()}
    assert verdicts == {"hf-other-seed": "control", "eager": "PASS", "no-groups": lm.REFUSED,
                        "tiled": lm.REFUSED}
    assert "initial LoRA weights differ" in judged["matches"]["no-groups"]["why"]
    assert "batches differ" in judged["matches"]["tiled"]["why"]
    assert not judged["ok"]
    del runs["no-groups"], runs["tiled"]
    assert lm.judge(runs, 2e-2)["ok"]


def test_a_control_that_the_tolerance_cannot_tell_apart_fails_the_check():
    runs = {"hf": _run(), "hf-other-seed": _run("b", [[1, 0], [3, 2]], shift=0.05),
            "eager": _run()}
    judged = lm.judge(runs, 2e-2)  # 0.05 < 5 x 0.02
    assert "cannot tell" in judged["control_problem"] and not judged["ok"]
    assert lm.judge(runs, 1e-2)["ok"]  # 0.05 >= 5 x 0.01
    runs["hf-other-seed"]["init"]["sha256"] = "a"  # the seed never reached the init
    assert "did not reach" in lm.judge(runs, 1e-2)["control_problem"]
    del runs["hf-other-seed"]
    assert "no control run" in lm.judge(runs, 1e-2)["control_problem"]


def test_a_failed_or_skipped_run_is_no_pass():
    runs = {"hf": _run(), "hf-other-seed": _run("b", [[1, 0], [3, 2]], shift=0.5),
            "eager": {"error": "exit 1: boom"}, "default": {"skipped": "CUDA only"}}
    judged = lm.judge(runs, 2e-2)
    assert judged["matches"]["eager"] == {"verdict": "ERROR", "why": "exit 1: boom"}
    assert judged["matches"]["default"]["verdict"] == "SKIPPED" and not judged["ok"]
    assert "ERROR: exit 1: boom" in "\n".join(lm.table({
        "shape": "smoke", "batch": 4, "seq": 64, "steps": 40, "tolerance": 2e-2,
        "runs": runs, **judged}))


def test_each_finished_run_is_saved_before_the_others_end(tmp_path, monkeypatch):
    """A parent stopped while runs are still going keeps the curves of those that finished:
    the JSON is rewritten, marked partial, as each run ends."""
    out = tmp_path / "loss_match.json"
    written = []
    real_write = lm.write_json

    def write(path, data):
        real_write(path, data)
        written.append(sorted(json.loads(out.read_text())["runs"]))

    monkeypatch.setattr(lm, "write_json", write)
    monkeypatch.setattr(lm, "one_child", lambda args, inputs, name, result, env: {
        "losses": [1.0, 0.5], "name": name})
    args = SimpleNamespace(jobs=1, smoke=False, json_out=str(out), shape="smoke")
    runs = lm.run_children(args, {}, ["eager", "tiled"])
    assert list(runs) == ["hf", "hf-other-seed", "eager", "tiled"]
    assert [len(names) for names in written] == [1, 2, 3, 4]
    assert all(set(a) <= set(b) for a, b in zip(written, written[1:], strict=False))
    saved = json.loads(out.read_text())
    assert saved["partial"] is True and sorted(saved["runs"]) == sorted(runs)


@pytest.mark.slow  # a process that imports torch and transformers: seconds
def test_bad_input_is_one_line():
    done = subprocess.run([sys.executable, str(SCRIPT), "--settings", "eager,turbo", "--smoke"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1].endswith(
        "error: unknown settings ['turbo']; choose from " + ", ".join(lm.SETTINGS))


@pytest.mark.slow
def test_smoke_on_a_cpu_matches_hf_within_the_tolerance_and_the_control_does_not(tmp_path):
    out = tmp_path / "loss.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--steps", "20",
                           "--json-out", str(out)], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "| setting | steps | max abs Δ loss vs HF |" in done.stdout
    summary = json.loads(out.read_text())
    tol = summary["tolerance"]
    assert tol == lm.SMOKE_TOLERANCE
    ran = {n: m for n, m in summary["matches"].items() if n in lm.SETTINGS
           and m["verdict"] != "SKIPPED"}
    assert set(ran) == {n for n, s in lm.SETTINGS.items() if not s.cpu_skip}
    for name, m in ran.items():
        assert m["verdict"] == "PASS" and m["steps"] == 20, (name, m)
        assert m["max_abs"] <= tol
    # The check can fail: a run from another seed drifts by far more than the tolerance.
    control = summary["matches"][lm.CONTROL]
    assert control["max_abs"] >= lm.CONTROL_MARGIN * tol
    assert control["max_abs"] > 10 * max(m["max_abs"] for m in ran.values())
    assert summary["runs"]["eager"]["init"] == summary["runs"]["hf"]["init"]
    assert summary["runs"]["hf-other-seed"]["init"] != summary["runs"]["hf"]["init"]


@pytest.mark.gpu
@requires_cuda
def test_every_speed_setting_learns_what_hf_trainer_learns_on_a_gpu(tmp_path):
    out = tmp_path / "loss.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--json-out", str(out)],
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert summary["steps"] == 200 and summary["shape"] == "qwen2.5-0.5b"
    verdicts = {n: m["verdict"] for n, m in summary["matches"].items() if n in lm.SETTINGS}
    assert verdicts == dict.fromkeys(lm.SETTINGS, "PASS"), "\n".join(summary["table"])
    assert not summary["control_problem"]
