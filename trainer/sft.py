"""LoRA supervised fine-tuning inside a slice: the training loop, top to bottom.

No HF ``Trainer``: on an H200 a plain loop (bf16 autocast, fused AdamW) ran the seed config
about 5x faster (docs/design.md). The same loop trains the demo run (a small GPT-2 built from
a config, on learnable successor chains) and a user's model from a local directory on JSONL or
a saved dataset. The parts live beside it: the knobs in ``config``, what is trained in
``build``, what is measured and how in ``measure``, what is left behind in ``result``.
Under ``torchrun`` the same loop runs in every process: ``distributed`` shares each batch
out, all-reduces the LoRA gradients (DDP) and keeps writes and log lines to rank 0.

It prints the seed's lines (see ``loglines``) and ends with ``DRA LoRA SFT on GPU slice: OK``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from draslice.trainer import (
    budget,
    build,
    checkpoint,
    distributed,
    folder_lock,
    input_checks,
    loglines,
    outputs,
)
from draslice.trainer import device as dev
from draslice.trainer.config import SFTConfig
from draslice.trainer.measure import Progress, Speed, StepReader, evaluate
from draslice.trainer.result import SFTResult, loss_drop, save_outputs, whole_on_cpu
from draslice.trainer.speed.loss import to_device


@outputs.clear_write_errors
def train(cfg: SFTConfig, output_dir: str | Path, metrics_path: str | Path,
          log: Callable[[str], None] = print) -> SFTResult:
    """Fine-tune, save the adapter into ``output_dir``, write per-step JSON lines.

    Rerunning with the same arguments after a kill resumes from the newest checkpoint.
    """
    started = time.perf_counter()
    cfg.check()
    # torchrun's processes (alone: a no-op); the folders' locks, taken by rank 0's checks
    # (folder_lock), are held until the run ends, however it ends
    with (distributed.start(cfg.device) as ranks,
          folder_lock.held_until_done(output_dir, cfg.checkpoint_dir)):
        return _train(cfg, output_dir, Path(metrics_path), ranks,
                      distributed.quiet(log, ranks), started)


def _train(cfg: SFTConfig, output_dir: str | Path, metrics_path: Path, ranks: distributed.Ranks,
           log: Callable[[str], None], started: float) -> SFTResult:
    ranks.check(cfg.batch_size)
    with ranks.main_first() as main:  # it withdraws the previous record: one process does it
        if main:
            input_checks.check_before_work(cfg, output_dir, log)  # a bad file costs a second
    output_dir = Path(output_dir)  # after the check: Path("") would be the current folder
    device = dev.resolve_device(ranks.device(cfg.device))
    precision = dev.resolve_precision(cfg.precision, device)
    info = dev.describe(device, dev.apply_slice_cap(device, cfg.slice_memory_gib))
    log(loglines.slice_device(info.name, info.total_mem_gib))
    if cfg.synthetic:  # a real run's rows are bounded by the model's positions (inputs)
        budget.check_synthetic_fits(cfg, precision, info.total_mem_gib, info.name)
    dev.reset_peak(device)
    torch.manual_seed(cfg.seed)  # LoRA's init draws from the global generator: same seed, same run

    with dev.out_of_memory_explained(device, info.total_mem_gib, budget.knobs_to_try(cfg)):
        run = build.assemble(cfg, device, precision, log)
        cfg = run.cfg  # with lora_targets resolved
        ckpt_root = outputs.checkpoint_root(cfg.checkpoint_dir, output_dir)
        with ranks.main_first() as main:  # what a killed run left is tidied once, then read
            if main:
                checkpoint.tidy(ckpt_root, log)
        start_step, losses = build.resume(run, checkpoint.latest(ckpt_root), log)
        progress = Progress(metrics_path if ranks.is_main else None, start_step, losses,
                            cfg.log_every, cfg.steps, device, log, cfg.learning_rate,
                            started)
        ranks.index(run.train_rows)
        # DDP when spread (LoRA grads all-reduced), unless fsdp sharded it (build.assemble)
        step_loss = ranks.wrap(run.step_loss, device)
        reader = StepReader(device)
        pad_to = cfg.max_length if cfg.pad_to_max_length and not cfg.synthetic else 0
        run.model.train()
        with run.lora_inputs_uncast():  # peft casts again for the reference logits
            for step in range(start_step + 1, cfg.steps + 1):
                reader.begin()
                if run.plan.mark_steps:  # its outputs may overwrite the last graph's buffers
                    torch.compiler.cudagraph_mark_step_begin()
                rows = run.batches.next()  # the global batch: the same draw in every process
                batch = to_device(run.train_rows.collate(ranks.shard(rows), pad_to=pad_to), device)
                with run.autocast:
                    loss = step_loss(batch, ranks.share(batch, rows))
                loss.backward()
                run.optimizer.step()
                run.scheduler.step()
                run.optimizer.zero_grad(set_to_none=True)
                # The one sync point of a step: on a GPU, push() waits for the *previous* step to
                # end and reads its loss while this one runs (the labelled positions were chosen
                # on the host in to_device, so nothing else in a step waits for the GPU).
                done = reader.push(step, ranks.mean(loss), ranks.tokens(batch, rows),
                                   run.scheduler.get_last_lr()[0])
                saving = cfg.checkpoint_every and (step % cfg.checkpoint_every == 0
                                                   or step == cfg.steps)
                evaluating = run.eval_rows is not None and progress.logged(step)
                if saving or evaluating or step == cfg.steps:
                    # At once, not one step late: a checkpoint never holds a step that diverged,
                    # and step N's eval loss is measured before step N + 1 changes the model.
                    done += reader.flush()
                eval_loss = (evaluate(run.step_loss, run.eval_rows, cfg.batch_size, device,
                                      run.autocast) if evaluating else None)
                for figures in done:
                    progress.add(figures, eval_loss if figures.step == step else None)
                if saving:  # gathered whole by every process (FSDP2), written by rank 0
                    adapter = distributed.full_trainable(run.step_loss)
                    optimizer = distributed.full_optimizer(run.step_loss, run.optimizer)
                    with ranks.main_first() as main:  # all resume from the same whole one
                        if main:
                            checkpoint.save(ckpt_root, step, run.model,
                                            run.state(losses, optimizer), adapter)
            if run.eval_rows is not None and progress.eval_loss is None:  # resumed at the end
                progress.eval_loss = evaluate(run.step_loss, run.eval_rows, cfg.batch_size, device,
                                              run.autocast)
        peak_gib = loglines.gib(ranks.max(dev.peak_memory_bytes(device), device))
        initial, final, drop = loss_drop(losses)
        # no step in this process (resumed at the last step): no speed measured
        run_speed = progress.speed or Speed(0.0, None, 0.0, time.perf_counter() - started)
        result = SFTResult(
            device=info.to_dict(), precision=precision, trainable_params=run.trainable_params,
            total_params=run.total_params, initial_loss=initial, final_loss=final,
            loss_drop=drop, peak_mem_gib=peak_gib, slice_total_mem_gib=info.total_mem_gib,
            tokens_per_s=run_speed.tokens_per_s, steady_from_step=run_speed.steady_from_step,
            warmup_seconds=run_speed.warmup_seconds, wall_seconds=run_speed.wall_seconds,
            train_seconds=progress.train_seconds, steps=cfg.steps, lora_targets=cfg.lora_targets,
            train_tokens=progress.train_tokens, eval_loss=progress.eval_loss,
            resumed_from_step=start_step, train_examples=len(run.train_rows),
            eval_examples=len(run.eval_rows) if run.eval_rows is not None else 0,
        )
        model, out_device = run.model, device
        if distributed.sharded(run.step_loss):  # rank 0 saves from the whole adapter
            adapter = distributed.full_trainable(run.step_loss)
            if ranks.is_main:
                model, out_device = whole_on_cpu(cfg, adapter), torch.device("cpu")
        with ranks.main_first() as main:
            if main:
                save_outputs(model, cfg, run.train_rows, run.tokenizer, result,
                                       output_dir, out_device, log)
    log(loglines.slice_peak(peak_gib))
    log(loglines.sft_ok(device.type == "cuda"))
    return result
