"""The SFT loop under ``torchrun``: one process per device, PyTorch's own machinery throughout.

``torchrun`` starts the processes and sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``;
:func:`start` joins them into a process group (gloo on the CPU, NCCL on CUDA). Without those
variables, or with one process, every hook here is a no-op and a run is exactly the
single-process run.

What each process does differently, and why:

- **Data**: ``batch_size`` is the *global* batch. Every process draws the same global batch
  from the same seeded sampler and trains its own share of it (:meth:`Ranks.shard`), so the
  data order is a function of the global step alone and a checkpoint resumes on any number
  of processes.
- **Gradients**: the model's loss runs inside ``DistributedDataParallel``, which all-reduces the
  gradients of trainable parameters only (LoRA's; the frozen base has none). Each process's
  loss is scaled by its share of the global batch's labelled tokens (:meth:`Ranks.share`), so
  DDP's mean of the gradients is the gradient of the global batch's mean token loss, as one
  process would compute it, also when shards hold different numbers of labelled tokens.
- **Writes and logs**: rank 0 only (:attr:`Ranks.is_main`); the others wait at a barrier
  around every checkpoint, so all resume from the same one.
- **FSDP2** (``fsdp``): :func:`shard` splits the base and the LoRA weights over the processes
  with ``fully_shard`` (each transformer block, then :class:`StepLoss` as the root), so each
  holds ``1/world`` of them between uses; the gradients are reduce-scattered instead of
  all-reduced. Checkpoints and the final adapter are gathered whole (:func:`full_trainable`,
  :func:`full_optimizer`) and loaded back sharded (:func:`load_trainable`,
  :func:`load_optimizer`) through ``torch.distributed.checkpoint.state_dict``, the same
  calls with or without FSDP, so a checkpoint resumes on any number of processes.
- **Figures**: the loss is averaged over processes, the tokens summed (each step counts the
  global batch), the peak memory is the largest of any process.

docs/distributed.md has the torchrun lines and how MIG limits this.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from draslice.errors import InvalidParameter
from draslice.trainer import loglines
from draslice.trainer.data.examples import IGNORE, TokenRows
from draslice.trainer.speed.loss import LossBatch, causal_lm_loss
from draslice.trainer.torchrun_env import launched


class StepLoss(torch.nn.Module):
    """The model's loss on a batch, as a module: ``causal_lm_loss`` calls the backbone and the
    head directly, so DDP must wrap this call, not the model's ``forward``, to see each step."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: LossBatch, share: float = 1.0) -> torch.Tensor:
        loss = causal_lm_loss(self.model, batch)
        return loss if share == 1.0 else loss * share


@dataclass
class Ranks:
    """This process's place in the job: rank, number of processes, and the hooks the loop
    calls. ``world == 1`` (no torchrun) makes every hook the identity."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    _label_counts: list[int] = field(default_factory=list, repr=False)
    _lengths: list[int] = field(default_factory=list, repr=False)

    @property
    def is_main(self) -> bool:
        """Whether this process writes files and log lines."""
        return self.rank == 0

    @property
    def spread(self) -> bool:
        return self.world > 1

    def device(self, spec: str) -> str:
        """The device spec for this process: ``auto``/``cuda`` become this process's GPU (the
        only one it sees when each process is given one device, as the DRA driver does with
        one MIG device per claim; else ``cuda:LOCAL_RANK``). ``cpu`` and ``cuda:N`` stay."""
        spec = (spec or "auto").strip().lower()
        if not self.spread or spec not in ("auto", "cuda") or not torch.cuda.is_available():
            return spec
        return "cuda:0" if torch.cuda.device_count() == 1 else f"cuda:{self.local_rank}"

    def check(self, batch_size: int) -> None:
        """Refuse a global batch with fewer examples than processes: a process with none
        would have nothing to train."""
        if batch_size < self.world:
            raise InvalidParameter(
                "batch_size", batch_size,
                f"must be at least the {self.world} processes (it is the global batch, "
                "shared out among them)")

    def index(self, rows: TokenRows) -> None:
        """Note each training row's labelled tokens and length, so every process knows the
        global batch's totals from the indices alone, with no communication."""
        if self.spread:
            self._label_counts = [sum(1 for t in row[1:] if t != IGNORE) for row in rows.labels]
            self._lengths = [len(row) for row in rows.input_ids]

    def shard(self, global_rows: torch.Tensor) -> torch.Tensor:
        """This process's rows of the global batch (every ``world``-th, from ``rank``)."""
        return global_rows[self.rank::self.world] if self.spread else global_rows

    def share(self, batch: LossBatch, global_rows: torch.Tensor) -> float:
        """The factor on this process's mean token loss that makes DDP's gradient mean the
        gradient of the global batch's mean: ``world * local labelled / global labelled``."""
        if not self.spread:
            return 1.0
        total = sum(self._label_counts[int(i)] for i in global_rows)
        return self.world * batch.count / total if total else 1.0

    def tokens(self, batch: LossBatch, global_rows: torch.Tensor) -> int:
        """Real tokens of the global batch: what the job trained this step."""
        if not self.spread:
            return batch.tokens
        return sum(self._lengths[int(i)] for i in global_rows)

    def wrap(self, step: StepLoss, device: torch.device) -> torch.nn.Module:
        """The module whose call is a training step's loss: DDP over ``step`` when spread
        (gradients of trainable parameters all-reduced, buckets sized by DDP), else ``step``
        itself, also when :func:`shard` made it FSDP2's root (FSDP reduces the gradients)."""
        if not self.spread or sharded(step):
            return step
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            step, device_ids=[device.index] if device.type == "cuda" else None)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean over processes of a scalar tensor (a step's loss), queued on its stream:
        on a GPU nothing waits for it until the loss is read."""
        if not self.spread:
            return value
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value / self.world

    def max(self, value: float, device: torch.device) -> float:
        """The largest ``value`` of any process (peak memory)."""
        if not self.spread:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def barrier(self) -> None:
        if self.spread:
            dist.barrier()

    @contextmanager
    def main_first(self) -> Iterator[bool]:
        """Rank 0 runs the block (a write, a clean-up) while the others wait; yields whether
        this process is the one that should act. A block that raises skips the barrier: the
        process ends with its error and torchrun stops the others."""
        yield self.is_main
        self.barrier()


def shard(step: StepLoss, log: Callable[[str], None]) -> bool:
    """FSDP2 over the processes, when there are several: ``fully_shard`` on each transformer
    block (the classes the model names in ``_no_split_modules``, which HF keeps whole across
    devices), then on ``step`` as the root (the embeddings, the head). Before the optimizer
    is built: it must hold the sharded parameters. Returns whether it sharded."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return False
    from torch.distributed.fsdp import fully_shard

    base = step.model.get_base_model()
    blocks = set(getattr(base, "_no_split_modules", None) or ())
    if not blocks:
        raise InvalidParameter("fsdp", True, f"needs a model that names its transformer block "
                               f"(_no_split_modules); {type(base).__name__} names none")
    found = [m for m in base.modules() if type(m).__name__ in blocks]
    for module in found:
        fully_shard(module)
    fully_shard(step)
    log(loglines.fsdp_sharded(len(found), dist.get_world_size()))
    return True


def sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_trainable(step: StepLoss) -> dict[str, torch.Tensor]:
    """The trainable (LoRA) weights, whole, on the CPU, keyed as in the peft model. Every
    process must call it (under FSDP it gathers the shards); rank 0 gets the weights, the
    others may get none."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    full = get_model_state_dict(step, options=_options(ignore_frozen_params=True,
                                                       cpu_offload=True))
    return {name.removeprefix("model."): value for name, value in full.items()}


def full_optimizer(step: StepLoss, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state, whole, keyed by parameter name (so it loads into any number of
    processes); every process calls it, rank 0 gets the state."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(step, optimizer, options=_options(cpu_offload=True))


def load_trainable(step: StepLoss, adapter: dict[str, torch.Tensor]) -> None:
    """Load a saved adapter (peft's keys, as ``save_pretrained`` wrote them) into ``step``'s
    model, sharded or not. peft's own renaming maps each parameter to its saved key."""
    from peft import get_peft_model_state_dict
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    names = [n for n, p in step.model.named_parameters() if p.requires_grad]
    saved_as = get_peft_model_state_dict(
        step.model, state_dict={n: torch.tensor(i) for i, n in enumerate(names)})
    by_key = {key: names[int(i)] for key, i in saved_as.items()}
    set_model_state_dict(step, {f"model.{by_key[k]}": v for k, v in adapter.items()},
                         options=_options(strict=False))


def load_optimizer(step: StepLoss, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a saved optimizer state into ``optimizer``, sharded or not. A state of an older
    checkpoint, keyed by parameter index, loads as it was saved (one process's, or DDP's)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if any(isinstance(k, int) for k in state.get("state", {})):
        optimizer.load_state_dict(state)
        return
    set_optimizer_state_dict(step, optimizer, state, options=_options())


@contextmanager
def start(device_spec: str) -> Iterator[Ranks]:
    """Join torchrun's process group for the run's length (gloo on the CPU, NCCL on CUDA) and
    leave it after; without torchrun, or with one process, nothing is started."""
    rank, world, local = launched()
    ranks = Ranks(rank, world, local)
    if not ranks.spread or dist.is_initialized():
        yield ranks
        return
    spec = ranks.device(device_spec)
    on_cuda = spec.startswith("cuda") or (spec == "auto" and torch.cuda.is_available())
    if on_cuda:
        torch.cuda.set_device(torch.device(spec if spec.startswith("cuda:") else "cuda:0"))
    dist.init_process_group("nccl" if on_cuda else "gloo")
    try:
        yield ranks
    finally:
        dist.destroy_process_group()


def quiet(log: Callable[[str], None], ranks: Ranks) -> Callable[[str], None]:
    """``log`` on rank 0; elsewhere a log that drops its lines (users grep one copy)."""
    return log if ranks.is_main else _drop


def _drop(_line: str) -> None:
    pass

