"""Speed must never change what is learned: our loop's loss curve, at every speed setting the
default can choose, against HF ``Trainer`` + peft's, from the same initial weights and batches.

    python benchmarks/loss_match.py [--shape qwen2.5-0.5b] [--seq 1024] [--batch 4]
        [--steps 200] [--settings default,eager,no-groups,chunked-loss,offload,tiled]
        [--tolerance X] [--smoke] [--timeout-s S] [--json-out FILE]

Each run trains ``--steps`` steps of LoRA (r=16, alpha=16 on q/k/v/o/gate/up/down, dropout 0,
learning rate 2e-4 constant, no warmup, weight decay 0, no gradient clipping, AdamW with
torch's betas and eps, fused on CUDA) on a bf16 base under bf16 autocast with fp32 LoRA
weights, on ``peer_trainers.py``'s random-init shapes and packed prompt/completion rows. Every
run is a fresh process (Liger and the speed levers patch classes for the whole process).

Ours (``draslice.trainer.sft.train``, the loop itself, nothing reimplemented):

- ``default``: ``compile="auto"``, whatever ``speed.choose`` picks (on a GPU at packed rows:
  the body as a CUDA graph, the LoRA groups of ``lora_fused``, Liger's kernels and its fused
  linear cross-entropy; the loop's ``speed:`` line is recorded). A graph that replays is kept
  even where the loop's timing finds it no faster (``cuda_graph.KEEP_SLOWER``): runs that
  share a GPU slow each other, and what is compared here is what the graph learns;
- ``eager``: ``compile="off"`` (no CUDA graph; Liger and the groups stay);
- ``no-groups``: the default with every LoRA projection computed alone (``lora_fused``'s
  ``group=False``);
- ``chunked-loss``: the default with ``loss.py``'s chunks instead of Liger's loss;
- ``offload``: gradient checkpointing + ``offload_activations``;
- ``tiled``: gradient checkpointing + ``offload_activations`` + ``tile_mlp``.

References: ``hf``, HF ``Trainer`` + peft with the same seed, and the control ``hf-other-seed``,
the same with seed + 1 for the LoRA init and the batch order: how far two legitimately
different runs drift apart. A tolerance that such a run would meet tells nothing, so the
script fails unless the tolerance is at least ``CONTROL_MARGIN`` times below the control's
largest drift.

How it stays fair:

- Same initial weights. The loop seeds ``torch.manual_seed(seed)`` and then builds the base and
  wraps LoRA inside ``build.assemble``. The HF process makes the same calls in the same order
  (seed, ``build.base_model``, ``build.data``, ``wrap_lora``; the loop's ``speed.choose`` and
  ``apply_liger`` in between draw nothing) and hands that peft model to ``Trainer``. Nobody
  takes this on trust: each of our processes wraps ``build.assemble`` to take a SHA-256 of the
  LoRA weights the loop is about to train, the HF process takes one of its own just before
  ``train()``, and the parent refuses to compare any curve whose start differs.
- Same data, same order. The rows are our loader's (``build.data``: load, pack, split), and
  step k's batch is the loop's k-th ``BatchSampler(len(rows), batch, seed + 1).next()``. HF's
  dataset lists those rows in that order, read by a sequential sampler (no shuffle), and its
  collator is our ``TokenRows.collate`` (the same padding; no attention mask for right
  padding, as the loop gives none). Checked too: each of our processes records the indices
  its sampler drew, the HF process the rows each of its steps trained on, and the parent
  refuses a mismatch.
- Same loss. Ours is the mean cross-entropy over the batch's labelled next-token positions.
  HF's (transformers 5.x) is the sum over the same positions divided by ``num_items_in_batch``,
  which ``Trainer`` counts over ``labels[..., 1:]``; the HF process checks each step's count
  against the batch's labelled positions. Its losses are read unrounded, from
  ``training_step``'s return (the logged ``loss`` is rounded to 4 digits and averaged over the
  logging interval).

The table gives each setting's largest and mean absolute difference from ``hf`` over the
steps, the largest relative one and the final losses; PASS when the largest absolute
difference is within the tolerance. Exit 0 when every setting passes; 1 when any fails, a run
failed, the inputs differ (refused) or the control cannot tell training runs apart.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from draslice.benchmarks.childproc import kill_children_on_term, run_child, write_json
from draslice.benchmarks.peer_trainers import (
    SHAPES,
    Ours,
    _trainer_args,
    ours_config,
    prepare,
    use_switches,
)

SEED = 0
SMOKE_TOLERANCE = 2e-3
"""``--smoke``'s tolerance (CPU, fp32 sums, the tiny shape, a few steps): the control drifts
far less there than a real shape on a GPU, so the GPU's tolerance would leave the control
check no room, and CPU runs of one loss agree far more closely than bf16 GPU runs."""
TOLERANCE = 2e-2
"""Largest absolute difference in any step's loss (nats) that still passes, on a GPU in bf16.

Why this size: bf16 keeps 8 significant bits, so each matmul output (the logits among them)
is rounded by up to 2^-8 (0.4%) of itself, and two correct implementations that order or fuse
their sums differently (Liger's norms and loss, the fused LoRA sums, a CUDA graph's kernels, a
recompute) round differently. At the same weights that moves a batch's mean loss by about
1e-4 to 1e-3 (thousands of tokens average the per-token rounding away); through 200 Adam steps
the weights drift apart by the same rounding, which is expected to grow the difference to
1e-3 to 1e-2. A run on other batches from another init (the control) must drift by at least
``CONTROL_MARGIN`` times this, or the script fails: its output gives both, the evidence for
tightening the tolerance."""
CONTROL_MARGIN = 5.0
"""The control's largest drift must be at least this many tolerances: else the check could
not tell a run that learned something else from ours."""


@dataclass(frozen=True)
class Setting:
    """One speed setting of our loop: the switches (``peer_trainers.Ours``), and whether it
    runs under gradient checkpointing (the memory levers need it)."""

    title: str
    ours: Ours
    checkpointing: bool = False
    cpu_skip: str = ""
    """Why the setting is not run on a CPU (empty: it runs there): the lever is CUDA-only,
    so on a CPU the run would repeat another setting's."""


SETTINGS = {
    "default": Setting(
        "compile=auto (what speed.choose picks)", Ours("default"),
        cpu_skip="on a CPU compile=auto is eager without Liger: the same run as eager"),
    "eager": Setting("compile=off", Ours("eager", compile="off")),
    "no-groups": Setting("compile=auto, each LoRA projection alone",
                         Ours("no-groups", lora_groups=False)),
    "chunked-loss": Setting(
        "compile=auto, loss.py's chunks, not Liger's loss", Ours("chunked-loss",
                                                                 chunked_loss=True),
        cpu_skip="Liger's loss is CUDA-only: on a CPU every run uses loss.py's chunks"),
    "offload": Setting(
        "gradient checkpointing + offload_activations", Ours("offload", offload=True),
        checkpointing=True,
        cpu_skip="offload_activations moves activations off a GPU; on a CPU it is a no-op "
                 "and the run is checkpointing alone (tiled runs that)"),
    "tiled": Setting("gradient checkpointing + offload_activations + tile_mlp",
                     Ours("tiled", offload=True, tile=True), checkpointing=True),
}
REFERENCES = {"hf": 0, "hf-other-seed": 1}
"""HF Trainer + peft runs, by the offset added to ``SEED`` (LoRA init and batch order)."""
CONTROL = "hf-other-seed"
REFUSED = "REFUSED"


# ----------------------------------------------------------------------------------------
# Pure parts: the batch order, the LoRA digest, the comparison (tests call these directly).


def loop_order(n_rows: int, batch: int, seed: int, steps: int) -> list[list[int]]:
    """The row indices of each of the loop's ``steps`` batches, drawn as ``build.assemble``
    builds its sampler: ``BatchSampler(n_rows, batch, seed + 1)``, one ``next()`` a step."""
    from draslice.trainer.data.sampler import BatchSampler

    sampler = BatchSampler(n_rows, batch, seed + 1)
    return [sampler.next().tolist() for _ in range(steps)]


def hf_dataset(order: list[list[int]]) -> list[dict[str, int]]:
    """HF's training set: step k's rows at positions k*B .. k*B+B-1, for a sequential sampler
    with batch size B to hand out the loop's batches in the loop's order."""
    return [{"row": int(i)} for rows in order for i in rows]


class RowCollator:
    """HF's collator: our loader's own ``TokenRows.collate`` of the rows a batch names (the
    same padding and labels), without an attention mask where the loop gives the model none
    (right padding, ``loss.needs_mask``), and with the row indices for the order check."""

    def __init__(self, rows) -> None:
        self.rows = rows

    def __call__(self, features: list[dict[str, int]]) -> dict:
        import torch

        from draslice.trainer.speed.loss import needs_mask

        indices = [f["row"] for f in features]
        batch = self.rows.collate(indices)
        mask = batch.pop("attention_mask")
        if needs_mask(mask):
            batch["attention_mask"] = mask
        batch["rows"] = torch.tensor(indices)
        return batch


def lora_digest(model) -> dict:
    """A fingerprint of the trainable (LoRA) weights: SHA-256 of their fp32 bytes in name
    order, with readable sums beside it. Names are taken as peft gives them, less the
    ``_orig_mod.`` a compiled module adds."""
    import torch

    named = sorted(((name.replace("_orig_mod.", ""), p) for name, p in model.named_parameters()
                    if p.requires_grad), key=lambda item: item[0])
    sha = hashlib.sha256()
    sums = {"lora_A": 0.0, "lora_B": 0.0}
    first: list[float] = []
    for name, p in named:
        values = p.detach().to("cpu", torch.float32).contiguous()
        sha.update(name.encode())
        sha.update(values.numpy().tobytes())
        for part in sums:
            if f".{part}." in name:
                sums[part] += float(values.abs().double().sum())
        if not first and ".lora_A." in name:
            first = [float(v) for v in values.flatten()[:4]]
    return {"sha256": sha.hexdigest(), "tensors": len(named),
            "abs_sum_A": sums["lora_A"], "abs_sum_B": sums["lora_B"], "first_A": first}


@dataclass(frozen=True)
class Match:
    """How one loss curve compares with the reference's, step by step."""

    steps: int
    max_abs: float
    mean_abs: float
    max_rel: float
    worst_step: int
    final: float
    final_ref: float
    passed: bool


def compare_curves(losses: list[float], ref: list[float], tolerance: float) -> Match:
    """The curves step by step; passed when they have the same steps and no step differs by
    more than ``tolerance`` (absolute). A curve of another length fails: a run that stopped
    early learned less."""
    if not losses or not ref:
        raise ValueError("an empty loss curve cannot be compared")
    n = min(len(losses), len(ref))
    diffs = [abs(a - b) for a, b in zip(losses[:n], ref[:n], strict=True)]
    worst = max(range(n), key=diffs.__getitem__)
    return Match(
        steps=len(losses), max_abs=diffs[worst], mean_abs=sum(diffs) / n,
        max_rel=max(d / abs(b) if b else float("inf") for d, b in zip(diffs, ref, strict=False)),
        worst_step=worst + 1, final=losses[-1], final_ref=ref[-1],
        passed=len(losses) == len(ref) and diffs[worst] <= tolerance,
    )


def refusals(runs: dict[str, dict], reference: str = "hf") -> dict[str, str]:
    """Why a run cannot be compared with ``reference``: its initial LoRA weights or its batch
    order differ (by name; the control is expected to differ and is checked the other way:
    a control with the reference's init or order would be no control)."""
    ref = runs.get(reference) or {}
    why: dict[str, str] = {}
    for name, run in runs.items():
        if name == reference or "losses" not in run:
            continue
        same_init = run.get("init", {}).get("sha256") == ref.get("init", {}).get("sha256")
        same_order = run.get("order") == ref.get("order")
        if name == CONTROL:
            if same_init or same_order:
                why[name] = ("the control trained from the reference's "
                             + ("initial LoRA weights" if same_init else "batch order")
                             + ": its seed did not reach them")
        elif not same_init:
            why[name] = (f"its initial LoRA weights differ from {reference}'s (sha256 "
                         f"{run.get('init', {}).get('sha256', '?')[:12]} vs "
                         f"{ref.get('init', {}).get('sha256', '?')[:12]})")
        elif not same_order:
            why[name] = f"its batches differ from {reference}'s (row order)"
    return why


def control_check(control: Match | None, tolerance: float) -> str:
    """'' when the control drifts at least ``CONTROL_MARGIN`` tolerances; else why not."""
    if control is None:
        return "no control run (hf-other-seed): the tolerance's power is unknown"
    if control.max_abs < CONTROL_MARGIN * tolerance:
        return (f"the control drifts by {control.max_abs:.4g} at most, under "
                f"{CONTROL_MARGIN:g} x the tolerance {tolerance:g}: the check cannot tell "
                "a differently trained run from ours")
    return ""


# ----------------------------------------------------------------------------------------
# One run, in this (child) process.


def run_config(ctx: dict, seed: int, setting: Setting | None = None):
    """The ``SFTConfig`` of a run: ours with ``setting``'s levers, or the HF run's (the same
    model, data, LoRA and optimisation knobs; its speed knobs are never read)."""
    checkpointing = bool(setting and setting.checkpointing)
    return ours_config(
        ctx, ctx["batch"], ctx["steps"], checkpointing=checkpointing,
        offload=bool(setting and setting.ours.offload), tile=bool(setting and setting.ours.tile),
        compile=setting.ours.compile if setting else "off",
        lora_dropout=0.0, weight_decay=0.0, lr_schedule="constant", warmup_steps=0, seed=seed,
        log_every=max(1, ctx["steps"] // 10), precision="bf16")


@contextmanager
def watching_the_loop(record: dict) -> Iterator[None]:
    """While the loop runs in this process: the digest of the LoRA weights ``build.assemble``
    hands it (after every lever is applied, before the first step) and every batch its
    sampler draws, into ``record``. Wrapped, not changed: the loop calls the originals."""
    from draslice.trainer import build
    from draslice.trainer.data.sampler import BatchSampler

    assemble, draw = build.assemble, BatchSampler.next
    record["order"] = []

    def assemble_and_digest(*args, **kwargs):
        run = assemble(*args, **kwargs)
        record["init"] = lora_digest(run.model)
        return run

    def draw_and_record(self):
        rows = draw(self)
        record["order"].append(rows.tolist())
        return rows

    build.assemble, BatchSampler.next = assemble_and_digest, draw_and_record
    try:
        yield
    finally:
        build.assemble, BatchSampler.next = assemble, draw


NOTED = ("speed:", "compile:", "[slice] activations", "[slice] offload", "[slice] MLP",
         "[slice] gradient checkpointing")


def train_ours(ctx: dict, setting: Setting) -> dict:
    """Our loop at ``setting``: its per-step losses (metrics.jsonl), the lines saying how it
    ran, its initial LoRA digest and its batches."""
    from draslice.trainer.sft import train
    from draslice.trainer.speed import cuda_graph

    use_switches(setting.ours)
    cuda_graph.KEEP_SLOWER = True  # what the graph learns, even where it is not faster here
    record: dict = {"notes": []}

    def log(line: str) -> None:
        if line.startswith(NOTED):
            print(line, flush=True)
            record["notes"].append(line)

    with tempfile.TemporaryDirectory(prefix="loss-match-") as tmp, watching_the_loop(record):
        metrics = Path(tmp) / "metrics.jsonl"
        train(run_config(ctx, SEED, setting), Path(tmp) / "out", metrics, log=log)
        steps = [json.loads(line) for line in metrics.read_text().splitlines() if line]
    record["losses"] = [s["loss"] for s in sorted(steps, key=lambda s: s["step"])]
    return record


def in_order_trainer(record: dict):
    """An HF ``Trainer`` that reads its dataset in order and keeps, in ``record``, for every
    step the unrounded loss ``training_step`` returns, the rows it trained on and the count
    of labels it divided the summed loss by (checked against the batch's labelled positions).
    """
    from torch.utils.data import SequentialSampler
    from transformers import Trainer

    class InOrderTrainer(Trainer):
        def _get_train_sampler(self, train_dataset=None):
            return SequentialSampler(self.train_dataset if train_dataset is None
                                     else train_dataset)

        def training_step(self, model, inputs, num_items_in_batch=None):
            rows = inputs.pop("rows")
            labelled = int((inputs["labels"][:, 1:] != -100).sum())
            loss = super().training_step(model, inputs, num_items_in_batch)
            record["order"].append(rows.tolist())
            record["losses"].append(float(loss))
            counted = None if num_items_in_batch is None else int(num_items_in_batch)
            if counted not in (None, labelled):
                raise RuntimeError(f"HF divided step {len(record['losses'])}'s loss by "
                                   f"{counted} items; its batch has {labelled} labelled "
                                   "positions")
            record["num_items"].append(counted)
            return loss

    return InOrderTrainer


def train_hf(ctx: dict, seed: int) -> dict:
    """HF Trainer + peft from the loop's initial LoRA weights (the loop's own calls, in its
    order, after the same seed) on the loop's batches in the loop's order."""
    import torch
    from transformers import TrainingArguments

    from draslice.trainer import build
    from draslice.trainer.model import resolve_targets, wrap_lora

    cfg = run_config(ctx, seed)
    device = torch.device(cfg.device)
    torch.manual_seed(cfg.seed)  # as sft._train, right before build.assemble
    tokenizer, base = build.base_model(cfg, device)
    rows, _eval = build.data(cfg, tokenizer)
    model = wrap_lora(base, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout,
                      resolve_targets(base, cfg.lora_targets))
    base.config.use_cache = False  # the loop's forwards ask for no KV cache either
    model.to(device)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # fp32 LoRA weights and optimizer state, as build.assemble
    order = loop_order(len(rows), cfg.batch_size, cfg.seed, cfg.steps)
    record: dict = {"init": lora_digest(model), "order": [], "losses": [], "num_items": []}
    trainer_cls = in_order_trainer(record)
    with tempfile.TemporaryDirectory(prefix="loss-match-hf-") as tmp:
        args = {**_trainer_args(ctx, cfg.batch_size, cfg.steps, False, tmp),
                "bf16": True, "seed": cfg.seed, "train_sampling_strategy": "sequential",
                "dataloader_drop_last": False}
        trainer = trainer_cls(model=model, args=TrainingArguments(**args),
                              train_dataset=hf_dataset(order), data_collator=RowCollator(rows))
        record["loss_kwargs"] = bool(trainer.model_accepts_loss_kwargs)
        trainer.train()
    if record["order"] != order:
        raise RuntimeError("HF trained on other batches than the loop's order")
    record["notes"] = [f"HF loss: {'sum / num_items_in_batch' if record['loss_kwargs'] else 'mean'}"
                       " over the labelled next-token positions (checked each step)"]
    return record


def child_main(args: argparse.Namespace) -> None:
    """One run (``--child NAME``) in this fresh process; its record to ``--result``."""
    ctx = {**json.loads(args.inputs), "seq": args.seq, "batch": args.batch,
           "steps": args.steps, "smoke": args.smoke, "shape": SHAPES[args.shape]}
    start = time.perf_counter()
    if args.child in REFERENCES:
        record = train_hf(ctx, SEED + REFERENCES[args.child])
    else:
        record = train_ours(ctx, SETTINGS[args.child])
    record["run_s"] = time.perf_counter() - start
    write_json(args.result, record)


# ----------------------------------------------------------------------------------------
# The parent: the runs, the checks, the table.


def judge(runs: dict[str, dict], tolerance: float) -> dict:
    """Each run's verdict against ``hf`` (PASS, FAIL, REFUSED, SKIPPED or ERROR) with its
    figures, what is wrong with the control (empty: nothing), and whether all is well."""
    ref = runs.get("hf") or {}
    why_not = refusals(runs)
    matches: dict[str, dict] = {}
    control: Match | None = None
    for name, run in runs.items():
        if name == "hf":
            continue
        if "losses" not in run or "losses" not in ref:
            what = run.get("skipped") or run.get("error") or f"hf: {ref.get('error', '?')}"
            matches[name] = {"verdict": "SKIPPED" if "skipped" in run else "ERROR",
                             "why": what}
            continue
        m = compare_curves(run["losses"], ref["losses"], tolerance)
        if name == CONTROL and name not in why_not:
            control = m
        verdict = (REFUSED if name in why_not else
                   "control" if name == CONTROL else "PASS" if m.passed else "FAIL")
        matches[name] = {"verdict": verdict, **asdict(m),
                         **({"why": why_not[name]} if name in why_not else {})}
    weak = why_not.get(CONTROL) or control_check(control, tolerance)
    ours = [m for n, m in matches.items() if n in SETTINGS and m["verdict"] != "SKIPPED"]
    ok = bool(ours) and all(m["verdict"] == "PASS" for m in ours) and not weak
    return {"matches": matches, "control_problem": weak, "ok": ok}


def table(summary: dict) -> list[str]:
    """The result as printed (and kept in the JSON for a results page)."""
    tol = summary["tolerance"]
    lines = [f"## loss match, {summary['shape']}, {summary['batch']} x {summary['seq']} "
             f"tokens, {summary['steps']} steps, bf16; PASS: every step within {tol:g} of "
             "HF Trainer + peft", "",
             "| setting | steps | max abs Δ loss vs HF | mean abs Δ | max relative Δ | "
             "final loss ours / HF | verdict |", "|---|---|---|---|---|---|---|"]
    for name, m in summary["matches"].items():
        if "max_abs" not in m:
            lines.append(f"| {name} | | | | | | {m['verdict']}: {m['why'][:160]} |")
            continue
        verdict = m["verdict"] + (f": {m['why']}" if m.get("why") else "")
        if name == CONTROL:
            verdict = f"control (seed {SEED + REFERENCES[CONTROL]}): how far another run drifts"
        lines.append(
            f"| {name} | {m['steps']} | {m['max_abs']:.2e} (step {m['worst_step']}) "
            f"| {m['mean_abs']:.2e} | {m['max_rel']:.3%} | {m['final']:.4f} / "
            f"{m['final_ref']:.4f} | {verdict} |")
    notes = [f"- {name}: {'; '.join(run['notes'])}" for name, run in summary["runs"].items()
             if run.get("notes")]
    lines += ["", *notes] if notes else []
    if summary["control_problem"]:
        lines += ["", f"FAIL: {summary['control_problem']}"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="Runs: " + "; ".join(f"{n}: {s.title}" for n, s in SETTINGS.items())
        + f"; references: hf, {CONTROL}. Exit 0: every setting PASSes.")
    parser.add_argument("--shape", choices=[n for n, s in SHAPES.items() if not s.quantized],
                        default="qwen2.5-0.5b",
                        help="peer_trainers' random-init shapes with a bf16 base (not the "
                             "4-bit one; 'smoke' is what --smoke trains)")
    parser.add_argument("--seq", type=int, default=1024, help="tokens per packed row")
    parser.add_argument("--batch", type=int, default=4, help="rows per step")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--settings", help=f"comma list of {', '.join(SETTINGS)} (default: all; "
                        "with --smoke: those a CPU can tell apart)")
    parser.add_argument("--tolerance", type=float,
                        help="largest absolute loss difference on any step that passes "
                             f"(default: {TOLERANCE:g}; with --smoke {SMOKE_TOLERANCE:g})")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, peer_trainers' tiny 'smoke' shape, seq <= 64, batch 4; the "
                             "CUDA-only settings are skipped")
    parser.add_argument("--model-root", default="/dev/shm/draslice-peers",
                        help="where the random-init model and data are kept (shared with "
                             "peer_trainers.py)")
    parser.add_argument("--timeout-s", type=float, default=900, help="per run (child process)")
    parser.add_argument("--json-out", help="the curves, verdicts and table as JSON (rewritten "
                        "as each run finishes, marked partial until the end)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at a time on the one device (what is compared is each step's "
                             "loss, not its speed; each run needs its own memory)")
    parser.add_argument("--child", choices=[*SETTINGS, *REFERENCES], help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke and not args.child:
        args.shape, args.seq, args.batch = "smoke", min(args.seq, 64), 4
    if args.child:
        child_main(args)
        return
    for flag in ("seq", "batch", "steps", "jobs"):
        if getattr(args, flag) < 1 or (flag == "seq" and args.seq < 2):
            parser.error(f"--{flag} must be a positive number, not {getattr(args, flag)}")
    if args.tolerance is None:
        args.tolerance = SMOKE_TOLERANCE if args.smoke else TOLERANCE
    if not args.tolerance > 0:
        parser.error(f"--tolerance must be > 0, not {args.tolerance}")
    names = ([n.strip() for n in args.settings.split(",") if n.strip()] if args.settings
             else list(SETTINGS))
    bad = sorted(set(names) - set(SETTINGS))
    if bad or not names:
        parser.error(f"unknown settings {bad}; choose from {', '.join(SETTINGS)}")
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device: the comparison is of bf16 runs on a GPU; "
                         "use --smoke on a CPU")
    sys.exit(0 if run_all(args, names)["ok"] else 1)


def run_all(args: argparse.Namespace, names: list[str]) -> dict:
    """Prepare the inputs, run the references and the settings, judge, print, save."""
    kill_children_on_term()
    root = Path(tempfile.mkdtemp(prefix="loss-match-smoke-") if args.smoke else args.model_root)
    root.mkdir(parents=True, exist_ok=True)
    try:
        inputs = prepare(args.shape, args.seq, root, args.smoke)
        runs = run_children(args, inputs, names)
    finally:
        if args.smoke:
            shutil.rmtree(root, ignore_errors=True)
    summary = {"shape": args.shape, "seq": args.seq, "batch": args.batch, "steps": args.steps,
               "seed": SEED, "tolerance": args.tolerance, "control_margin": CONTROL_MARGIN,
               "device": "cpu" if args.smoke else "cuda", "runs": runs,
               **judge(runs, args.tolerance)}
    summary["table"] = table(summary)
    print("\n".join(summary["table"]), flush=True)
    if args.json_out:
        write_json(args.json_out, summary)
    return summary


def run_children(args: argparse.Namespace, inputs: dict, names: list[str]) -> dict[str, dict]:
    """Every run in its own process, the references first; a setting a CPU cannot tell apart
    from another is skipped under --smoke, with its reason."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}
    runs: dict[str, dict] = {}
    with (tempfile.TemporaryDirectory(prefix="loss-match-") as work,
          ThreadPoolExecutor(max_workers=args.jobs) as pool):
        pending = {}
        for name in [*REFERENCES, *names]:
            skip = SETTINGS[name].cpu_skip if args.smoke and name in SETTINGS else ""
            if skip:
                print(f"[{name}] skipped: {skip}", flush=True)
                runs[name] = {"skipped": skip}
                continue
            pending[pool.submit(one_child, args, inputs, name,
                                Path(work) / f"{name}.json", env)] = name
        for future in as_completed(pending):
            runs[pending[future]] = future.result()
            if args.json_out:  # a run stopped later keeps every curve that finished
                write_json(args.json_out, {"shape": args.shape, "partial": True,
                                           "runs": dict(runs)})
    return {name: runs[name] for name in [*REFERENCES, *names]}


def one_child(args: argparse.Namespace, inputs: dict, name: str, result: Path,
              env: dict[str, str], runner: Callable = run_child) -> dict:
    """One run in a fresh process: its record, or what stopped it."""
    argv = [sys.executable, __file__, "--child", name, "--shape", args.shape,
            "--seq", str(args.seq), "--batch", str(args.batch), "--steps", str(args.steps),
            "--inputs", json.dumps(inputs), "--result", str(result)]
    if args.smoke:
        argv.append("--smoke")
    what = "HF Trainer + peft" if name in REFERENCES else SETTINGS[name].title
    print(f"[{name}] starting: {what}", flush=True)
    outcome = runner(argv, result, args.timeout_s, prefix=f"[{name}] ", env=env)
    if outcome.ok:
        run = outcome.result
        print(f"[{name}] {len(run['losses'])} steps in {run['run_s']:.0f} s, loss "
              f"{run['losses'][0]:.4f} -> {run['losses'][-1]:.4f}", flush=True)
        return run
    tail = outcome.tail.strip().splitlines()
    error = ("timed out" if outcome.timed_out else f"exit {outcome.returncode}"
             + (f": {tail[-1][:300]}" if tail else ""))
    print(f"[{name}] failed: {error}", flush=True)
    return {"error": error}


if __name__ == "__main__":
    main()
