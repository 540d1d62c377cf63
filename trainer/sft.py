"""LoRA supervised fine-tuning inside a slice: one training loop we own, top to bottom.

No HF ``Trainer``: on an H200 a plain loop (bf16 autocast, fused AdamW) ran the seed config
about 5x faster (docs/design.md). The same loop trains the synthetic default (a small GPT-2 built
from a config, on learnable successor chains: what ``draslice run`` and the compiled pipelines
do) and a user's model from a local directory on JSONL or a saved dataset. In order:

1. device, precision, the slice cap;
2. base model (+ tokenizer) and data, as token rows with completion-only labels;
3. LoRA on the architecture's projections; memory levers (bf16 weights, 4-bit base,
   gradient checkpointing); the loss is chunked through the LM head (``loss``);
4. resume from the newest checkpoint if this output already has one;
5. the loop: loss, step, a JSON line of metrics, eval loss at log steps, atomic checkpoints;
6. the adapter (atomically), reference logits for validate, the merged model on request.

It prints the seed's lines (see ``loglines``) and ends with ``DRA LoRA SFT on GPU slice: OK``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from draslice.errors import InvalidParameter, SliceOutOfMemory, TrainingDiverged
from draslice.trainer import budget, checkpoint, loglines
from draslice.trainer import device as dev
from draslice.trainer.data import BatchSampler, successor_chains
from draslice.trainer.examples import FORMATS, TokenRows, from_tensor, load_examples, pack, split
from draslice.trainer.loss import causal_lm_loss, split_head, to_device
from draslice.trainer.model import (
    AUTO_TARGETS,
    ModelShape,
    build_base,
    check_vocab_fits,
    count_parameters,
    load_pretrained,
    load_tokenizer,
    resolve_targets,
    wrap_lora,
)

RUN_FILE = "draslice_sft.json"
REFERENCE_FILE = "reference_logits.pt"
ADAPTER_DIR = "adapter"
MERGED_DIR = "merged"
CHECKPOINT_DIR = "checkpoints"
LOSS_TAIL = 5  # the final loss is the mean of the last steps: one batch is noisy
LR_SCHEDULES = ("constant", "cosine")
COMPILE_MODES = ("off", "default", "reduce-overhead")
REFERENCE_ROWS, REFERENCE_TOKENS = 2, 16  # a real vocabulary makes full logits big


@dataclass
class SFTConfig:
    """Every knob of the fine-tune. Defaults reproduce the seed's example shape.

    The LoRA targets default to attention *and* MLP projections (``auto``: per architecture):
    on a random-init base the seed's attention-only choice (``lora_targets="c_attn"``) lowers
    the loss by ~15% in 30 steps, attention+MLP by >30%.

    Without ``model_dir``/``data`` the base is the synthetic GPT-2 of ``shape`` and the data
    are successor chains (``dataset_size``, ``alphabet``); with them, ``shape`` is unused and
    ``max_length`` bounds each example (or each packed row).
    """

    shape: ModelShape = field(default_factory=ModelShape)
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_targets: str = AUTO_TARGETS
    batch_size: int = 8
    steps: int = 30
    learning_rate: float = 3e-3
    weight_decay: float = 0.0
    log_every: int = 10
    dataset_size: int = 256
    alphabet: int = 64
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"
    slice_memory_gib: float = 0.0
    # A real fine-tune: base model directory and data (empty: the synthetic default).
    model_dir: str = ""
    data: str = ""
    data_format: str = "auto"
    max_length: int = 512
    pack: bool = False
    eval_fraction: float = 0.0
    # Memory levers.
    gradient_checkpointing: bool = False
    load_in_4bit: bool = False
    bf16_weights: bool = False
    # Schedule, checkpoints, export.
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    checkpoint_every: int = 0
    checkpoint_dir: str = ""
    merge: bool = False
    pad_to_max_length: bool = False  # every batch max_length wide: the worst case, for advise
    # Speed: compile the transformer body with torch.compile (inductor), one of COMPILE_MODES.
    # "default": fewer, fused kernels and no per-module Python per step. "reduce-overhead":
    # that, replayed as CUDA graphs (one launch per pass; on the H200 the seed config went
    # from 66,525 to 129,211 tokens/s over "default" in one A/B run); a graph is recorded
    # per batch shape, so it suits fixed-width batches (packing, the synthetic data). Either
    # costs a one-off compile (tens of seconds), so "off" is the default: a 30-step run would
    # mostly compile.
    compile: str = "off"

    @property
    def synthetic(self) -> bool:
        return not self.model_dir

    def check(self) -> None:
        """Reject bad input before any model is built."""
        self.shape.check()
        if bool(self.model_dir) != bool(self.data):
            missing = "data" if self.model_dir else "model_dir"
            raise InvalidParameter(
                missing, "", "a real fine-tune needs both model_dir (a local HF model directory) "
                "and data (JSONL or a saved dataset); give both, or neither for the synthetic run"
            )
        if self.data_format not in FORMATS:
            raise InvalidParameter("data_format", self.data_format,
                                   f"must be one of {', '.join(FORMATS)}")
        if self.max_length < 2:
            raise InvalidParameter("max_length", self.max_length, "must be >= 2")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise InvalidParameter("eval_fraction", self.eval_fraction, "must be in [0, 1)")
        if self.compile not in COMPILE_MODES:
            raise InvalidParameter("compile", self.compile,
                                   f"must be one of {', '.join(COMPILE_MODES)}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise InvalidParameter("lr_schedule", self.lr_schedule,
                                   f"must be one of {', '.join(LR_SCHEDULES)}")
        if not 0 <= self.warmup_steps < max(self.steps, 1):
            raise InvalidParameter("warmup_steps", self.warmup_steps,
                                   f"must be in [0, steps={self.steps})")
        if self.checkpoint_every < 0:
            raise InvalidParameter("checkpoint_every", self.checkpoint_every,
                                   "must be >= 0 (0: no checkpoints)")
        if self.steps <= 0:
            raise InvalidParameter("steps", self.steps, "must be >= 1")
        if self.log_every <= 0:
            raise InvalidParameter("log_every", self.log_every, "must be >= 1")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise InvalidParameter("learning_rate", self.learning_rate, "must be > 0")
        if self.weight_decay < 0:
            raise InvalidParameter("weight_decay", self.weight_decay, "must be >= 0")
        if self.dataset_size <= 0:
            raise InvalidParameter("dataset_size", self.dataset_size, "must be >= 1")
        if self.batch_size <= 0 or (self.synthetic and self.batch_size > self.dataset_size):
            raise InvalidParameter(
                "batch_size", self.batch_size, f"must be in [1, dataset_size={self.dataset_size}]"
            )
        if not 2 <= self.alphabet <= self.shape.vocab_size:
            raise InvalidParameter(
                "alphabet", self.alphabet, f"must be in [2, vocab_size={self.shape.vocab_size}]"
            )
        if self.slice_memory_gib < 0:
            raise InvalidParameter("slice_memory_gib", self.slice_memory_gib, "must be >= 0")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> SFTConfig:
        raw = dict(raw)
        shape = ModelShape(**raw.pop("shape", {}))
        return cls(shape=shape, **raw)


@dataclass
class SFTResult:
    device: dict
    precision: str
    trainable_params: int
    total_params: int
    initial_loss: float
    final_loss: float
    loss_drop: float
    peak_mem_gib: float
    slice_total_mem_gib: float
    tokens_per_s: float
    train_seconds: float
    steps: int
    lora_targets: str = ""
    train_tokens: int = 0
    eval_loss: float | None = None
    resumed_from_step: int = 0
    train_examples: int = 0
    eval_examples: int = 0
    merged_dir: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def loss_drop(losses: list[float]) -> tuple[float, float, float]:
    """(initial, final, fraction fallen): first step against the mean of the last steps."""
    initial = losses[0]
    tail = losses[-LOSS_TAIL:]
    final = sum(tail) / len(tail)
    return initial, final, (1.0 - final / initial) if initial > 0 else 0.0


def train(
    cfg: SFTConfig,
    output_dir: str | Path,
    metrics_path: str | Path,
    log: Callable[[str], None] = print,
) -> SFTResult:
    """Fine-tune, save the adapter into ``output_dir``, write per-step JSON lines.

    Rerunning with the same arguments after a kill resumes from the newest checkpoint.
    """
    cfg.check()
    output_dir, metrics_path = Path(output_dir), Path(metrics_path)
    torch_device = dev.resolve_device(cfg.device)
    precision = dev.resolve_precision(cfg.precision, torch_device)
    cap = dev.apply_slice_cap(torch_device, cfg.slice_memory_gib)
    info = dev.describe(torch_device, cap)
    on_cuda = torch_device.type == "cuda"
    log(loglines.slice_device(info.name, info.total_mem_gib))

    dev.reset_peak(torch_device)
    torch.manual_seed(cfg.seed)  # LoRA's init draws from the global generator: same seed, same run
    try:
        # Model and data.
        tokenizer, base = _base_model(cfg, torch_device)
        train_rows, eval_rows = _data(cfg, tokenizer)
        batches = BatchSampler(len(train_rows), cfg.batch_size, cfg.seed + 1)
        cfg = replace(cfg, lora_targets=resolve_targets(base, cfg.lora_targets))
        model = wrap_lora(base, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
        if cfg.gradient_checkpointing:
            model.get_base_model().gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        trainable, total = count_parameters(model)
        log(loglines.trainable_params(trainable, total))
        if not cfg.load_in_4bit:  # a 4-bit base is placed on the GPU when it is loaded
            model.to(torch_device)
        graphs = _compile(model, cfg.compile, on_cuda, log)
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.data = p.data.float()  # LoRA weights and their optimizer state stay fp32
        optimizer = torch.optim.AdamW(
            params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, fused=on_cuda
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg))
        autocast = (
            torch.autocast(device_type=torch_device.type, dtype=torch.bfloat16)
            if precision == "bf16"
            else nullcontext()
        )

        # Resume: the newest whole checkpoint of this run, if the task ran before.
        ckpt_root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else output_dir / CHECKPOINT_DIR
        checkpoint.clean_partial(ckpt_root)
        losses: list[float] = []
        start_step = 0
        found = checkpoint.latest(ckpt_root)
        if found is not None:
            state = checkpoint.load(found, model, cfg.to_dict())
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            batches.load_state_dict(state["sampler"])
            checkpoint.set_rng_state(state["rng"])
            losses, start_step = list(state["losses"]), state["step"]
            log(loglines.resumed(start_step, found))
        _keep_metrics_until(metrics_path, start_step)

        # The loop. Nothing in a step waits for the GPU: the labelled positions were chosen on
        # the host (``to_device``), and each step's loss is read while the next step runs
        # (``LossReader``). Checkpoints and the last step read it at once.
        pad_to = cfg.max_length if cfg.pad_to_max_length and not cfg.synthetic else 0
        eval_loss = None
        train_tokens = 0
        reader = LossReader(torch_device)
        model.train()
        train_start = last_done = time.perf_counter()

        def log_step(step: int) -> bool:
            return step % cfg.log_every == 0 or step == start_step + 1 or step == cfg.steps

        def finish(step: int, tokens: int, lr: float) -> None:
            """Record a step whose loss has been read: divergence check, metrics, logs."""
            nonlocal eval_loss, last_done
            loss_value = reader.read()
            now = time.perf_counter()
            step_seconds, last_done = now - last_done, now
            if not math.isfinite(loss_value):
                raise TrainingDiverged(
                    f"loss became {loss_value} at step {step}; training stopped. "
                    f"Lower learning_rate (now {cfg.learning_rate}), add warmup_steps "
                    "or use precision=fp32."
                )
            losses.append(loss_value)
            peak = dev.peak_memory_bytes(torch_device)
            record = {
                "step": step,
                "loss": loss_value,
                "tokens_per_s": tokens / step_seconds,
                "peak_mem_gib": loglines.gib(peak),
                "mem_gib": loglines.gib(torch.cuda.memory_allocated(torch_device))
                if on_cuda
                else loglines.gib(peak),
                "lr": lr,
            }
            logged = log_step(step)
            if eval_rows is not None and logged:
                eval_loss = evaluate(model, eval_rows, cfg.batch_size, torch_device, autocast)
                record["eval_loss"] = eval_loss
                last_done = time.perf_counter()  # evaluation is not training time
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            if logged:
                log(loglines.step_loss(step, loss_value, record["tokens_per_s"]))
                if "eval_loss" in record:
                    log(loglines.eval_loss(step, eval_loss))

        with metrics_path.open("a") as metrics:
            pending: tuple[int, int, float] | None = None  # a step whose loss is not read yet
            for step in range(start_step + 1, cfg.steps + 1):
                if graphs:  # this step's outputs may overwrite the last step's graph buffers
                    torch.compiler.cudagraph_mark_step_begin()
                batch = to_device(train_rows.collate(batches.next(), pad_to=pad_to), torch_device)
                with autocast:
                    loss = causal_lm_loss(model, batch)
                loss.backward()
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                if pending is not None:
                    finish(*pending)  # the previous step, while this one runs on the GPU
                reader.queue(loss)
                train_tokens += batch.tokens
                pending = (step, batch.tokens, scheduler.get_last_lr()[0])
                saving = cfg.checkpoint_every and (step % cfg.checkpoint_every == 0
                                                   or step == cfg.steps)
                evaluating = eval_rows is not None and log_step(step)
                # At once, not one step late: a checkpoint never holds a step that diverged,
                # and the eval loss of step N is measured before step N + 1 updates the model.
                if saving or evaluating or step == cfg.steps or not reader.lagged:
                    finish(*pending)
                    pending = None
                if saving:
                    checkpoint.save(ckpt_root, step, model, {
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "sampler": batches.state_dict(),
                        "losses": losses,
                        "config": cfg.to_dict(),
                    })
        train_seconds = time.perf_counter() - train_start
        peak_gib = loglines.gib(dev.peak_memory_bytes(torch_device))
        if eval_rows is not None and eval_loss is None:  # resumed at the last step
            eval_loss = evaluate(model, eval_rows, cfg.batch_size, torch_device, autocast)
        _save(model, cfg, _reference_batch(cfg, train_rows), output_dir, torch_device)
    except torch.OutOfMemoryError as err:
        reached = loglines.gib(dev.peak_memory_bytes(torch_device))
        raise SliceOutOfMemory(
            budget.oom_advice(info.total_mem_gib, reached, budget.knobs_to_try(cfg))
        ) from err

    merged = export_merged(cfg, output_dir, tokenizer, log) if cfg.merge else None
    initial, final, drop = loss_drop(losses)
    steps_here = cfg.steps - start_step
    result = SFTResult(
        device=info.to_dict(),
        precision=precision,
        trainable_params=trainable,
        total_params=total,
        initial_loss=initial,
        final_loss=final,
        loss_drop=drop,
        peak_mem_gib=peak_gib,
        slice_total_mem_gib=info.total_mem_gib,
        tokens_per_s=train_tokens / train_seconds if steps_here else 0.0,
        train_seconds=train_seconds,
        steps=cfg.steps,
        lora_targets=cfg.lora_targets,
        train_tokens=train_tokens,
        eval_loss=eval_loss,
        resumed_from_step=start_step,
        train_examples=len(train_rows),
        eval_examples=len(eval_rows) if eval_rows is not None else 0,
        merged_dir=str(merged) if merged else None,
    )
    (output_dir / RUN_FILE).write_text(
        json.dumps({"config": cfg.to_dict(), "result": result.to_dict()}, indent=2) + "\n"
    )
    log(loglines.slice_peak(peak_gib))
    log(loglines.sft_ok(on_cuda))
    return result


def _compile(model: torch.nn.Module, mode: str, on_cuda: bool, log: Callable[[str], None]
             ) -> bool:
    """torch.compile the transformer body in place (``mode`` from COMPILE_MODES); whether
    CUDA graphs are in use. In place: module names and the saved adapter stay the same."""
    if mode == "off":
        return False
    if mode == "reduce-overhead" and not on_cuda:
        log("compile: CUDA graphs need a GPU; compiling without them (mode 'default')")
        mode = "default"
    split_head(model)[0].compile(mode=mode)
    return mode == "reduce-overhead"


def _base_model(cfg: SFTConfig, torch_device: torch.device):
    """(tokenizer or None, base model) for the config: synthetic, or from ``model_dir``."""
    dtype = torch.bfloat16 if cfg.bf16_weights else torch.float32
    if cfg.synthetic:
        return None, build_base(cfg.shape, cfg.seed).to(dtype)
    tokenizer = load_tokenizer(cfg.model_dir)
    base = load_pretrained(cfg.model_dir, dtype=torch.bfloat16 if cfg.load_in_4bit else dtype,
                           load_in_4bit=cfg.load_in_4bit, device=torch_device)
    check_vocab_fits(base, tokenizer, cfg.model_dir)
    return tokenizer, base


def _data(cfg: SFTConfig, tokenizer) -> tuple[TokenRows, TokenRows | None]:
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
    if cfg.batch_size > len(train_rows):
        raise InvalidParameter("batch_size", cfg.batch_size,
                               f"must be at most the {len(train_rows)} training examples")
    return train_rows, eval_rows


def _lr_lambda(cfg: SFTConfig) -> Callable[[int], float]:
    """Linear warmup, then constant or cosine to zero (a function of the step: resumable)."""
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


class LossReader:
    """Reads a step's loss one step late, so the host never idles the GPU to learn it.

    On a GPU the loss is copied into pinned host memory behind the step that produced it and
    an event marks the copy; :meth:`read` waits for that event only, while the next step's
    kernels are already queued. Reading ``loss.item()`` instead would wait for everything
    queued, next step included. On the CPU there is nothing to overlap.
    """

    def __init__(self, device: torch.device) -> None:
        # On the CPU a step is done when its call returns: nothing to read late.
        self.lagged = device.type == "cuda"
        self.host = torch.zeros((), dtype=torch.float32, pin_memory=self.lagged)
        self.event = torch.cuda.Event() if self.lagged else None
        self.value: torch.Tensor | None = None

    def queue(self, loss: torch.Tensor) -> None:
        if self.lagged:
            self.host.copy_(loss.detach(), non_blocking=True)
            self.event.record()
        else:
            self.value = loss.detach()

    def read(self) -> float:
        if self.lagged:
            self.event.synchronize()
            return float(self.host)
        return float(self.value)


def evaluate(model, rows: TokenRows, batch_size: int, device: torch.device, autocast) -> float:
    """Mean token loss over every labelled eval token."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), autocast:
        for start in range(0, len(rows), batch_size):
            batch = to_device(rows.collate(range(start, min(start + batch_size, len(rows)))),
                              device)
            total += float(causal_lm_loss(model, batch)) * batch.count
            count += batch.count
    model.train(was_training)
    return total / count if count else float("nan")


def _keep_metrics_until(path: Path, step: int) -> None:
    """Drop metric lines after ``step`` (a killed run wrote some past its last checkpoint)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if step == 0 or not path.exists():
        path.write_text("")
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in kept))


def _reference_batch(cfg: SFTConfig, rows: TokenRows) -> torch.Tensor:
    """The fixed batch whose logits validate compares: the seed's batch, or a small slice."""
    if cfg.synthetic:
        return rows.collate(range(cfg.batch_size))["input_ids"]
    n = min(REFERENCE_ROWS, len(rows))
    width = min(REFERENCE_TOKENS, min(len(rows.input_ids[i]) for i in range(n)))
    return torch.tensor([rows.input_ids[i][:width] for i in range(n)])


def export_merged(cfg: SFTConfig, output_dir: Path, tokenizer, log) -> Path:
    """The base with the adapter merged in, saved (with the tokenizer) as a plain HF model.

    The base is reloaded unquantised on the CPU (a 4-bit base cannot take merged weights).
    """
    from peft import PeftModel

    if cfg.synthetic:
        base = build_base(cfg.shape, cfg.seed)
    else:
        dtype = torch.bfloat16 if (cfg.bf16_weights or cfg.load_in_4bit) else torch.float32
        base = load_pretrained(cfg.model_dir, dtype=dtype)
    merged = PeftModel.from_pretrained(base, output_dir / ADAPTER_DIR).merge_and_unload()
    final = output_dir / MERGED_DIR
    tmp = output_dir / f"{checkpoint.TMP_PREFIX}{MERGED_DIR}"
    merged.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    checkpoint.replace_dir(tmp, final)
    log(loglines.merged(final))
    return final


def reference_logits(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """fp32 logits on a fixed batch: what a reloaded adapter must reproduce."""
    model.eval()
    with torch.no_grad():
        return model(input_ids=batch).logits.float().cpu()


def _save(
    model: torch.nn.Module,
    cfg: SFTConfig,
    batch: torch.Tensor,
    output_dir: Path,
    torch_device: torch.device,
) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = output_dir / f"{checkpoint.TMP_PREFIX}{ADAPTER_DIR}"
    model.save_pretrained(tmp)
    checkpoint.replace_dir(tmp, output_dir / ADAPTER_DIR)
    logits = reference_logits(model, batch.to(torch_device))
    torch.save({"input_ids": batch.cpu(), "logits": logits}, output_dir / REFERENCE_FILE)
