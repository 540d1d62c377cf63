"""Everything the training loop needs, built from the config: base model and LoRA, data,
optimizer and schedule; and the state a killed run left, restored.

In order: the base (synthetic GPT-2 of ``shape``, or ``model_dir`` with its tokenizer), the
token rows (completion-only labels, packed on request, an eval split), LoRA on the
architecture's projections with the memory levers (bf16 weights, 4-bit base, gradient
checkpointing, offloaded activations, tiled MLP), the speed plan (``speed``: CUDA graphs,
Liger, torch.compile), fused AdamW on fp32 LoRA weights and a warmup + constant/cosine
schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from draslice.trainer import checkpoint, distributed, loglines, speed
from draslice.trainer.config import SFTConfig
from draslice.trainer.data.examples import (
    TokenRows,
    check_batch_size,
    from_tensor,
    load_examples,
    pack,
    split,
)
from draslice.trainer.data.sampler import BatchSampler
from draslice.trainer.data.synthetic import successor_chains
from draslice.trainer.model import (
    build_base,
    check_vocab_fits,
    count_parameters,
    load_pretrained,
    load_tokenizer,
    resolve_targets,
    wrap_lora,
)
from draslice.trainer.speed import grad_checkpointing, lora_fused, offload, tiled_mlp


@dataclass
class Training:
    """What one run trains: built by :func:`assemble`, stepped by the loop."""

    cfg: SFTConfig
    """The config with ``lora_targets`` resolved for this architecture."""
    model: torch.nn.Module
    tokenizer: object | None
    train_rows: TokenRows
    eval_rows: TokenRows | None
    batches: BatchSampler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    autocast: AbstractContextManager
    plan: speed.SpeedPlan
    """How steps are made fast; with ``plan.mark_steps`` each step must be marked
    (``cudagraph_mark_step_begin``)."""
    trainable_params: int
    total_params: int
    step_loss: distributed.StepLoss
    """The model's loss as a module: FSDP2's root when ``fsdp`` sharded it."""

    def lora_inputs_uncast(self) -> AbstractContextManager:
        """While the loop trains: peft's LoRA layers skip their cast of each input to the fp32
        of the LoRA weights, where bf16 autocast makes their matmuls bf16 anyway.

        The cast is exact to skip (autocast casts the fp32 copy straight back to bf16), but it
        is not free: every LoRA projection made an fp32 copy of its input and kept a bf16 copy
        of that for backward, 0.6 GiB a layer for the 8,960-wide ``down_proj`` input of a 1.5B
        Qwen at 8 x 2,048 tokens, plus the casts' kernels. Only while training (peft's own
        switch, restored after): a forward outside autocast, such as the reference logits of
        a bf16 base, needs the cast to meet the fp32 LoRA weights. For the same span, plain
        LoRA layers add their update inside one matmul (``lora_fused`` says why).
        """
        if not isinstance(self.autocast, torch.autocast):
            return nullcontext()
        from peft.helpers import disable_input_dtype_casting

        stack = ExitStack()
        stack.enter_context(disable_input_dtype_casting(self.model))
        if self.plan.mode not in speed.INDUCTOR_MODES:  # inductor fuses the sum itself
            stack.enter_context(lora_fused.fused(self.model))
        return stack

    def state(self, losses: list[float], optimizer: dict) -> dict:
        """What a checkpoint holds besides the adapter, to resume exactly here (``optimizer``:
        ``distributed.full_optimizer``'s whole state)."""
        return {"optimizer": optimizer,
                "scheduler": self.scheduler.state_dict(),
                "sampler": self.batches.state_dict(), "losses": losses,
                "config": self.cfg.to_dict()}


def assemble(cfg: SFTConfig, device: torch.device, precision: str,
             log: Callable[[str], None]) -> Training:
    tokenizer, base = base_model(cfg, device)
    speed_mode = speed.choose(cfg, device.type == "cuda", log)
    liger = speed.apply_liger(base, device.type == "cuda", speed_mode)
    train_rows, eval_rows = data(cfg, tokenizer)
    cfg = replace(cfg, lora_targets=resolve_targets(base, cfg.lora_targets))
    model = wrap_lora(base, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
    if cfg.gradient_checkpointing:  # on the base, which LoRA wrapped in place
        reentrant = grad_checkpointing.choose(base, eager=speed_mode == "off")
        grad_checkpointing.enable(base, reentrant)
        log(loglines.checkpointed(reentrant))
        if cfg.offload_activations:  # on a CPU the activations are in host memory already
            layers = offload.enable(base) if device.type == "cuda" else 0
            log(loglines.offloaded(layers, device.type))
        if cfg.tile_mlp:
            log(loglines.tiled(tiled_mlp.enable(base)))
    trainable, total = count_parameters(model)
    log(loglines.trainable_params(trainable, total))
    if not cfg.load_in_4bit:  # a 4-bit base is placed on the GPU when it is loaded
        model.to(device)
    plan = speed.prepare(model, speed_mode, liger, log)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.float()  # LoRA weights and their optimizer state stay fp32
    step_loss = distributed.StepLoss(model)
    if cfg.fsdp and distributed.shard(step_loss, log):  # the optimizer must take the shards
        params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                  fused=device.type == "cuda")
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                               cache_enabled=plan.autocast_cache)
                if precision == "bf16" else nullcontext())
    return Training(
        cfg=cfg, model=model, tokenizer=tokenizer, train_rows=train_rows, eval_rows=eval_rows,
        batches=BatchSampler(len(train_rows), cfg.batch_size, cfg.seed + 1),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg)),
        autocast=autocast, plan=plan, trainable_params=trainable, total_params=total,
        step_loss=step_loss,
    )


def resume(run: Training, found: Path | None, log: Callable[[str], None]
           ) -> tuple[int, list[float]]:
    """(last step done, its losses): from checkpoint ``found`` (the newest whole one of a task
    that ran before and was killed: ``checkpoint.latest`` after ``checkpoint.tidy``), or
    (0, []) for a fresh run."""
    if found is None:
        return 0, []
    state = checkpoint.load(found, run.step_loss, run.cfg.to_dict())
    distributed.load_optimizer(run.step_loss, run.optimizer, state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.batches.load_state_dict(state["sampler"])
    checkpoint.set_rng_state(state["rng"])
    log(loglines.resumed(state["step"], found))
    return state["step"], list(state["losses"])


def base_model(cfg: SFTConfig, device: torch.device):
    """(tokenizer or None, base model) for the config: synthetic, or from ``model_dir``."""
    dtype = torch.bfloat16 if cfg.bf16_weights else torch.float32
    if cfg.synthetic:
        return None, build_base(cfg.shape, cfg.seed).to(dtype)
    tokenizer = load_tokenizer(cfg.model_dir)
    base = load_pretrained(cfg.model_dir, dtype=torch.bfloat16 if cfg.load_in_4bit else dtype,
                           load_in_4bit=cfg.load_in_4bit, device=device)
    check_vocab_fits(base, tokenizer, cfg.model_dir)
    return tokenizer, base


def data(cfg: SFTConfig, tokenizer) -> tuple[TokenRows, TokenRows | None]:
    """Training rows and the eval rows (None without ``eval_fraction``)."""
    if cfg.synthetic:
        rows = from_tensor(successor_chains(
            cfg.dataset_size, cfg.shape.seq_len, cfg.alphabet, cfg.shape.vocab_size, cfg.seed
        ))
    else:
        _fmt, rows = load_examples(cfg.data, tokenizer, cfg.data_format, cfg.max_length)
        if cfg.pack:
            rows = pack(rows, cfg.max_length)
    train_rows, eval_rows = split(rows, cfg.eval_fraction, cfg.seed)
    check_batch_size(cfg.batch_size, len(train_rows))
    return train_rows, eval_rows


def lr_factor(cfg: SFTConfig) -> Callable[[int], float]:
    """Linear warmup, then constant or cosine to zero (a function of the step: resumable)."""
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor
