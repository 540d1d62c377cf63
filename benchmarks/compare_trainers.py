"""Our SFT loop against HF Trainer + peft (the seed's approach) and TRL SFTTrainer + peft.

    python benchmarks/compare_trainers.py [--config seed] [--config gpt2-124m] [--smoke]
        [--trainers ours,ours-compiled,ours-cudagraphs,hf,hf-compiled,trl] [--peak-tflops X]
        [--json-out FILE]

Same model (``draslice.trainer.model.build_base`` + ``wrap_lora``, same shape, seed and LoRA
config), same data tensor (``successor_chains`` with the same seed), same batch size and
sequence length (no padding, so every step does the same work), same number of optimizer
steps, same precision (bf16 autocast over fp32 weights on a GPU, fp32 on the CPU), same
optimizer (AdamW, fused on CUDA, constant learning rate, no weight decay, no gradient
clipping: our loop clips nothing, so Trainer's default clipping is switched off), and for the
Trainers no logging, saving or evaluation (``report_to=[]``). TRL's own default of gradient
checkpointing is switched off too (no trainer here recomputes activations).

Timing: the first ``warmup`` optimizer steps are excluded (compilation happens in them). The
clock starts at the end of step ``warmup`` and stops at the end of the last step: the Trainers'
callback calls ``torch.cuda.synchronize`` at both points; for our loop the interval is the sum of
its own per-step times after the warm-up (``step_seconds`` in metrics.jsonl: CUDA events from
one step's end to the next's, the same end-to-end interval on the device). The time at which our
loop *logs* a step is not usable: it reads a step's loss one step late, after queueing the next
step, so the log call can come up to a step's queueing after the step ended (and a synchronize
there would wait for the next step too, and count one timed step too many). What a trainer does
between steps (its data loader, callbacks) is inside the interval for all of them alike.
tokens/s = timed steps x batch x sequence length / interval. Peak memory is the process's
peak reserved CUDA memory (what counts against a slice); every trainer runs in its own fresh
process so no trainer sees another's cached blocks. On the CPU (``--smoke``) peak memory is
the process's peak RSS and the targets are not judged.

MFU: see ``flops.py`` (``lora``: 4N + 6N_lora + 12·L·d·S per token, the work LoRA needs;
``full``: the standard 6N + 12·L·d·S), over the measured bf16 matmul peak of
``draslice.trainer.tasks.smoke`` (``--peak-tflops``, or measured here when not given).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from transformers import TrainerCallback

from draslice.benchmarks.childproc import kill_children_on_term, run_child, write_json
from draslice.benchmarks.flops import flop_count, mfu
from draslice.trainer import device as dev
from draslice.trainer.data.synthetic import successor_chains
from draslice.trainer.loglines import gib
from draslice.trainer.model import ModelShape, build_base, wrap_lora

TRAINERS = {
    "ours": "draslice SFT loop (default: auto)",
    "ours-eager": "draslice SFT loop, eager",
    "ours-compiled": "draslice, compile default",
    "ours-cudagraphs": "draslice, reduce-overhead",
    "hf": "HF Trainer + peft",
    "hf-compiled": "HF Trainer, compiled",
    "trl": "TRL SFTTrainer + peft",
}
# The seed's approach is HF Trainer without compilation: the targets are judged against "hf",
# for each of our variants. The compiled Trainer is there so that compilation alone is seen
# for what it gives either side (Trainer's own ``torch_compile=True``).
COMPILE_MODE = {"ours": "auto", "ours-eager": "off", "ours-compiled": "default",
                "ours-cudagraphs": "reduce-overhead"}
OURS = tuple(COMPILE_MODE)
THEIRS = ("hf", "hf-compiled", "trl")  # what each of ours is compared with
SMOKE_TRAINERS = ("ours", "hf", "trl")


@dataclass(frozen=True)
class BenchConfig:
    """One comparison: the model, the data and how long to run, shared by all trainers."""

    name: str
    title: str
    shape: ModelShape
    batch_size: int
    lora_targets: str
    warmup: int
    steps: int
    speed_target_vs_hf: float
    memory_target_vs_hf: bool
    lora_r: int = 8
    lora_alpha: int = 16
    learning_rate: float = 3e-3
    dataset_size: int = 256
    alphabet: int = 64
    seed: int = 0
    smoke: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def timed_steps(self) -> int:
        return self.steps - self.warmup

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.shape.seq_len

    def describe(self) -> str:
        s = self.shape
        label = " [smoke: tiny shape]" if self.smoke else ""
        return (
            f"{self.title}{label}: vocab {s.vocab_size}, {s.n_layer}x{s.n_embd} "
            f"({s.n_head} heads), seq {s.seq_len}, batch {self.batch_size}, LoRA r={self.lora_r} "
            f"alpha={self.lora_alpha} on {self.lora_targets}; {self.timed_steps} timed steps "
            f"after {self.warmup} warm-up"
        )


CONFIGS = {
    # The seed guide's example: GPT-2 shape, LoRA r=8 on the attention projection (c_attn).
    "seed": BenchConfig(
        name="seed", title="seed config", shape=ModelShape(512, 4, 256, 4, 64), batch_size=8,
        lora_targets="c_attn", warmup=10, steps=210, speed_target_vs_hf=2.0,
        memory_target_vs_hf=False,
    ),
    # GPT-2 small (124M) at sequence 512 with draslice's default targets (attention + MLP).
    "gpt2-124m": BenchConfig(
        name="gpt2-124m", title="GPT-2-124M shape", shape=ModelShape(50257, 12, 768, 12, 512),
        batch_size=8, lora_targets="c_attn,c_proj,c_fc", warmup=10, steps=110,
        speed_target_vs_hf=1.5, memory_target_vs_hf=True,
    ),
}
# --smoke: the very same code paths at shapes a CPU runs in seconds.
SMOKE_SHAPES = {
    "seed": (ModelShape(128, 2, 64, 2, 32), 4),
    "gpt2-124m": (ModelShape(256, 2, 96, 2, 64), 4),
}


def config_for(name: str, smoke: bool, steps: int | None = None,
               warmup: int | None = None) -> BenchConfig:
    cfg = CONFIGS[name]
    if smoke:
        shape, batch = SMOKE_SHAPES[name]
        cfg = replace(cfg, shape=shape, batch_size=batch, warmup=2, steps=6, smoke=True)
    cfg = replace(cfg, warmup=cfg.warmup if warmup is None else warmup)
    cfg = replace(cfg, steps=cfg.steps if steps is None else cfg.warmup + steps)
    if cfg.warmup < 1 or cfg.timed_steps < 1:
        raise SystemExit(f"error: --warmup must be >= 1 and --steps >= 1 (got warm-up "
                         f"{cfg.warmup}, timed steps {cfg.timed_steps})")
    return cfg


def bench_data(cfg: BenchConfig) -> torch.Tensor:
    """The one data tensor every trainer trains on."""
    s = cfg.shape
    return successor_chains(cfg.dataset_size, s.seq_len, cfg.alphabet, s.vocab_size, cfg.seed)


def bench_model(cfg: BenchConfig) -> torch.nn.Module:
    """The one LoRA model every trainer trains (our loop builds it with the same calls)."""
    return wrap_lora(
        build_base(cfg.shape, cfg.seed), cfg.lora_r, cfg.lora_alpha, 0.0, cfg.lora_targets
    )


def _sync(torch_device: torch.device) -> None:
    if torch_device.type == "cuda":
        torch.cuda.synchronize(torch_device)


# ----------------------------------------------------------------------------------------
# One trainer, in this (child) process.


def run_ours(cfg: BenchConfig, torch_device: torch.device, precision: str, tmp: Path,
             compile_mode: str) -> dict:
    from draslice.trainer.config import SFTConfig
    from draslice.trainer.sft import train

    sft_cfg = SFTConfig(
        shape=cfg.shape, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
        lora_targets=cfg.lora_targets, batch_size=cfg.batch_size, steps=cfg.steps,
        learning_rate=cfg.learning_rate, weight_decay=0.0, log_every=1,
        dataset_size=cfg.dataset_size, alphabet=cfg.alphabet, seed=cfg.seed,
        device=str(torch_device), precision=precision, compile=compile_mode,
    )
    result = train(sft_cfg, tmp / "out", tmp / "metrics.jsonl", log=lambda _line: None)
    seconds = loop_seconds(tmp / "metrics.jsonl", cfg.warmup, cfg.steps)
    return {"seconds": seconds,
            "loss": {"first": result.initial_loss, "last5": result.final_loss}}


def loop_seconds(metrics: Path, warmup: int, last: int) -> float:
    """Our loop's time for steps ``warmup + 1 .. last``, from its own metrics.jsonl."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    timed = {r["step"]: r["step_seconds"] for r in records if warmup < r["step"] <= last}
    if sorted(timed) != list(range(warmup + 1, last + 1)):
        raise RuntimeError(f"{metrics}: steps {sorted(timed)} recorded, expected "
                           f"{warmup + 1}..{last}")
    return sum(timed.values())


class _StepClock(TrainerCallback):
    """A TrainerCallback that stamps the end of the warm-up step and of the last step."""

    def __init__(self, cfg: BenchConfig, torch_device: torch.device) -> None:
        self.cfg = cfg
        self.device = torch_device
        self.marks: dict[int, float] = {}

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ARG002 (Trainer's signature)
        if state.global_step in (self.cfg.warmup, self.cfg.steps):
            _sync(self.device)
            self.marks[state.global_step] = time.perf_counter()
        return control

    def seconds(self, which: str) -> float:
        """From the end of the warm-up step to the end of the last."""
        if set(self.marks) != {self.cfg.warmup, self.cfg.steps}:
            raise RuntimeError(f"{which}: step clock saw steps {sorted(self.marks)}, expected "
                               f"{self.cfg.warmup} and {self.cfg.steps}")
        return self.marks[self.cfg.steps] - self.marks[self.cfg.warmup]


class _Rows(torch.utils.data.Dataset):
    """The data tensor as a map-style dataset: each row is its own labels (the model shifts)."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def word_tokenizer(vocab_size: int):
    """A tokenizer whose ids are exactly the model's vocabulary: TRL needs one (pad token),
    the data is already ids. Built with ``tokenizers``, nothing downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<t{i}>": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<t0>", pad_token="<t0>", eos_token="<t1>"
    )


def trainer_arguments(cfg: BenchConfig, torch_device: torch.device, precision: str,
                      tmp: Path, compiled: bool = False) -> dict:
    """TrainingArguments fields shared by HF Trainer and TRL, matched to our loop."""
    cuda = torch_device.type == "cuda"
    return dict(
        output_dir=str(tmp / "trainer"), max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=1,
        learning_rate=cfg.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=0.0, bf16=precision == "bf16", fp16=False,
        optim="adamw_torch_fused" if cuda else "adamw_torch", gradient_checkpointing=False,
        logging_strategy="no", save_strategy="no", eval_strategy="no", report_to=[],
        disable_tqdm=True, dataloader_num_workers=0, seed=cfg.seed, use_cpu=not cuda,
        torch_compile=compiled,
    )


def run_hf_family(which: str, cfg: BenchConfig, torch_device: torch.device, precision: str,
                  tmp: Path) -> dict:
    from transformers import Trainer, TrainingArguments

    clock = _StepClock(cfg, torch_device)
    data = bench_data(cfg)
    model = bench_model(cfg)
    common = trainer_arguments(cfg, torch_device, precision, tmp,
                               compiled=which == "hf-compiled")
    if which in ("hf", "hf-compiled"):
        trainer = Trainer(model=model, args=TrainingArguments(**common),
                          train_dataset=_Rows(data), callbacks=[clock])
    else:
        from datasets import Dataset
        from trl import SFTConfig as TrlSFTConfig
        from trl import SFTTrainer

        args = TrlSFTConfig(**common, max_length=cfg.shape.seq_len, packing=False,
                            padding_free=False)
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": data.tolist()}),
            processing_class=word_tokenizer(cfg.shape.vocab_size), callbacks=[clock],
        )
    out = trainer.train()
    return {"seconds": clock.seconds(which), "loss": {"mean": float(out.training_loss)},
            "optimizer": type(trainer.optimizer.optimizer
                              if hasattr(trainer.optimizer, "optimizer")
                              else trainer.optimizer).__name__}


def quiet_libraries() -> None:
    """Deprecation warnings and progress bars of the libraries under test are log noise."""
    import warnings

    import transformers

    warnings.filterwarnings("ignore", category=FutureWarning)
    transformers.logging.set_verbosity_error()
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass


def run_one(which: str, cfg: BenchConfig, device: str, precision_spec: str) -> dict:
    torch_device = dev.resolve_device(device)
    precision = dev.resolve_precision(precision_spec, torch_device)
    dev.reset_peak(torch_device)
    with tempfile.TemporaryDirectory(prefix=f"bench-{which}-") as tmp:
        start = time.perf_counter()
        if which in OURS:
            run = run_ours(cfg, torch_device, precision, Path(tmp), COMPILE_MODE[which])
        else:
            run = run_hf_family(which, cfg, torch_device, precision, Path(tmp))
        run_seconds = time.perf_counter() - start
    seconds = run.pop("seconds")
    out = {
        "trainer": which,
        "label": TRAINERS[which],
        "device": str(torch_device),
        "precision": precision,
        "timed_steps": cfg.timed_steps,
        "timed_seconds": seconds,
        "tokens_per_s": cfg.timed_steps * cfg.tokens_per_step / seconds,
        # The whole train call, warm-up and any compilation included.
        "run_seconds": run_seconds,
        "peak_reserved_gib": gib(dev.peak_memory_bytes(torch_device)),
        "peak_allocated_gib": gib(torch.cuda.max_memory_allocated(torch_device))
        if torch_device.type == "cuda" else None,
        **run,
    }
    return out


# ----------------------------------------------------------------------------------------
# The comparison, in the parent process.


def measure_peak_tflops(device: str) -> dict:
    """The device's dense matmul throughput, through the smoke step's checked matmul."""
    from draslice.trainer.tasks.smoke import run_smoke

    result = run_smoke(device=device)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"tflops": result.tflops, "dtype": result.dtype, "size": result.matmul_size,
            "ok": result.ok, "rel_error": result.rel_error}


def summarise(cfg: BenchConfig, runs: dict[str, dict], peak_tflops: float | None) -> dict:
    model = bench_model(cfg)
    count = flop_count(model, cfg.shape.n_layer, cfg.shape.n_embd, cfg.shape.seq_len)
    for run in runs.values():
        if "tokens_per_s" not in run:
            continue
        tps = run["tokens_per_s"]
        run["achieved_tflops_lora"] = count.lora_per_token * tps / 1e12
        run["mfu_lora"] = mfu(count.lora_per_token, tps, peak_tflops)
        run["mfu_full"] = mfu(count.full_per_token, tps, peak_tflops)

    def ratio(a: str, b: str, key: str) -> float | None:
        x, y = runs.get(a, {}).get(key), runs.get(b, {}).get(key)
        return x / y if x and y else None

    on_gpu = any(runs.get(o, {}).get("device", "cpu").startswith("cuda") for o in OURS)
    judged = not cfg.smoke and on_gpu
    targets = {}
    for ours in OURS:
        if "tokens_per_s" not in runs.get(ours, {}):
            continue
        speed = ratio(ours, "hf", "tokens_per_s")
        mem = ratio(ours, "hf", "peak_reserved_gib")
        speed_ok = speed is not None and speed >= cfg.speed_target_vs_hf
        mem_ok = mem is not None and mem <= 1.0
        targets[ours] = {
            "target": f">= {cfg.speed_target_vs_hf}x HF Trainer tokens/s"
            + (" at <= its peak reserved memory" if cfg.memory_target_vs_hf else ""),
            "speed_vs_hf": speed,
            "memory_vs_hf": mem,
            "pass": (speed_ok and (mem_ok or not cfg.memory_target_vs_hf))
            if judged and speed else None,
        }
    ratios = {}
    for ours in OURS:
        for other in THEIRS:
            ratios[f"{ours}_vs_{other}_tokens_per_s"] = ratio(ours, other, "tokens_per_s")
            ratios[f"{ours}_vs_{other}_peak_memory"] = ratio(ours, other, "peak_reserved_gib")
    return {
        "config": {**asdict(cfg), "description": cfg.describe(),
                   "tokens_per_step": cfg.tokens_per_step},
        "flops": count.to_dict(),
        "peak_tflops": peak_tflops,
        "runs": runs,
        "ratios": ratios,
        "targets": targets,
        "judged": judged,
    }


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def report(summary: dict) -> list[str]:
    lines = [summary["config"]["description"],
             f"{'trainer':<24}{'tokens/s':>12}{'peak reserved GiB':>19}{'peak alloc GiB':>16}"
             f"{'MFU lora':>10}{'MFU 6N':>9}{'run s':>8}"]
    for name, run in summary["runs"].items():
        if "tokens_per_s" not in run:
            lines.append(f"{TRAINERS[name]:<24}  not measured: {run.get('error', '?')}")
            continue
        lines.append(
            f"{run['label']:<24}{run['tokens_per_s']:>12,.0f}{run['peak_reserved_gib']:>19.2f}"
            f"{_fmt(run['peak_allocated_gib'], '.2f'):>16}{_fmt(run['mfu_lora'], '.1%'):>10}"
            f"{_fmt(run['mfu_full'], '.1%'):>9}{run['run_seconds']:>8.1f}"
        )
    r = summary["ratios"]
    for ours in OURS:
        for other in THEIRS:
            speed = r.get(f"{ours}_vs_{other}_tokens_per_s")
            if speed is not None:
                lines.append(f"{TRAINERS[ours]} / {TRAINERS[other]}: {speed:.2f}x tokens/s, "
                             f"{_fmt(r[f'{ours}_vs_{other}_peak_memory'], '.2f')}x peak memory")
    for ours, t in summary["targets"].items():
        verdict = {True: "PASS", False: "FAIL", None: "not judged (CPU / smoke)"}[t["pass"]]
        lines.append(f"target for {TRAINERS[ours]} ({t['target']}): "
                     f"{_fmt(t['speed_vs_hf'], '.2f')}x tokens/s, "
                     f"{_fmt(t['memory_vs_hf'], '.2f')}x memory -> {verdict}")
    return lines


def compare(cfg: BenchConfig, trainers: list[str], device: str, precision: str,
            peak_tflops: float | None, timeout_s: float, work: Path) -> dict:
    runs: dict[str, dict] = {}
    for which in trainers:
        if which == "trl" and importlib.util.find_spec("trl") is None:
            runs[which] = {"error": "trl is not installed here (pip install 'draslice[bench]')"}
            print(f"[compare {cfg.name}] trl: not installed, not measured", flush=True)
            continue
        result_path = work / f"{cfg.name}-{which}.json"
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", which,
                "--config", cfg.name, "--device", device, "--precision", precision,
                "--steps", str(cfg.timed_steps), "--warmup", str(cfg.warmup),
                "--json-out", str(result_path)] + (["--smoke"] if cfg.smoke else [])
        outcome = run_child(argv, result_path, timeout_s, prefix=f"[{cfg.name}/{which}] ")
        if outcome.ok:
            runs[which] = outcome.result
        else:
            why = "timed out" if outcome.timed_out else f"exit {outcome.returncode}"
            last = outcome.tail.strip().splitlines()[-1:] or [""]
            runs[which] = {"error": f"{why} after {outcome.seconds:.0f} s: {last[0][:300]}"}
    return summarise(cfg, runs, peak_tflops)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Tokens/s, peak memory and MFU of our SFT loop vs HF Trainer and TRL "
        "SFTTrainer (same model, data, steps, precision, LoRA config).",
    )
    parser.add_argument("--config", action="append", choices=sorted(CONFIGS),
                        help="which comparison (repeatable; default: all)")
    parser.add_argument("--trainers", default=None,
                        help=f"comma-separated subset of {','.join(TRAINERS)} (default: all; "
                        f"with --smoke {','.join(SMOKE_TRAINERS)}: compiling on a CPU proves "
                        "nothing about speed and takes a minute per variant)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes and 6 steps: the same code paths, for a CPU")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed optimizer steps (default: 200 seed, 100 gpt2-124m, 4 smoke)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed warm-up steps before them (default: 10; 2 smoke)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--precision", default="auto", help="auto (bf16 on a GPU), bf16, fp32")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="measured matmul TFLOP/s for MFU (default: measure it now)")
    parser.add_argument("--timeout-s", type=float, default=1800.0,
                        help="per trainer's process: one still running after this many "
                        "seconds is killed and reported (default %(default).0f)")
    parser.add_argument("--json-out", help="write the result JSON here")
    parser.add_argument("--peak-only", action="store_true",
                        help="only measure the matmul peak (the smoke step's checked matmul)")
    parser.add_argument("--child", choices=sorted(TRAINERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.config or list(CONFIGS)

    if args.child:
        cfg = config_for(names[0], args.smoke, args.steps, args.warmup)
        quiet_libraries()
        write_json(args.json_out, run_one(args.child, cfg, args.device, args.precision))
        return

    kill_children_on_term()
    quiet_libraries()
    chosen = args.trainers or ",".join(SMOKE_TRAINERS if args.smoke else TRAINERS)
    trainers = [t.strip() for t in chosen.split(",") if t.strip()]
    unknown = sorted(set(trainers) - set(TRAINERS))
    if unknown:
        parser.error(f"--trainers: unknown {unknown}; choose from {', '.join(TRAINERS)}")
    peak = {"tflops": args.peak_tflops, "source": "--peak-tflops"}
    if args.peak_tflops is None or args.peak_only:
        peak = {**measure_peak_tflops(args.device), "source": "measured"}
        print(f"matmul peak: {peak['tflops']:.4g} TFLOP/s ({peak['dtype']} {peak['size']}^3, "
              f"checked: {peak['ok']})", flush=True)
        if args.peak_only:
            if args.json_out:
                write_json(args.json_out, {"peak_matmul": peak})
            return
    out: dict = {"peak_matmul": peak, "comparisons": {}}
    with tempfile.TemporaryDirectory(prefix="compare-") as work:
        for name in names:
            cfg = config_for(name, args.smoke, args.steps, args.warmup)
            summary = compare(cfg, trainers, args.device, args.precision, peak["tflops"],
                              args.timeout_s, Path(work))
            out["comparisons"][name] = summary
            print("\n".join(report(summary)), flush=True)
            if args.json_out:
                write_json(args.json_out, out)


if __name__ == "__main__":
    main()
