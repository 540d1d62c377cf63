"""The SFT loop under torchrun: two processes on gloo train the adapter one process trains.

The slow tests start ``python -m torch.distributed.run --nproc-per-node 2 -m draslice train``
as a user would; the fast ones check the sharing arithmetic on one process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from draslice.errors import InvalidParameter
from draslice.trainer import checkpoint, distributed, loglines
from draslice.trainer.build import data
from draslice.trainer.config import FINETUNE_KNOBS, SFTConfig
from draslice.trainer.data.examples import IGNORE
from draslice.trainer.loglines import SFT_OK_CPU
from draslice.trainer.outputs import ADAPTER_DIR, CHECKPOINT_DIR, RUN_FILE
from draslice.trainer.presets import FINETUNE
from draslice.trainer.result import loss_drop
from draslice.trainer.sft import train
from draslice.trainer.speed.loss import to_device

STEPS, EVERY, KILL_AFTER, BATCH = 24, 4, 10, 6
TOLERANCE = 1e-5  # the two all-reduced halves sum in another order than one process's batch



def _knobs(model: Path, data_file: Path, steps: int = STEPS) -> dict:
    # Prompt-completion rows: each process's share holds a different number of labelled
    # tokens, so an unweighted mean of the two losses would train another adapter.
    # An fp32 base (the finetune preset's is bf16): TOLERANCE is fp32's reordered sums.
    return dict(model_dir=str(model), data=str(data_file), steps=steps, batch_size=BATCH,
                max_length=48, eval_fraction=0.1, checkpoint_every=EVERY, log_every=5,
                device="cpu", bf16_weights=False)


def _config(knobs: dict) -> SFTConfig:
    """The config ``draslice train`` builds from these options (a model given: the finetune
    preset where an option is not passed), for the in-process runs the torchrun ones match."""
    return SFTConfig(**{**knobs, **FINETUNE.fill(knobs, FINETUNE_KNOBS)})


def _cli(knobs: dict) -> list[str]:
    flags = [k.replace("_", "-") for k in knobs]
    return [a for flag, v in zip(flags, knobs.values(), strict=True)
            for a in ((f"--{flag}",) if v is True else (f"--no-{flag}",) if v is False
                      else (f"--{flag}", str(v)))]


def _torchrun(out: Path, knobs: dict, nproc: int = 2) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--standalone", "-m", "draslice", "train", "--output-dir", str(out),
           *_cli(knobs)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)


def _adapter(out: Path) -> dict:
    return load_file(out / ADAPTER_DIR / "adapter_model.safetensors")


def _worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def one_process(tiny_gpt2, demo_data, tmp_path_factory):
    """The single-process run both slow tests compare with: (output folder, result)."""
    out = tmp_path_factory.mktemp("one-process")
    knobs = _knobs(tiny_gpt2, demo_data["prompt-completion"])
    result = train(_config(knobs), out, out / "metrics.jsonl", log=lambda _l: None)
    return out, result


# -- the sharing arithmetic, on one process ----------------------------------------------------

def test_alone_every_hook_is_the_identity(monkeypatch):
    import torch

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with distributed.start("cpu") as ranks:
        assert (ranks.rank, ranks.world, ranks.is_main, ranks.spread) == (0, 1, True, False)
        rows = torch.tensor([3, 1, 2])
        assert ranks.shard(rows) is rows
        assert ranks.device("auto") == "auto"


def test_shares_weight_each_process_to_the_global_token_mean(tiny_gpt2, demo_data):
    """Two processes' shares of a batch: together their rows are the batch, and the mean
    over processes of (share x own mean token loss) is the batch's mean token loss, though
    each holds a different number of labelled tokens."""
    import torch

    from draslice.trainer.model import load_tokenizer

    cfg = SFTConfig(**_knobs(tiny_gpt2, demo_data["prompt-completion"]))
    rows, _ = data(cfg, load_tokenizer(cfg.model_dir))
    batch_rows = torch.tensor([0, 5, 9, 2, 7])  # odd: the processes get 3 rows and 2
    token_loss = torch.rand(len(rows), 64, generator=torch.Generator().manual_seed(0))

    def labelled_losses(indices) -> torch.Tensor:
        """A stand-in loss for each labelled position of these rows."""
        return torch.cat([token_loss[int(i), [p for p, t in enumerate(rows.labels[int(i)][1:])
                                              if t != IGNORE]] for i in indices])

    expected = float(labelled_losses(batch_rows).mean())
    mean_of_parts, seen = 0.0, []
    for rank in range(2):
        ranks = distributed.Ranks(rank=rank, world=2)
        ranks.index(rows)
        mine = ranks.shard(batch_rows)
        seen += [int(i) for i in mine]
        local = to_device(rows.collate(mine), torch.device("cpu"))
        assert local.count == len(labelled_losses(mine))
        assert ranks.tokens(local, batch_rows) == sum(len(rows.input_ids[int(i)])
                                                      for i in batch_rows)
        mean_of_parts += ranks.share(local, batch_rows) * float(labelled_losses(mine).mean()) / 2
    assert sorted(seen) == sorted(int(i) for i in batch_rows)
    unweighted = (float(labelled_losses(batch_rows[0::2]).mean())
                  + float(labelled_losses(batch_rows[1::2]).mean())) / 2
    assert unweighted != pytest.approx(expected, rel=1e-4)  # the weighting is needed here
    assert mean_of_parts == pytest.approx(expected, rel=1e-6)


def test_a_global_batch_smaller_than_the_processes_is_refused():
    with pytest.raises(InvalidParameter, match=r"batch_size.*at least the 4 processes") as err:
        distributed.Ranks(rank=0, world=4).check(3)
    assert err.value.exit_code == 2


def test_fsdp_refuses_a_4bit_base_and_leaves_a_cuda_graph_to_an_explicit_choice():
    from draslice.trainer import speed

    with pytest.raises(InvalidParameter, match=r"fsdp.*load_in_4bit") as err:
        SFTConfig(fsdp=True, load_in_4bit=True)
    assert err.value.exit_code == 2
    # auto captures the synthetic run's body as a CUDA graph, unless FSDP2 gathers inside it
    assert speed.choose(SFTConfig(), True, print) == "cudagraphs"
    assert speed.choose(SFTConfig(fsdp=True), True, print) == "off"


def test_optimizer_state_loads_by_name_and_from_an_older_checkpoint_by_index():
    """Checkpoints now hold the optimizer state keyed by parameter name (what FSDP2's shards
    gather into); an older checkpoint's, keyed by index, still resumes."""
    import torch

    def net() -> tuple[distributed.StepLoss, torch.optim.Optimizer]:
        step = distributed.StepLoss(torch.nn.Sequential(torch.nn.Linear(3, 2),
                                                        torch.nn.Linear(2, 1)))
        return step, torch.optim.AdamW(step.parameters(), lr=0.1)

    torch.manual_seed(0)
    step, opt = net()
    step.model(torch.ones(4, 3)).sum().backward()
    opt.step()
    by_name = distributed.full_optimizer(step, opt)
    assert set(by_name["state"]) == {"model.0.weight", "model.0.bias", "model.1.weight",
                                     "model.1.bias"}
    for saved in (by_name, opt.state_dict()):
        fresh, fresh_opt = net()
        distributed.load_optimizer(fresh, fresh_opt, saved)
        for a, b in zip(opt.state_dict()["state"].values(),
                        fresh_opt.state_dict()["state"].values(), strict=True):
            assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


# -- two processes on gloo ---------------------------------------------------------------------

@pytest.mark.slow
def test_two_processes_train_the_adapter_one_process_trains(
        one_process, tiny_gpt2, demo_data, tmp_path):
    alone_dir, alone = one_process
    out = tmp_path / "two"
    # Checkpointed here, not alone: the recompute changes no gradient, and under DDP the loop
    # keeps the non-reentrant kind, which a model this small would not get alone
    # (grad_checkpointing.choose).
    knobs = {**_knobs(tiny_gpt2, demo_data["prompt-completion"]), "gradient_checkpointing": True}
    proc = _torchrun(out, knobs)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-3000:]
    assert log.count(loglines.checkpointed(reentrant=False)) == 1
    assert _worst(_adapter(out), _adapter(alone_dir)) <= TOLERANCE
    # Rank 0 alone logs and writes: one copy of each line, one metrics line per step.
    assert log.count(SFT_OK_CPU) == 1 and log.count("[slice] device=") == 1
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    result = json.loads((out / RUN_FILE).read_text())["result"]
    # The figures are the job's: the global batch's mean loss and all its tokens.
    assert result["train_tokens"] == alone.train_tokens
    assert result["final_loss"] == pytest.approx(alone.final_loss, abs=TOLERANCE)
    assert result["eval_loss"] == pytest.approx(alone.eval_loss, abs=TOLERANCE)
    assert loss_drop([s["loss"] for s in steps])[0] == pytest.approx(alone.initial_loss,
                                                                     abs=TOLERANCE)


def _worker(torchrun_pid: int, rank: int) -> int | None:
    """The pid of torchrun's worker of ``rank`` (read from its environment), once started."""
    children = Path(f"/proc/{torchrun_pid}/task/{torchrun_pid}/children")
    for pid in children.read_text().split() if children.exists() else []:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(pid)
    return None


@pytest.mark.slow
def test_a_killed_rank_stops_the_job_and_a_rerun_resumes_on_another_world_size(
        one_process, tiny_gpt2, demo_data, tmp_path):
    alone_dir, alone = one_process
    out = tmp_path / "killed"
    knobs = _knobs(tiny_gpt2, demo_data["prompt-completion"])
    proc = _torchrun(out, knobs)
    metrics, killed = out / "metrics.jsonl", None
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            recorded = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            if recorded >= KILL_AFTER and checkpoint.latest(out / CHECKPOINT_DIR):
                killed = _worker(proc.pid, 1)
                if killed:
                    os.kill(killed, signal.SIGKILL)  # a lost pod: no handler, no clean-up
                    break
            time.sleep(0.005)
        log, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed, "the job ended before a rank could be killed"
    assert proc.returncode != 0, "torchrun went on after a rank was killed"
    recorded = len(metrics.read_text().splitlines())
    assert recorded < STEPS and not (out / RUN_FILE).exists()
    last = checkpoint.latest(out / CHECKPOINT_DIR)
    at = int(last.name.removeprefix(checkpoint.PREFIX))

    # The rerun: one process, from the two processes' last whole checkpoint.
    lines: list[str] = []
    resumed = train(_config(knobs), out, metrics, log=lines.append)
    assert f"[checkpoint] resumed at step {at} from {last}" in lines
    assert resumed.resumed_from_step == at > 0
    assert _worst(_adapter(out), _adapter(alone_dir)) <= TOLERANCE
    assert resumed.final_loss == pytest.approx(alone.final_loss, abs=TOLERANCE)
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_fsdp2_trains_the_adapter_one_process_trains_and_resumes_on_any_world_size(
        one_process, tiny_gpt2, demo_data, tmp_path):
    """FSDP2 over two processes (each holds half of every weight) trains the one-process
    adapter; its gathered checkpoint resumes in one process, and a one-process checkpoint
    resumes sharded over two, both to the same adapter."""
    alone_dir, alone = one_process
    out = tmp_path / "fsdp"
    knobs = {**_knobs(tiny_gpt2, demo_data["prompt-completion"]), "fsdp": True}
    proc = _torchrun(out, knobs)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-3000:]
    assert log.count("[fsdp] 2 blocks and the rest of the model sharded over 2 processes") == 1
    assert _worst(_adapter(out), _adapter(alone_dir)) <= TOLERANCE
    result = json.loads((out / RUN_FILE).read_text())["result"]
    assert result["eval_loss"] == pytest.approx(alone.eval_loss, abs=TOLERANCE)
    assert result["final_loss"] == pytest.approx(alone.final_loss, abs=TOLERANCE)

    def drop_last_checkpoint() -> int:
        """Forget the last checkpoint and the outputs: a rerun resumes from the one before."""
        shutil.rmtree(checkpoint.latest(out / CHECKPOINT_DIR))
        shutil.rmtree(out / ADAPTER_DIR)
        return int(checkpoint.latest(out / CHECKPOINT_DIR).name.removeprefix(checkpoint.PREFIX))

    at = drop_last_checkpoint()  # written by the two sharded processes
    resumed = train(_config(knobs), out, out / "metrics.jsonl", log=lambda _l: None)
    assert resumed.resumed_from_step == at == STEPS - EVERY
    assert _worst(_adapter(out), _adapter(alone_dir)) <= TOLERANCE

    drop_last_checkpoint()  # now written by one process; loaded sharded over two
    proc = _torchrun(out, knobs)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-3000:]
    assert f"[checkpoint] resumed at step {at}" in log
    assert _worst(_adapter(out), _adapter(alone_dir)) <= TOLERANCE
