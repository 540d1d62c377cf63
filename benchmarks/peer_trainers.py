"""Our loop against the trainers users pick for speed, on the shapes they fine-tune in a slice.

    python benchmarks/peer_trainers.py --shape qwen2.5-1.5b --seq 2048 \
        [--peers ours,hf,hf-liger,trl,unsloth] [--caps none,2g.12gb,1g.6gb] [--sms N]
        [--batch B] [--rounds N] [--smoke] [--peak-tflops X] [--json-out FILE]

Shapes (random init from the published configs, nothing downloaded): ``qwen2.5-0.5b``,
``qwen2.5-1.5b`` (Qwen2, bf16 weights) and ``llama-7b`` (Llama-2-7B, 4-bit NF4 QLoRA). LoRA
r=16, alpha=16 on every linear projection (q, k, v, o, gate, up, down), learning rate 2e-4
constant, AdamW fused, no gradient clipping, bf16 autocast. Data: the same packed rows for all
(prompt/completion JSONL, ~98% of tokens labelled, packed to ``--seq`` by draslice's own
``pack``; the peers get the very token ids and labels our loader produced).

Peers, each in a fresh process per (peer, cap group):

- ``ours``: ``draslice.trainer.sft.train`` with its defaults (``compile="auto"``), under a cap
  with gradient checkpointing and the cap given as ``slice_memory_gib`` (as a user runs it);
- ``ours-eager``: ``ours`` with ``compile="off"`` (what the default's CUDA graph is worth, in
  one run);
- ``ours-offload``: the same with ``offload_activations`` under a cap (the checkpointed layer
  inputs in host memory, as Unsloth's offloaded checkpointing does); uncapped it is ``ours``;
- ``ours-tiled``: ``ours-offload`` with ``tile_mlp`` too (each layer's MLP on tiles of the
  tokens); uncapped it is ``ours``;
- ``ours-offload-peft``: ``ours-offload`` with peft's own LoRA forward instead of
  ``trainer/speed/lora_fused.py``'s one-matmul sum (what that change is worth, in one run);
- ``ours-offload-single``: ``ours-offload`` with every LoRA projection computed alone
  (``lora_fused``'s ``group=False``: what computing q/k/v and gate/up in one call is worth);
- ``ours-offload-epilogue``: ``ours-offload`` with the LoRA update always added in the
  matmul's epilogue, never stacked into the base matmul's inner dimension (what the stacking,
  ``lora_fused.STACK_MIN_ELEMENTS``, is worth);
- ``ours-offload-reentrant`` / ``ours-offload-hooks``: ``ours-offload`` under torch's
  reentrant checkpoint, or its non-reentrant one (saved-tensor hooks), whatever the model
  (``grad_checkpointing.REENTRANT``; the loop's own choice, ``grad_checkpointing.choose``, takes
  the reentrant kind up to hidden size 1,024);
- ``ours-offload-chunks``: ``ours-offload`` with the loss through the head in
  ``trainer/speed/loss.py``'s compiled chunks instead of Liger's fused linear cross-entropy;
- ``ours-offload-compile``: ``ours-offload`` with ``compile="default"`` (inductor compiles each
  layer inside its offloaded checkpoint, ``speed.compile_layers``; its compile time is in
  ``run_s``, not in tokens/s); uncapped it is ``ours`` compiled so;
- ``ours-tiled-compile``: ``ours-tiled`` compiled the same way (do the tiles bring the
  compiled layers' peak back under the eager one's, at what cost in tokens/s);
- ``hf``: HF ``Trainer`` + peft (the seed's approach);
- ``hf-liger``: the same with ``use_liger_kernel=True`` (what LlamaFactory's
  ``enable_liger_kernel`` does: Liger's RoPE, RMSNorm, SwiGLU and fused linear cross-entropy);
- ``trl``: TRL ``SFTTrainer`` + peft;
- ``unsloth``: Unsloth's ``FastLanguageModel`` + its ``SFTTrainer`` patches.

Caps: ``none`` (no cap, no gradient checkpointing, batch ``--batch``), and the emulated slices
(per-process CUDA memory cap, ``trainer/device.py``) with each tool's memory levers on
(gradient checkpointing; Unsloth's own offloaded checkpointing): there the largest batch that
fits is searched downward, each batch in a fresh process (an attempt that ran out of memory
leaves a capped allocator fragmented: in one process, a batch that fitted as the first try
failed after two larger ones), and its tokens/s and peak are reported. ``--sms N`` runs everything
inside a CUDA green context of N SMs (compute emulation; the GPU's settings are not touched).

Timing as in ``compare_trainers.py``: warm-up steps excluded, clock from the end of the
warm-up step to the end of the last (the peers: a synchronize in a step-end callback; our loop:
its own CUDA-event step times), tokens/s = timed steps x batch x seq / interval. For the
peers, the tokens their models' embeddings were given inside the interval are counted too
(``tokens_seen``): a trainer that changed the batch or skipped rows would show there. MFU on
the LoRA FLOPs (``flops.py``) over the matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

# Unsloth patches transformers, peft and trl as it is imported, and when they were imported
# first it warns that it "may run slower" without its optimizations. compare_trainers (below)
# imports transformers, so Unsloth's child process imports it before anything else.
if sys.argv[1:3] == ["--child-peer", "unsloth"]:
    import unsloth  # noqa: F401

from draslice.benchmarks.childproc import kill_children_on_term, run_child, write_json  # noqa: E402
from draslice.benchmarks.compare_trainers import loop_seconds  # noqa: E402
from draslice.benchmarks.flops import FlopCount, mfu  # noqa: E402
from draslice.trainer import loglines  # noqa: E402


@dataclass(frozen=True)
class Ours:
    """One way of running our loop: the levers it turns on (under a cap only; uncapped there
    is no checkpointing to offload or tile under)."""

    title: str
    offload: bool = False
    tile: bool = False
    compile: str = "auto"
    peft_forward: bool = False  # peft's own LoRA forward, not trainer/speed/lora_fused.py's
    lora_groups: bool = True  # lora_fused's q/k/v and gate/up in one call each
    lora_stacked: bool = True  # lora_fused's stacked inner dimension where a call is large
    reentrant: bool | None = None  # grad_checkpointing.REENTRANT (None: the loop chooses)
    chunked_loss: bool = False  # loss.py's compiled chunks, not Liger's fused linear CE
    liger_chunk_mem: int | None = None  # loss.LIGER_CHUNK_MEM (None: loss.liger_chunk_mem)


OURS = {
    "ours": Ours("draslice SFT loop (default)"),
    "ours-eager": Ours("draslice SFT loop, eager (compile=off)", compile="off"),
    "ours-offload": Ours("draslice SFT loop + offload_activations", offload=True),
    "ours-tiled": Ours("draslice SFT loop + offload_activations + tile_mlp", offload=True,
                       tile=True),
    "ours-offload-peft": Ours("draslice SFT loop + offload_activations, peft's LoRA forward",
                              offload=True, peft_forward=True),
    "ours-offload-single": Ours("draslice SFT loop + offload_activations, no LoRA groups",
                                offload=True, lora_groups=False),
    "ours-offload-epilogue": Ours("draslice SFT loop + offload_activations, the LoRA update "
                                  "in the matmul's epilogue only (never stacked)", offload=True,
                                  lora_stacked=False),
    "ours-offload-reentrant": Ours("draslice SFT loop + offload_activations, reentrant "
                                   "checkpoint", offload=True, reentrant=True),
    "ours-offload-hooks": Ours("draslice SFT loop + offload_activations, non-reentrant "
                               "checkpoint", offload=True, reentrant=False),
    "ours-offload-chunks": Ours("draslice SFT loop + offload_activations, loss.py's chunks",
                                offload=True, chunked_loss=True),
    "ours-offload-liger1": Ours("draslice SFT loop + offload_activations, Liger's loss in its "
                                "default chunks", offload=True, liger_chunk_mem=1),
    "ours-offload-compile": Ours("draslice SFT loop + offload_activations, compile=default",
                                 offload=True, compile="default"),
    "ours-tiled-compile": Ours(
        "draslice SFT loop + offload_activations + tile_mlp, compile=default", offload=True,
        tile=True, compile="default"),
}
PEERS = {
    **{name: ours.title for name, ours in OURS.items()},
    "hf": "HF Trainer + peft",
    "hf-liger": "HF Trainer + peft + Liger",
    "trl": "TRL SFTTrainer + peft",
    "unsloth": "Unsloth",
}
OTHERS = tuple(name for name in PEERS if name not in OURS)
"""The other trainers (``train_peer`` runs them)."""

CAPS = {"none": 0.0, "2g.12gb": 11.5, "1g.6gb": 5.75}
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_R = LORA_ALPHA = 16
LEARNING_RATE = 2e-4


@dataclass(frozen=True)
class Shape:
    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool
    quantized: bool = False

    def flops(self, seq: int) -> FlopCount:
        """Per-token FLOPs, counted from the shape (the same formula as ``flops.flop_count``)."""
        head_dim = self.hidden // self.heads
        q, kv = self.heads * head_dim, self.kv_heads * head_dim
        d = self.hidden
        dims = {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
                "gate_proj": (d, self.ffn), "up_proj": (d, self.ffn),
                "down_proj": (self.ffn, d)}
        per_layer = sum(i * o for i, o in dims.values())
        lora = sum(LORA_R * (i + o) for i, o in dims.values())
        return FlopCount(self.layers * per_layer + self.vocab * d, self.layers * lora,
                         self.layers, d, seq)


SHAPES = {
    "qwen2.5-0.5b": Shape("qwen2", 896, 24, 14, 2, 4864, 151936, tied=True),
    "qwen2.5-1.5b": Shape("qwen2", 1536, 28, 12, 2, 8960, 151936, tied=True),
    "llama-7b": Shape("llama", 4096, 32, 32, 32, 11008, 32000, tied=False, quantized=True),
    # The 8B users tune most: grouped KV heads, a 14,336-wide MLP and a 128,256-token vocabulary
    # (the loss through the head weighs 4x the Llama-2 shape's).
    "llama-3.1-8b": Shape("llama", 4096, 32, 32, 8, 14336, 128256, tied=False, quantized=True),
    "smoke": Shape("qwen2", 64, 2, 4, 2, 128, 512, tied=True),
}
# Batch searched downward under a cap (rows of --seq tokens), largest first.
FIT_BATCHES = (64, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1)
# Every model is written with this many positions (or --seq's, if more), so one model
# directory serves the long-sequence search (``--seqs``) as well.
MAX_POSITIONS = 32768


# ----------------------------------------------------------------------------------------
# Inputs shared by every peer: the model directory and the packed rows.


def prepare(shape_name: str, seq: int, root: Path, smoke: bool) -> dict:
    """Write the random-init model (with its tokenizer) and the JSONL data once."""
    import torch

    from draslice.tests.scratch import save_scratch_model

    shape = SHAPES[shape_name]
    model_dir = root / f"{shape_name}-p{max(MAX_POSITIONS, seq)}"
    if not model_dir.exists():  # built aside and renamed: a killed run leaves no half model
        partial = root / f".{model_dir.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        save_scratch_model(
            partial, shape.arch, hidden_size=shape.hidden, num_layers=shape.layers,
            num_heads=shape.heads, num_kv_heads=shape.kv_heads, intermediate_size=shape.ffn,
            vocab_size=shape.vocab, max_positions=max(MAX_POSITIONS, seq),
            tie_word_embeddings=shape.tied,
            device="cuda" if torch.cuda.is_available() and not smoke else "cpu",
        )
        partial.rename(model_dir)
    data = root / f"data-{seq}.jsonl"
    if not data.exists():  # written whole, then renamed, for the same reason
        rng = random.Random(0)
        words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "slice",
                 "model", "adapter", "train"]
        # about 256 rows of seq tokens; past 2,048 tokens 32 rows (each child tokenizes the
        # whole file, and a long-sequence attempt trains a handful of batch-1 steps)
        rows = (64 if smoke else 256 if seq <= 2048 else 32) * seq // 200 + 8
        data.with_suffix(".partial").write_text("".join(
            json.dumps({"prompt": "text:", "completion": " " + " ".join(
                rng.choice(words) for _ in range(200))}) + "\n" for _ in range(rows)))
        data.with_suffix(".partial").rename(data)
    return {"model_dir": str(model_dir), "data": str(data)}


def packed_rows(model_dir: str, data: str, seq: int) -> tuple[list[list[int]], list[list[int]]]:
    """Our loader's packed rows (ids, labels), full-width rows only: what every peer trains."""
    from draslice.trainer.data.examples import load_examples, pack
    from draslice.trainer.model import load_tokenizer

    _fmt, rows = load_examples(data, load_tokenizer(model_dir), "prompt-completion", seq)
    rows = pack(rows, seq)
    keep = [i for i, ids in enumerate(rows.input_ids) if len(ids) == seq]
    return [rows.input_ids[i] for i in keep], [rows.labels[i] for i in keep]


# ----------------------------------------------------------------------------------------
# One attempt of one peer: train warmup + timed steps at one batch size, in this process.


class Clock:
    """The timed interval, from the end of the warm-up step to the end of the last: stamped
    with a synchronize by a peer's step-end callback, or given whole (our loop's step times)."""

    def __init__(self, warmup: int, last: int) -> None:
        self.warmup, self.last = warmup, last
        self.marks: dict[int, float] = {}
        self.given: float | None = None
        self.notes: list[str] = []
        """What the run said about how it ran (our loop's speed plan, a failed capture)."""
        self.seen = 0
        """Tokens given to the model's embedding in training forwards so far (peers only)."""
        self.seen_at: dict[int, int] = {}
        self.on_step: Callable[[], None] | None = None
        """Called at each step's end by a peer's callback (profile_step.py steps its profiler)."""
        self.first_step_at: float | None = None
        """``time.time()`` when the first optimizer step had ended (a user's first loss line)."""

    def count_embedded_tokens(self) -> None:
        """Count the tokens of every training forward from here on (``tokens_seen``)."""
        import torch

        clock, forward = self, torch.nn.Embedding.forward

        def counted(module: torch.nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
            if torch.is_grad_enabled() and module.training:
                clock.seen += ids.numel()
            return forward(module, ids)

        torch.nn.Embedding.forward = counted

    def tokens_seen(self) -> int | None:
        """Tokens embedded between the two stamps; None where nothing was counted."""
        if set(self.seen_at) != {self.warmup, self.last} or not self.seen:
            return None
        return self.seen_at[self.last] - self.seen_at[self.warmup]

    def seconds(self) -> float | None:
        """The interval; None when the stamps did not see both steps."""
        if self.given is not None:
            return self.given
        if set(self.marks) != {self.warmup, self.last}:
            return None
        return self.marks[self.last] - self.marks[self.warmup]

    def stamp(self, step: int) -> None:
        first = step == 1 and self.first_step_at is None
        if not first and step not in (self.warmup, self.last):
            return
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if first:
            self.first_step_at = time.time()
        if step in (self.warmup, self.last):
            self.marks[step] = time.perf_counter()
            self.seen_at[step] = self.seen

    def callback(self):
        from transformers import TrainerCallback

        clock = self

        class StepClock(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):  # noqa: ARG002
                clock.stamp(state.global_step)
                if clock.on_step is not None:
                    clock.on_step()
                return control

        return StepClock()


# How our loop's step lines begin (``loglines.step_loss``'s own text up to the loss; the first
# step always logs, so the first such line is step 1's).
FIRST_STEP_LINE = loglines.step_loss(1, 0.0, 0).partition(" ")[0] + " "


def ours_config(ctx: dict, batch: int, steps: int, *, checkpointing: bool = False,
                offload: bool = False, tile: bool = False, compile: str = "auto",  # noqa: A002
                **knobs):
    """The ``SFTConfig`` our loop trains at a prepared shape (``ctx``: :func:`prepare`'s
    paths plus ``shape``, ``seq`` and ``smoke``) with the peers' LoRA and learning rate, and
    the speed levers asked for; ``knobs``: any other field (seed, schedule, log cadence).
    One builder, so that the loss comparison trains what the speed table times."""
    from draslice.trainer.sft import SFTConfig

    shape = ctx["shape"]
    return SFTConfig(
        model_dir=ctx["model_dir"], data=ctx["data"], data_format="prompt-completion",
        max_length=ctx["seq"], pack=True, batch_size=batch, steps=steps,
        lora_r=LORA_R, lora_alpha=LORA_ALPHA, lora_targets=",".join(TARGETS),
        learning_rate=LEARNING_RATE, bf16_weights=not shape.quantized,
        load_in_4bit=shape.quantized, gradient_checkpointing=checkpointing,
        offload_activations=offload and checkpointing, tile_mlp=tile and checkpointing,
        compile=compile, device="cpu" if ctx["smoke"] else "cuda", **knobs)


def train_ours(ctx: dict, batch: int, checkpointing: bool, clock: Clock,
                offload: bool = False, tile: bool = False, compile: str = "auto",  # noqa: A002
                on_line: Callable[[str], None] | None = None) -> None:
    """``on_line``: every line the loop logs (profile_step.py steps its profiler on them)."""
    from draslice.trainer.sft import train

    def log(line: str) -> None:
        if on_line is not None:
            on_line(line)
        if clock.first_step_at is None and line.startswith(FIRST_STEP_LINE):
            clock.first_step_at = time.time()  # the loop logs step 1 as soon as it has its loss
        if line.startswith(("speed:", "[slice] activations", "[slice] offload", "[slice] MLP",
                            "[slice] gradient checkpointing")):
            print(line, flush=True)
            clock.notes.append(line)

    cfg = ours_config(
        ctx, batch, clock.last, checkpointing=checkpointing, offload=offload, tile=tile,
        compile=compile, log_every=1,
        # The loop sets the process's memory fraction itself (0: the whole device), so the
        # cap is given to it; otherwise it would lift the cap the child set.
        slice_memory_gib=ctx["cap"] if not ctx["smoke"] else 0.0,
    )
    with tempfile.TemporaryDirectory(prefix="peer-ours-") as tmp:
        train(cfg, tmp, f"{tmp}/metrics.jsonl", log=log)
        # The loop's own step times (compare_trainers.loop_seconds says why not its log times).
        clock.given = loop_seconds(Path(tmp) / "metrics.jsonl", clock.warmup, clock.last)


def _dataset(ctx: dict, batch: int, steps: int):
    """Enough of the packed rows (cycled) for ``steps`` batches."""
    ids, labels = ctx["rows"]
    need = batch * steps
    order = [i % len(ids) for i in range(need)]
    return [{"input_ids": ids[i], "labels": labels[i]} for i in order]


def _trainer_args(ctx: dict, batch: int, steps: int, checkpointing: bool, tmp: str, **extra):
    cuda = not ctx["smoke"]
    return dict(
        output_dir=tmp, max_steps=steps, per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, learning_rate=LEARNING_RATE, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0, bf16=cuda,
        optim="adamw_torch_fused" if cuda else "adamw_torch",
        gradient_checkpointing=checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if checkpointing else None,
        logging_strategy="no", save_strategy="no", eval_strategy="no", report_to=[],
        disable_tqdm=True, dataloader_num_workers=0, seed=0, use_cpu=not cuda,
        remove_unused_columns=False, **extra,
    )


def _peft_model(ctx: dict):
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    from draslice.trainer.model import qlora_config

    shape = ctx["shape"]
    kwargs: dict = {"dtype": torch.bfloat16, "local_files_only": True}
    if shape.quantized:
        kwargs.update(quantization_config=qlora_config(), device_map={"": 0})
    model = AutoModelForCausalLM.from_pretrained(ctx["model_dir"], **kwargs)
    model.config.use_cache = False
    if shape.quantized:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return get_peft_model(model, LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                            target_modules=list(TARGETS), task_type="CAUSAL_LM"))


def _train_hf(ctx: dict, batch: int, checkpointing: bool, clock: Clock, liger: bool) -> None:
    from transformers import Trainer, TrainingArguments

    model = _peft_model(ctx)
    if not ctx["smoke"]:
        model.to("cuda")
    with tempfile.TemporaryDirectory(prefix="peer-hf-") as tmp:
        args = TrainingArguments(**_trainer_args(ctx, batch, clock.last, checkpointing, tmp,
                                                 use_liger_kernel=liger))
        trainer = Trainer(model=model, args=args, callbacks=[clock.callback()],
                          train_dataset=_dataset(ctx, batch, clock.last))
        trainer.train()


def _train_trl(ctx: dict, batch: int, checkpointing: bool, clock: Clock) -> None:
    from datasets import Dataset
    from trl import SFTConfig as TrlConfig
    from trl import SFTTrainer

    from draslice.trainer.model import load_tokenizer

    model = _peft_model(ctx)
    with tempfile.TemporaryDirectory(prefix="peer-trl-") as tmp:
        args = TrlConfig(**_trainer_args(ctx, batch, clock.last, checkpointing, tmp),
                         max_length=ctx["seq"], packing=False, padding_free=False)
        trainer = SFTTrainer(model=model, args=args, callbacks=[clock.callback()],
                             processing_class=load_tokenizer(ctx["model_dir"]),
                             train_dataset=Dataset.from_list(_dataset(ctx, batch, clock.last)))
        trainer.train()


def _train_unsloth(ctx: dict, batch: int, checkpointing: bool, clock: Clock) -> None:
    import torch
    from datasets import Dataset
    from trl import SFTConfig as TrlConfig
    from trl import SFTTrainer
    from unsloth import FastLanguageModel  # imported first in this process (top of file)

    shape = ctx["shape"]
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=ctx["model_dir"], max_seq_length=ctx["seq"], dtype=torch.bfloat16,
        load_in_4bit=shape.quantized, local_files_only=True)
    model = FastLanguageModel.get_peft_model(
        model, r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=list(TARGETS),
        bias="none", use_gradient_checkpointing="unsloth" if checkpointing else False)
    with tempfile.TemporaryDirectory(prefix="peer-unsloth-") as tmp:
        args = TrlConfig(**_trainer_args(ctx, batch, clock.last, False, tmp),
                         max_length=ctx["seq"], packing=False, padding_free=False)
        trainer = SFTTrainer(model=model, args=args, callbacks=[clock.callback()],
                             processing_class=tokenizer,
                             train_dataset=Dataset.from_list(_dataset(ctx, batch, clock.last)))
        trainer.train()


def train_peer(peer: str, ctx: dict, batch: int, checkpointing: bool, clock: Clock) -> None:
    """Train one of the other trainers (not ours) ``clock.last`` steps at ``batch``."""
    if peer in ("hf", "hf-liger"):
        _train_hf(ctx, batch, checkpointing, clock, liger=peer == "hf-liger")
    elif peer == "trl":
        _train_trl(ctx, batch, checkpointing, clock)
    elif peer == "unsloth":
        _train_unsloth(ctx, batch, checkpointing, clock)
    else:
        raise ValueError(f"unknown peer {peer!r}; others than ours: {', '.join(OTHERS)}")


def attempt(peer: str, ctx: dict, batch: int, checkpointing: bool, warmup: int, steps: int
            ) -> dict:
    """Train ``warmup + steps`` steps at ``batch``; tokens/s and peak, or ``oom``."""
    import torch

    clock = Clock(warmup, warmup + steps)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()
    if peer not in OURS:
        clock.count_embedded_tokens()  # ours: the loop's own step times and batch
    start = time.perf_counter()
    try:
        if peer in OURS:
            ours = OURS[peer]
            use_switches(ours)
            train_ours(ctx, batch, checkpointing, clock, offload=ours.offload,
                       tile=ours.tile, compile=ours.compile)
        else:
            train_peer(peer, ctx, batch, checkpointing, clock)
    except Exception as err:  # noqa: BLE001 -- an OOM is a result here, anything else too
        oom = isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()
        what = f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
        return {"batch": batch, "seq": ctx["seq"], "oom": oom, "error": what,
                **({"asked_gib": asked} if (asked := asked_gib(err)) else {})}
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    run_s = time.perf_counter() - start
    seconds = clock.seconds()
    if seconds is None:
        return {"batch": batch, "oom": False, "error": f"clock saw steps {sorted(clock.marks)}"}
    tokens = steps * batch * ctx["seq"]
    peak = torch.cuda.max_memory_reserved() / 1024**3 if torch.cuda.is_available() else None
    # Each retry is a cudaFree of the cache and a synchronize: many mean the cap, not the
    # compute, set the pace.
    retries = (torch.cuda.memory_stats().get("num_alloc_retries")
               if torch.cuda.is_available() else None)
    seen = clock.tokens_seen()
    # From the process's start (imports included), as a user waits for them: the first loss
    # line and the whole run. t0 is the parent's clock when it started this process.
    t0 = ctx.get("t0")
    since = {} if t0 is None else {
        "process_s": time.time() - t0,
        **({"first_step_s": clock.first_step_at - t0} if clock.first_step_at else {})}
    return {"batch": batch, "oom": False, "tokens_per_step": batch * ctx["seq"],
            "tokens_per_s": tokens / seconds, "peak_reserved_gib": peak, "run_s": run_s,
            **since,
            "alloc_retries": retries, **({"notes": clock.notes} if clock.notes else {}),
            **({"tokens_seen": seen} if seen else {})}


def asked_gib(err: BaseException) -> float | None:
    """The size of the allocation that failed (torch's "Tried to allocate X GiB"), found in
    ``err`` or what it was raised from (our loop explains an OOM in its own words)."""
    import re

    while err is not None:
        found = re.search(r"Tried to allocate ([0-9.]+) (GiB|MiB)", str(err))
        if found:
            return float(found[1]) / (1024 if found[2] == "MiB" else 1)
        err = err.__cause__ or err.__context__
    return None


def use_switches(ours: Ours) -> None:
    """Set, in this (child) process, the switches of the loop's code that ``ours`` turns."""
    from draslice.trainer import speed
    from draslice.trainer.speed import grad_checkpointing, lora_fused, loss

    if ours.peft_forward:
        lora_fused.fused = _peft_forward
    elif not ours.lora_groups:
        lora_fused.fused = partial(lora_fused.fused, group=False)
    if not ours.lora_stacked:
        lora_fused.STACK_MIN_ELEMENTS = 1 << 62
    grad_checkpointing.REENTRANT = ours.reentrant
    loss.LIGER_CHUNK_MEM = ours.liger_chunk_mem
    if ours.chunked_loss:  # apply_liger marks the head under a name loss.py ignores
        speed.LIGER_HEAD = "_benchmark_unmarked"


@contextmanager
def _peft_forward(model, group: bool = True) -> Iterator[int]:  # noqa: ARG001 -- fused's signature
    """``lora_fused.fused`` installing nothing: every LoRA layer keeps peft's forward."""
    yield 0


def set_up_process(ctx: dict) -> None:
    """This process's part of an attempt beside ``prepare``'s files: the packed rows the other
    trainers read (``ctx["rows"]``), and the slice's memory cap (``ctx["cap"]``, 0: none) on
    its GPU before anything is allocated (our loop is given the cap as well, see train_ours)."""
    import torch

    from draslice.trainer import device as dev

    if ctx.get("peer") not in OURS:  # our loop reads the data itself (its first step waits)
        ctx["rows"] = packed_rows(ctx["model_dir"], ctx["data"], ctx["seq"])
    if torch.cuda.is_available() and not ctx["smoke"]:
        dev.apply_slice_cap(torch.device("cuda", 0), ctx["cap"])


def child_main(args: argparse.Namespace) -> None:
    """One attempt of one peer, in this fresh process: ``--batch`` rows under the one cap of
    ``--caps`` (with the peer's memory levers when capped)."""
    import torch  # Unsloth's child imported unsloth first, at the top of this file

    if args.sms and torch.cuda.is_available():
        from draslice.benchmarks.sm_cap import enter_green_context

        enter_green_context(args.sms, args.sm_way)
    shape = SHAPES[args.shape]
    ctx = {"shape": shape, "seq": args.seq, "smoke": args.smoke, "t0": args.t0, "peer": args.peer,
           **json.loads(args.inputs)}
    cap_name = args.caps
    cap = ctx["cap"] = CAPS[cap_name]
    set_up_process(ctx)
    # Under a cap, with the peer's memory levers, and as many timed steps as uncapped: Unsloth's
    # first steps after warm-up are slow (at Qwen2.5-1.5B in 5.75 GiB, 5 timed steps gave
    # 22,512 tokens/s where 10 gave 43,371).
    result = attempt(args.peer, ctx, args.batch, cap != 0, args.warmup, args.steps)
    if cap:
        result["fits"] = "tokens_per_s" in result and (result["peak_reserved_gib"] or 0) <= cap
    result = {"cap_gib": cap or None, **result}
    print(f"{args.peer} {cap_name} batch {args.batch}: {json.dumps(result)}", flush=True)
    write_json(args.result, {"peer": args.peer, "runs": {cap_name: result}})


# ----------------------------------------------------------------------------------------
# The parent: prepare, peak, one child per peer and cap group, the table.


def trained(run: dict | None) -> bool:
    """Whether an attempt trained (and, under a cap, within it)."""
    return bool(run and run.get("tokens_per_s") and run.get("fits", True))


def speed_and_memory(run: dict, ref: dict) -> tuple[float, float | None]:
    """``run`` over ``ref`` (both trained): tokens/s, and peak memory (None where ``ref``
    measured none: on a CPU)."""
    mem = ((run.get("peak_reserved_gib") or 0) / ref["peak_reserved_gib"]
           if ref.get("peak_reserved_gib") else None)
    return run["tokens_per_s"] / ref["tokens_per_s"], mem


def ratio(run: dict | None, ref: dict | None) -> str:
    """``run`` over ``ref``: tokens/s, then peak memory ("1.25x at 0.91x memory"); empty
    where either did not train."""
    if not (trained(run) and trained(ref)):
        return ""
    speed, mem = speed_and_memory(run, ref)
    return f"{speed:.2f}x" + (f" at {mem:.2f}x memory" if mem is not None else "")


# The peers every row of ours is held against, in the table's columns.
REFERENCES = (("hf", "vs HF Trainer"), ("unsloth", "vs Unsloth"))


def _seconds(run: dict, key: str) -> str:
    return f"{run[key]:.1f} s" if run.get(key) is not None else ""


def table(summary: dict) -> list[str]:
    shape, seq = summary["shape"], summary["seq"]
    flops = SHAPES[shape].flops(seq)
    peak = summary.get("peak_tflops")
    # The whole process's wall time (start, imports, model load, compilation or capture, every
    # step) and its first loss line keep one-off costs in view next to the steady tokens/s:
    # `--warmup 1 --steps 199` is a 200-step run.
    total = summary.get("warmup", 0) + summary.get("steps", 0)
    refs = [(name, title) for name, title in REFERENCES if name in summary["peers"]]
    lines = [f"## {shape}, seq {seq}" + (f", {summary['sms']} SMs" if summary.get("sms") else ""),
             "", "| peer | cap | batch x seq | tokens/s | peak reserved GiB | MFU (LoRA) | "
             + "".join(f"{title} | " for _, title in refs)
             + f"first step | whole process, {total} steps |",
             "|---|---|---|---|---|---|" + "---|" * len(refs) + "---|---|"]
    blank = " |" * (len(refs) + 4)
    for cap in summary["caps"]:
        for peer, res in summary["peers"].items():
            run = (res.get("runs") or {}).get(cap)
            if not run:
                lines.append(f"| {PEERS[peer]} | {cap} | | {res.get('error', 'not run')} |"
                             + blank)
                continue
            if "tokens_per_s" not in run or not run.get("fits", True):
                why = run.get("error", "did not fit")
                lines.append(f"| {PEERS[peer]} | {cap} | none fits | {why[:120]} |" + blank)
                continue
            m = mfu(flops.lora_per_token, run["tokens_per_s"], peak) if peak else None
            seen = run.get("tokens_seen")
            timed = summary.get("steps", 0) * run["batch"] * seq
            saw = (f" (its model saw {seen:,} tokens, not {timed:,})"
                   if seen and seen != timed else "")
            each = ("" if "rounds" not in run else " (median; each: " + " / ".join(
                f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "failed"
                for r in run["rounds"]) + ")")
            against = "".join(
                (ratio(run, (summary["peers"][name].get("runs") or {}).get(cap))
                 if peer != name else "") + " | " for name, _ in refs)
            lines.append(
                f"| {PEERS[peer]} | {cap} | {run['batch']} x {seq} "
                f"| {run['tokens_per_s']:,.0f}{each}{saw} "
                f"| {run['peak_reserved_gib'] or 0:.2f} | {f'{m:.1%}' if m else ''} | {against}"
                f"{_seconds(run, 'first_step_s')} | "
                f"{_seconds(run, 'process_s') or _seconds(run, 'run_s')} |")
    return lines + verdicts(summary)


BARS = {"unsloth": 1.2, "hf": 2.0}
"""Issue 39's bars: ahead of Unsloth by 1.2x and of HF Trainer by 2x, at no more memory."""


def verdicts(summary: dict) -> list[str]:
    """One line per (our row, cap) against Unsloth and HF Trainer: met, or by how much not."""
    out = []
    for cap in summary["caps"]:
        for peer in (p for p in summary["peers"] if p in OURS):
            run = (summary["peers"][peer].get("runs") or {}).get(cap)
            if not trained(run):
                continue
            for name, bar in BARS.items():
                ref = (summary["peers"].get(name, {}).get("runs") or {}).get(cap)
                if ref is None:
                    continue
                title = PEERS[name]
                if not trained(ref):
                    out.append(f"- {peer}, {cap}: {title} did not train here; ours did")
                    continue
                speed, mem = speed_and_memory(run, ref)
                over = mem is not None and mem > 1.0
                met = speed >= bar and not over
                why = [] if met else [
                    *([f"{speed:.2f}x, short of {bar}x by {1 - speed / bar:.0%}"]
                      if speed < bar else []),
                    *([f"{mem:.2f}x its memory"] if over else [])]
                first = ""
                if run.get("first_step_s") and ref.get("first_step_s"):
                    first = (f"; first step {run['first_step_s']:.1f} s / "
                             f"{ref['first_step_s']:.1f} s, whole process "
                             f"{run.get('process_s', 0):.1f} s / {ref.get('process_s', 0):.1f} s")
                out.append(f"- {peer}, {cap}: >= {bar}x {title} at <= its memory: "
                           + ("MET" if met else "NOT MET (" + ", ".join(why) + ")")
                           + f" ({speed:.2f}x"
                           + (f" at {mem:.2f}x memory" if mem is not None else "")
                           + f"{first})")
    return ["", *out] if out else []


def name_allocation(shape: Shape, seq: int, gib: float) -> str:
    """Which tensor of a batch-1 step of ``seq`` tokens a failed allocation of ``gib`` is
    the size of (within 15%): what limits the longest sequence. Empty when none is."""
    head_dim = shape.hidden // shape.heads
    gb = 1024**3
    sizes = {
        "the MLP's intermediate activation (seq x ffn, bf16)": seq * shape.ffn * 2,
        "the gate and up projections together (seq x 2 ffn, bf16)": seq * shape.ffn * 4,
        "logits through the head (seq x vocab, bf16)": seq * shape.vocab * 2,
        "logits through the head (seq x vocab, fp32)": seq * shape.vocab * 4,
        "attention scores (heads x seq x seq, bf16): attention is not memory-efficient":
            shape.heads * seq * seq * 2,
        "a layer's hidden states (seq x hidden, fp32)": seq * shape.hidden * 4,
        "the q/k/v projections (seq x (heads + 2 kv) x head_dim, bf16)":
            seq * (shape.heads + 2 * shape.kv_heads) * head_dim * 2,
    }
    best = min(sizes, key=lambda k: abs(sizes[k] / gb - gib))
    return best if abs(sizes[best] / gb - gib) <= 0.15 * gib else ""


def long_table(summary: dict) -> list[str]:
    """The long-sequence search: each peer's tokens/s and peak at every length it trained
    (batch 1), the longest, and ours over Unsloth where both trained."""
    shape = SHAPES[summary["shape"]]
    seqs, peers = summary["seqs"], summary["long"]
    lines = [f"## {summary['shape']}, batch 1, sequences {', '.join(f'{s:,}' for s in seqs)}",
             "", "| cap | seq | peer | tokens/s | peak reserved GiB | vs Unsloth | first step |",
             "|---|---|---|---|---|---|---|"]
    longest = []
    for cap in summary["caps"]:
        for peer, by_seq in peers.items():
            fitted = [s for s in seqs if (by_seq.get(cap) or {}).get(str(s), {}).get("fits")]
            failed = next((by_seq[cap][str(s)] for s in seqs
                           if str(s) in (by_seq.get(cap) or {})
                           and not by_seq[cap][str(s)].get("fits")), None)
            line = (f"- {peer}, {cap}: longest that trains {max(fitted):,}" if fitted
                    else f"- {peer}, {cap}: none trains")
            if failed is not None:
                line += f"; at {failed['seq']:,}: {failed.get('error', 'did not fit')[:160]}"
                what = name_allocation(shape, failed["seq"], failed.get("asked_gib") or 0)
                line += f" (that allocation is {what})" if what else ""
            longest.append(line)
        for seq in seqs:
            ref = (peers.get("unsloth", {}).get(cap) or {}).get(str(seq))
            for peer, by_seq in peers.items():
                run = (by_seq.get(cap) or {}).get(str(seq))
                if run is None:
                    continue
                if not run.get("fits"):
                    why = "out of memory" if run.get("oom") else run.get("error", "")[:80]
                    lines.append(f"| {cap} | {seq:,} | {PEERS[peer]} | {why} | | | |")
                    continue
                lines.append(f"| {cap} | {seq:,} | {PEERS[peer]} | {run['tokens_per_s']:,.0f} | "
                             f"{run['peak_reserved_gib'] or 0:.2f} | "
                             f"{ratio(run, ref) if peer != 'unsloth' else ''} | "
                             f"{_seconds(run, 'first_step_s')} |")
    return [*lines, "", *longest]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES),
                        default="qwen2.5-0.5b")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--caps", help=f"default: {','.join(CAPS)} (with --smoke: none; a cap "
                        "given there runs the fit search's code path, nothing is capped on a CPU)")
    parser.add_argument("--batch", type=int, default=0,
                        help="rows per step without a cap (default: 16,384 tokens a step)")
    parser.add_argument("--fit-max", type=int, default=32, help="largest batch tried under a cap")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10,
                        help="timed steps of each attempt, capped or not")
    parser.add_argument("--sms", type=int, default=0,
                        help="run inside a CUDA green context of N SMs (0: all)")
    parser.add_argument("--sm-way", default="init-set-stream", help="see sm_cap.WAYS")
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny Qwen2 shape")
    parser.add_argument("--peak-tflops", type=float)
    parser.add_argument("--model-root", default="/dev/shm/draslice-peers")
    parser.add_argument("--timeout-s", type=float, default=400,
                        help="per child process (one attempt)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every peer this many times (at the batch its first round "
                             "found), in the other order every other round; the table gives "
                             "the median tokens/s and each round's")
    parser.add_argument("--seqs", help="the long-sequence search instead: batch 1 at each of "
                        "these comma-separated lengths, shortest first, until one does not "
                        "train (e.g. 4096,8192,16384,32768); --seq is ignored")
    parser.add_argument("--long-tokens", type=int, default=131072,
                        help="with --seqs: timed tokens of each attempt at least (more steps "
                             "at the shorter lengths)")
    parser.add_argument("--json-out")
    # child mode
    parser.add_argument("--child-peer", dest="peer", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.shape, args.warmup, args.steps = "smoke", 1, 2
        args.caps = args.caps or "none"
        args.seq, args.batch = min(args.seq, 64), 4
        args.model_root = tempfile.mkdtemp(prefix="peers-smoke-")
    args.batch = args.batch or max(1, 16384 // args.seq)
    if args.peer:
        child_main(args)
        return

    kill_children_on_term()
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    caps = [c.strip() for c in (args.caps or ",".join(CAPS)).split(",") if c.strip()]
    bad = sorted(set(peers) - set(PEERS)) + sorted(set(caps) - set(CAPS))
    if bad:
        parser.error(f"unknown {bad}; peers: {', '.join(PEERS)}; caps: {', '.join(CAPS)}")
    try:
        seqs = sorted({int(x) for x in args.seqs.split(",") if x.strip()}) if args.seqs else []
    except ValueError:
        parser.error(f"--seqs {args.seqs!r}: valid is comma-separated token counts, "
                     "e.g. 4096,8192,16384")
    if args.seqs and (not seqs or seqs[0] < 1):
        parser.error(f"--seqs {args.seqs!r}: valid is comma-separated positive token counts")
    if args.smoke and seqs:
        seqs = [min(s, 64 * (i + 1)) for i, s in enumerate(seqs)]
    root = Path(args.model_root)
    root.mkdir(parents=True, exist_ok=True)
    inputs = {seq: prepare(args.shape, seq, root, args.smoke) for seq in seqs or [args.seq]}
    peak = args.peak_tflops
    if peak is None and not args.smoke:
        from draslice.benchmarks.compare_trainers import measure_peak_tflops

        peak = measure_peak_tflops("cuda")["tflops"]
        print(f"matmul peak: {peak:.4g} TFLOP/s", flush=True)
    summary = {"shape": args.shape, "seq": args.seq, "seqs": seqs, "caps": caps, "sms": args.sms,
               "warmup": args.warmup, "steps": args.steps,
               "peak_tflops": peak, "flops": SHAPES[args.shape].flops(args.seq).to_dict(),
               "peers": {}}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1", "UNSLOTH_DISABLE_STATISTICS": "1"}
    with tempfile.TemporaryDirectory(prefix="peers-") as work:

        def one(peer: str, cap: str, batch: int, again: int = 0, seq: int = 0,
                steps: int = 0) -> dict:
            """One attempt in a fresh process: its result, or what stopped the process."""
            seq, steps = seq or args.seq, steps or args.steps
            result = Path(work) / f"{peer}-{cap}-{batch}-{seq}-{again}.json"
            argv = [sys.executable, __file__, "--child-peer", peer, "--shape", args.shape,
                    "--seq", str(seq), "--caps", cap, "--batch", str(batch),
                    "--warmup", str(args.warmup), "--steps", str(steps),
                    "--sms", str(args.sms), "--sm-way", args.sm_way,
                    "--inputs", json.dumps(inputs[seq]), "--result", str(result),
                    "--t0", repr(time.time())]
            if args.smoke:
                argv.append("--smoke")
            outcome = run_child(argv, result, args.timeout_s, prefix=f"[{peer}] ", env=env)
            run = ((outcome.result or {}).get("runs") or {}).get(cap)
            if run is not None:
                return run
            tail = outcome.tail.strip().splitlines()
            return {"batch": batch, "seq": seq, "oom": False,
                    "error": "timed out" if outcome.timed_out else
                    f"exit {outcome.returncode}" + (f": {tail[-1][:300]}" if tail else "")}

        if seqs:
            summary["long"] = {}
            for peer in peers:
                summary["long"][peer] = {cap: {} for cap in caps}
                for cap in caps:
                    for seq in seqs:  # shortest first: the first that does not train ends it
                        run = one(peer, cap, 1, seq=seq, steps=long_steps(seq, args))
                        run["fits"] = "tokens_per_s" in run and run.get("fits", True)
                        run["seq"], run["steps"] = seq, long_steps(seq, args)
                        summary["long"][peer][cap][str(seq)] = run
                        if args.json_out:
                            write_json(args.json_out, summary)
                        if not run["fits"]:
                            break
            summary["table"] = long_table(summary)
            if args.json_out:
                write_json(args.json_out, summary)
            print("\n".join(summary["table"]), flush=True)
            return

        for peer in peers:
            runs: dict = {}
            for cap in caps:
                if cap == "none":
                    runs[cap] = one(peer, cap, args.batch)
                    continue
                tries = []
                for batch in [b for b in FIT_BATCHES if b <= args.fit_max]:
                    run = one(peer, cap, batch)
                    tries.append({k: run.get(k) for k in ("batch", "oom", "error")})
                    if run.get("fits") or (not run.get("oom") and "error" in run):
                        break
                runs[cap] = {**run, "fits": bool(run.get("fits")), "tries": tries}
            summary["peers"][peer] = {"runs": runs}
            if args.json_out:
                write_json(args.json_out, summary)
        for again in range(1, args.rounds):  # the peers in the other order every other round
            for peer in peers[::-1] if again % 2 else peers:
                for cap, run in summary["peers"][peer]["runs"].items():
                    if "tokens_per_s" in run and run.get("fits", True):
                        add_round(run, one(peer, cap, run["batch"], again))
            if args.json_out:
                write_json(args.json_out, summary)
    summary["table"] = table(summary)  # as printed, for gpu_all's results page
    if args.json_out:
        write_json(args.json_out, summary)
    print("\n".join(summary["table"]), flush=True)


def long_steps(seq: int, args: argparse.Namespace) -> int:
    """Timed steps of a long-sequence attempt: at least ``--steps``, and enough batch-1 steps
    for ``--long-tokens`` tokens (a few short steps are too few to time; at 4,096 tokens
    three timed steps gave 0.6x the rate of 8,192)."""
    return max(args.steps, -(-args.long_tokens // seq))


ROUND_KEYS = ("tokens_per_s", "peak_reserved_gib", "run_s", "error")


def add_round(run: dict, again: dict) -> None:
    """Fold another round of ``run`` (same peer, cap and batch) into it: ``rounds`` keeps each
    round's figures, the headline tokens/s becomes their median and the peak their largest."""
    rounds = run.setdefault("rounds", [{k: run.get(k) for k in ROUND_KEYS}])
    rounds.append({k: again.get(k) for k in ROUND_KEYS})
    speeds = [r["tokens_per_s"] for r in rounds if r.get("tokens_per_s")]
    run["tokens_per_s"] = statistics.median(speeds)
    run["peak_reserved_gib"] = max(r["peak_reserved_gib"] or 0 for r in rounds
                                   if r.get("tokens_per_s"))


if __name__ == "__main__":
    main()
