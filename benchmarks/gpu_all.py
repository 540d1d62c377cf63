"""Every GPU benchmark behind docs/benchmarks.md in one command, each in its own process.

    python benchmarks/gpu_all.py --out DIR [--only STEP ...] [--timeout-s 7200] [--smoke]

From a checkout installed with ``pip install -e '.[bench]'`` (docs/benchmarks.md says how on a
GPU host without network). The steps, in this order: the environment's facts (GPU, driver,
library versions), the checked bf16 matmul peak (every MFU after it is against that figure),
``compare_trainers.py`` on the seed config and on the GPT-2-124M shape, ``fit_slice.py``'s
1.5B LoRA and 7B QLoRA cases, ``peer_trainers.py`` on every shape and cap of the peer tables,
the 8B QLoRA shape, the long-sequence search, the stacked LoRA update against the epilogue
one, a 200-step run, ``loss_match.py`` (our loss curve against HF Trainer's at every speed
setting), ``advise_time.py``, ``loss_chunk.py`` and ``sm_cap.py``.

After every step ``DIR/summary.json`` is rewritten (atomically) and ``DIR/results.md``
regenerated from what finished, so a run stopped early keeps every figure it made;
``DIR/gpu_all.log`` has every child's output. A step still running after ``--timeout-s`` is
killed with its whole process group and reported as TIMEOUT, so one that hangs does not hold
the others. The driver itself never touches CUDA.

``--smoke`` runs the same code paths on the CPU at tiny shapes (a test runs it): the GPU-only
steps are left out, and of the peer steps, which all run ``peer_trainers.py``'s one tiny shape
there, the first.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent


def importable_here() -> str | None:
    """Why this checkout's benchmarks cannot run as ``draslice.benchmarks``, or None."""
    try:
        spec = importlib.util.find_spec("draslice.benchmarks")
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return (f"draslice.benchmarks is not importable: install this checkout with "
                f"`pip install -e {HERE.parent}` (a wheel does not carry the benchmarks)")
    found = [Path(p).resolve() for p in spec.submodule_search_locations or ()]
    if HERE not in found:
        where = ", ".join(str(p.parent) for p in found)
        return (f"draslice is installed from {where}, not from this checkout: "
                f"`pip install -e {HERE.parent}`")
    return None


if __name__ == "__main__" and (_problem := importable_here()):
    print(f"gpu_all.py: error: {_problem}", file=sys.stderr)
    raise SystemExit(2)

from draslice.benchmarks.childproc import (  # noqa: E402
    ChildOutcome,
    kill_children_on_term,
    run_child,
    write_json,
)

DEFAULT_TIMEOUT_S = 7200.0


@dataclass(frozen=True)
class Step:
    name: str
    script: str
    args: tuple[str, ...] = ()
    smoke: tuple[str, ...] | None = None  # its arguments under --smoke; None: not run there
    peak: bool = False  # given the matmul step's figure as --peak-tflops
    json_out: bool = True  # the script writes its result to --json-out


def _peers(name: str, shape: str, seq: int, caps: str, peers: str, *extra: str,
           smoke: tuple[str, ...] | None = None) -> Step:
    return Step(name, "peer_trainers.py", ("--shape", shape, "--seq", str(seq), "--caps", caps,
                                           "--peers", peers, *extra), smoke=smoke, peak=True)


# Uncapped every peer runs as it comes; under a cap our loop runs with gradient checkpointing and
# offload_activations, as Unsloth offloads its checkpointed activations.
UNCAPPED = "ours,hf,hf-liger,trl,unsloth"
CAPPED = "ours-offload,hf,hf-liger,trl,unsloth"

STEPS = (
    Step("env", "envfacts.py", smoke=()),
    Step("matmul", "compare_trainers.py", ("--peak-only",), smoke=("--peak-only", "--smoke")),
    Step("compare_seed", "compare_trainers.py", ("--config", "seed"),
         smoke=("--config", "seed", "--smoke"), peak=True),
    Step("compare_gpt2_124m", "compare_trainers.py", ("--config", "gpt2-124m"),
         smoke=("--config", "gpt2-124m", "--smoke"), peak=True),
    Step("fit_1.5b", "fit_slice.py", ("--case", "1.5b"), smoke=("--case", "1.5b", "--smoke")),
    Step("fit_7b", "fit_slice.py", ("--case", "7b"), smoke=("--case", "7b", "--smoke")),
    _peers("peers_0.5b_none", "qwen2.5-0.5b", 1024, "none", UNCAPPED,
           smoke=("--smoke", "--peers", "ours,hf")),
    _peers("peers_0.5b_1g.6gb", "qwen2.5-0.5b", 1024, "1g.6gb", CAPPED, "--fit-max", "16"),
    _peers("peers_0.5b_2g.12gb", "qwen2.5-0.5b", 1024, "2g.12gb", CAPPED, "--fit-max", "32"),
    # 4 x 2,048 as well as 8: HF Trainer holds 8 x 2,048 on a 141 GB H200, not on an 80 GB H100.
    _peers("peers_1.5b_none", "qwen2.5-1.5b", 2048, "none", UNCAPPED, "--batch", "8"),
    _peers("peers_1.5b_none_b4", "qwen2.5-1.5b", 2048, "none", "ours,hf", "--batch", "4"),
    _peers("peers_1.5b_1g.6gb", "qwen2.5-1.5b", 2048, "1g.6gb", CAPPED, "--fit-max", "8"),
    _peers("peers_1.5b_2g.12gb", "qwen2.5-1.5b", 2048, "2g.12gb", CAPPED, "--fit-max", "24"),
    _peers("peers_7b_none", "llama-7b", 1024, "none", UNCAPPED),
    _peers("peers_7b_2g.12gb", "llama-7b", 1024, "2g.12gb", CAPPED, "--fit-max", "16"),
    _peers("peers_8b_2g.12gb", "llama-3.1-8b", 2048, "2g.12gb", "ours-offload,unsloth",
           "--fit-max", "8"),
    # The longest sequence each trains at batch 1, and the speed where both do.
    _peers("long_1.5b_1g.6gb", "qwen2.5-1.5b", 2048, "1g.6gb", "ours-offload,ours-tiled,unsloth",
           "--seqs", "4096,8192,16384,32768", "--warmup", "2", "--steps", "3"),
    _peers("long_1.5b_2g.12gb", "qwen2.5-1.5b", 2048, "2g.12gb", "ours-offload,ours-tiled,unsloth",
           "--seqs", "4096,8192,16384,32768,65536", "--warmup", "2", "--steps", "3"),
    # What stacking the LoRA update into gate/up's base matmul is worth (lora_fused).
    _peers("stack_1.5b", "qwen2.5-1.5b", 2048, "1g.6gb,none", "ours-offload,ours-offload-epilogue",
           "--fit-max", "8", "--batch", "4"),
    # A 200-step run as a user starts it: the first loss line and the whole process.
    _peers("short_0.5b_1g.6gb", "qwen2.5-0.5b", 1024, "1g.6gb", "ours-offload,unsloth",
           "--fit-max", "16", "--warmup", "3", "--steps", "197"),
    Step("loss_match", "loss_match.py", ("--jobs", "4"),
         smoke=("--smoke", "--steps", "10", "--settings", "eager")),
    Step("advise_time", "advise_time.py",
         ("--shape", "qwen2.5-1.5b", "--seq", "2048", "--batch", "8", "--steps", "40"),
         smoke=("--smoke",)),
    Step("loss_chunk", "loss_chunk.py", ("--chunk-rows", "1024,2048", "--liger-mem", "1,2,4,8"),
         json_out=False),
    Step("sm_cap", "sm_cap.py", ("--sms", "16,32,64")),
)


def steps(smoke: bool) -> list[Step]:
    """The steps a run takes, with the arguments they run with."""
    if not smoke:
        return list(STEPS)
    return [replace(s, args=s.smoke) for s in STEPS if s.smoke is not None]


class Driver:
    def __init__(self, out: Path, smoke: bool, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.out = out
        self.timeout_s = timeout_s
        self.start = time.monotonic()
        out.mkdir(parents=True, exist_ok=True)
        self.log: TextIO = (out / "gpu_all.log").open("a", buffering=1)
        self.summary: dict = {
            "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "smoke": smoke, "argv": sys.argv, "steps": {},
        }

    def say(self, line: str) -> None:
        stamp = f"[gpu_all +{time.monotonic() - self.start:5.0f}s] "
        for sink in (sys.stdout, self.log):
            sink.write(stamp + line + "\n")
            sink.flush()

    def save(self) -> None:
        self.summary["elapsed_s"] = round(time.monotonic() - self.start, 1)
        write_json(self.out / "summary.json", self.summary)
        (self.out / "results.md").write_text(results_markdown(self.summary))

    def run_step(self, step: Step, extra: tuple[str, ...] = ()) -> dict | None:
        """Run ``step`` in its own process; record, save and return its result."""
        result_path = self.out / "steps" / f"{step.name}.json"
        argv = [sys.executable, str(HERE / step.script), *step.args, *extra]
        if step.json_out:
            argv += ["--json-out", str(result_path)]
        self.say(f"step {step.name}: {' '.join(argv[1:])}")
        outcome: ChildOutcome = run_child(argv, result_path, self.timeout_s, log=self.log,
                                          prefix=f"[{step.name}] ")
        done = outcome.ok if step.json_out else (outcome.returncode == 0
                                                 and not outcome.timed_out)
        status = "OK" if done else ("TIMEOUT" if outcome.timed_out else "ERROR")
        record: dict = {"status": status, "seconds": round(outcome.seconds, 1),
                        "result": outcome.result}
        if not done:
            record["returncode"] = outcome.returncode
        if not done or not step.json_out:  # the output is the result of a script without JSON
            record["tail"] = outcome.tail[-3000:]
        self.summary["steps"][step.name] = record
        self.say(f"step {step.name}: {status} ({outcome.seconds:.0f} s)")
        self.save()
        return outcome.result


# ----------------------------------------------------------------------------------------
# The results page, from whatever finished.


def _f(x, spec: str = ".2f") -> str:
    return "" if x is None else format(x, spec)


def _verdict(passed: bool | None) -> str:
    return {True: "PASS", False: "FAIL"}.get(passed, "not judged")


def _result(steps_: dict, name: str) -> dict:
    return (steps_.get(name) or {}).get("result") or {}


def _compare_lines(steps_: dict) -> list[str]:
    lines = ["| config | trainer | tokens/s | peak reserved GiB | MFU (LoRA FLOPs) | MFU (6N) |",
             "|---|---|---|---|---|---|"]
    targets: list[str] = []
    for key in ("compare_seed", "compare_gpt2_124m"):
        for name, comp in (_result(steps_, key).get("comparisons") or {}).items():
            for run in comp["runs"].values():
                lines.append(f"| {name} | {run.get('label', run.get('trainer', '?'))} | "
                             f"{_f(run.get('tokens_per_s'), ',.0f')} | "
                             f"{_f(run.get('peak_reserved_gib'))} | "
                             f"{_f(run.get('mfu_lora'), '.1%')} | "
                             f"{_f(run.get('mfu_full'), '.1%')} |"
                             + ("" if "tokens_per_s" in run else f" {run.get('error', '')} |"))
            r = comp["ratios"]
            for ours, t in comp["targets"].items():  # one per variant of ours measured
                if t["speed_vs_hf"] is None:
                    continue
                targets.append(
                    f"- {name}, {ours}: /HF Trainer {_f(t['speed_vs_hf'])}x "
                    f"tokens/s, {_f(t['memory_vs_hf'])}x peak memory; "
                    f"/HF Trainer compiled {_f(r.get(f'{ours}_vs_hf-compiled_tokens_per_s'))}x; "
                    f"/TRL {_f(r.get(f'{ours}_vs_trl_tokens_per_s'))}x tokens/s; target "
                    f"{t['target']}: {_verdict(t['pass'])}")
    return [*lines, "", *targets, ""]


def _fit_lines(steps_: dict) -> list[str]:
    lines = ["| fit case | profile (cap) | status | peak reserved GiB | device peak GiB | "
             "tokens/s |", "|---|---|---|---|---|---|"]
    for key in ("fit_1.5b", "fit_7b"):
        step = steps_.get(key) or {}
        for name, case in ((step.get("result") or {}).get("cases") or {}).items():
            t = case.get("train") or {}
            res = t.get("result") or {}
            cap = "smoke: no cap" if case.get("smoke") else f"{case['slice_memory_gib']} GiB"
            lines.append(f"| {name} | {case['profile']} ({cap}) | "
                         f"{case['status']}{' — ' + case['why'] if 'why' in case else ''} | "
                         f"{_f(t.get('peak_reserved_gib'))} | {_f(t.get('peak_device_used_gib'))}"
                         f" | {_f(res.get('tokens_per_s'), ',.0f')} |")
        if step and not step.get("result"):
            lines.append(f"| {key} | | {step['status']} | | | |")
    return [*lines, ""]


def _advise_lines(steps_: dict) -> list[str]:
    found = _result(steps_, "advise_time")
    if not found:
        return []
    return [f"advise's probe, {found['shape']} at {found['batch']} x {found['seq']}: steady step "
            f"{found['probe']['steady_s']:.4f} s against the real run's "
            f"{found['real']['steady_s']:.4f} s ({found['step_ratio']:.3f}x); its estimate of "
            f"{found['steps']} steps {found['estimate_s']:.2f} s against "
            f"{found['real_steps_s']:.2f} s ({found['run_ratio']:.3f}x)", ""]


def results_markdown(summary: dict) -> str:
    steps_ = summary["steps"]
    label = " (CPU --smoke: plumbing only, not benchmark figures)" if summary["smoke"] else ""
    lines = [f"# gpu_all results{label}", "",
             f"started {summary['started_utc']}, {summary.get('elapsed_s', 0):.0f} s", ""]
    env = _result(steps_, "env")
    if env:
        gpu, pk = env.get("gpu", {}), env.get("packages", {})
        lines += [f"GPU: {gpu.get('name', 'none')} ({gpu.get('nvidia_smi')}), "
                  f"torch {pk.get('torch')} (CUDA {gpu.get('torch_cuda')}), transformers "
                  f"{pk.get('transformers')}, peft {pk.get('peft')}, trl {pk.get('trl')}, "
                  f"bitsandbytes {pk.get('bitsandbytes')}, accelerate {pk.get('accelerate')}",
                  ""]
    peak = _result(steps_, "matmul").get("peak_matmul") or {}
    if peak:
        lines += [f"Matmul peak (checked, {peak.get('dtype')} {peak.get('size')}^3): "
                  f"{_f(peak.get('tflops'), '.4g')} TFLOP/s", ""]
    lines += _compare_lines(steps_) + _fit_lines(steps_)
    for step in steps_.values():  # peer_trainers' and loss_match's own tables, as printed
        table = (step.get("result") or {}).get("table")
        if table:
            lines += [*table, ""]
    lines += _advise_lines(steps_)
    for name, step in steps_.items():  # the scripts without a JSON result: their output
        if step["status"] == "OK" and step.get("result") is None and step.get("tail"):
            lines += [f"{name}:", "", "```text", step["tail"].rstrip(), "```", ""]
    lines += ["Steps: " + ", ".join(f"{k} {v['status']} {v['seconds']:.0f}s"
                                    for k, v in steps_.items()), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Run every GPU benchmark of docs/benchmarks.md, each in its own process; "
        "write OUT/summary.json, OUT/results.md and OUT/gpu_all.log as it goes.",
    )
    parser.add_argument("--out", required=True, help="results folder")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, tiny shapes, a few steps: the same code paths")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                        help="a step still running after this many seconds is killed and "
                        "reported as TIMEOUT (default %(default).0f)")
    parser.add_argument("--only", action="append", default=[], metavar="STEP",
                        choices=[s.name for s in STEPS],
                        help="run only this step (repeatable): %(choices)s")
    args = parser.parse_args()

    kill_children_on_term()
    driver = Driver(Path(args.out), args.smoke, args.timeout_s)
    driver.say(f"smoke={args.smoke}, python {sys.executable}")
    peak_tflops: float | None = None
    for step in steps(args.smoke):
        if args.only and step.name not in args.only:
            continue
        extra = ("--peak-tflops", f"{peak_tflops:.3f}") if step.peak and peak_tflops else ()
        result = driver.run_step(step, extra)
        if step.name == "matmul" and result:
            peak_tflops = (result.get("peak_matmul") or {}).get("tflops")
    driver.say(f"done in {time.monotonic() - driver.start:.0f} s; results in {args.out}")
    print((Path(args.out) / "results.md").read_text())


if __name__ == "__main__":
    main()
