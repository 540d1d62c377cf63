"""Every GPU benchmark of issue 6 in one call, inside a hard time budget.

    PYTHONPATH=<draslice installed> python benchmarks/remote/gpu_all.py --out $OUT \\
        [--wheels DIR ...] [--smoke] [--budget-s 470]

Steps, each in its own process with its own timeout, in this order: (wheels: layer the
carried benchmark wheels over this Python), environment facts, the checked bf16 matmul peak,
compare_trainers on the seed config, on the GPT-2-124M shape, fit_slice 1.5B in 1g.6gb,
fit_slice 7B QLoRA in 2g.12gb. After every step ``$OUT/summary.json`` is rewritten (atomically)
and ``$OUT/results.md`` regenerated, so a run cut short still leaves every finished figure;
``$OUT/gpu_all.log`` has every child's output. A step that would not fit in the time left is
skipped with a line saying so; a step that overruns its timeout is killed (its whole process
group) and reported. The driver itself never touches CUDA.

``--smoke`` runs the same steps on the CPU with tiny shapes (what CI runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

# The benchmark scripts live one folder up; this folder holds only the remote-host plumbing.
HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from childproc import ChildOutcome, kill_children_on_term, run_child, write_json  # noqa: E402

DEFAULT_BUDGET_S = 470.0
MARGIN_S = 5.0  # kept back from every timeout so the driver can write its files


@dataclass(frozen=True)
class Step:
    name: str
    script: str
    args: tuple[str, ...]
    cap_s: float  # the most this step may take
    min_s: float  # below this much time left it is skipped, not started
    child_budget: bool = True  # pass --budget-s so the child skips its own parts in time


# Which trainers each comparison runs on the GPU, to fit one 600 s call: every compiled
# variant costs about a minute of compilation on GPT-2-124M, so there the compiled Trainer is
# left out (compare_trainers.py --config gpt2-124m --trainers hf-compiled measures it alone).
SEED_TRAINERS = "ours,ours-cudagraphs,hf,hf-compiled,trl"
GPT2_TRAINERS = "ours,ours-compiled,ours-cudagraphs,hf,trl"


def _trainers(smoke: bool, names: str) -> tuple[str, ...]:
    return () if smoke else ("--trainers", names)


def steps(smoke: bool) -> list[Step]:
    s = ("--smoke",) if smoke else ()
    return [
        Step("env", "envfacts.py", (), 60, 5, child_budget=False),
        Step("matmul", "compare_trainers.py", ("--peak-only", *s), 90, 10, child_budget=False),
        Step("compare_seed", "compare_trainers.py",
             ("--config", "seed", *s, *_trainers(smoke, SEED_TRAINERS)), 240, 40),
        Step("compare_gpt2_124m", "compare_trainers.py",
             ("--config", "gpt2-124m", *s, *_trainers(smoke, GPT2_TRAINERS)), 300, 40),
        Step("fit_1.5b", "fit_slice.py", ("--case", "1.5b", *s), 150, 45),
        # fit_slice's own estimate for the 7B case (build ~13.5 GB, load it 4-bit, train).
        Step("fit_7b", "fit_slice.py", ("--case", "7b", *s), 400, 160 if not smoke else 10),
    ]


class Driver:
    def __init__(self, out: Path, budget_s: float, smoke: bool) -> None:
        self.out = out
        self.smoke = smoke
        self.start = time.monotonic()
        self.deadline = self.start + budget_s
        self.python = sys.executable
        self.env = dict(os.environ)
        out.mkdir(parents=True, exist_ok=True)
        self.log: TextIO = (out / "gpu_all.log").open("a", buffering=1)
        self.summary: dict = {
            "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "smoke": smoke, "budget_s": budget_s, "argv": sys.argv, "steps": {},
        }

    def say(self, line: str) -> None:
        stamp = f"[gpu_all +{time.monotonic() - self.start:5.0f}s] "
        for sink in (sys.stdout, self.log):
            sink.write(stamp + line + "\n")
            sink.flush()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.summary["elapsed_s"] = round(time.monotonic() - self.start, 1)
        write_json(self.out / "summary.json", self.summary)
        (self.out / "results.md").write_text(results_markdown(self.summary))

    def record(self, name: str, status: str, seconds: float, **extra) -> None:
        self.summary["steps"][name] = {"status": status, "seconds": round(seconds, 1), **extra}
        self.say(f"step {name}: {status} ({seconds:.0f} s; {self.left():.0f} s left)")
        self.save()

    def run_step(self, step: Step, extra: tuple[str, ...] = ()) -> dict | None:
        left = self.left() - MARGIN_S
        if left < step.min_s:
            self.record(step.name, "SKIPPED", 0.0,
                        why=f"{left:.0f} s left, the step needs at least {step.min_s:.0f} s")
            return None
        timeout = min(step.cap_s, left)
        result_path = self.out / "steps" / f"{step.name}.json"
        argv = [self.python, str(HERE / step.script), *step.args, *extra,
                "--json-out", str(result_path)]
        if step.child_budget:
            argv += ["--budget-s", f"{max(timeout - 10, 1):.0f}"]
        self.say(f"step {step.name}: {' '.join(argv[1:])} (timeout {timeout:.0f} s)")
        outcome: ChildOutcome = run_child(argv, result_path, timeout, log=self.log,
                                          prefix=f"[{step.name}] ", env=self.env)
        status = "OK" if outcome.ok else ("TIMEOUT" if outcome.timed_out else "ERROR")
        extra_fields = {} if outcome.ok else {"returncode": outcome.returncode,
                                               "tail": outcome.tail[-3000:]}
        self.record(step.name, status, outcome.seconds, result=outcome.result, **extra_fields)
        return outcome.result

    def layer_wheels(self, wheel_dirs: list[str]) -> None:
        """Install the carried wheels this Python lacks into a venv layered over it."""
        start = time.monotonic()
        status, notes = layer_wheels(wheel_dirs, self.say, min(120.0, self.left() - 60))
        if status.python:
            check = subprocess.run(
                [status.python, "-c", "import torch, transformers, peft, draslice.trainer.sft"],
                capture_output=True, text=True, timeout=120, env=self.env,
                # Not from the checkout: its draslice/ folder (the CLI half of the package
                # mapping) would shadow the installed package that has the trainer.
                cwd=tempfile.gettempdir())
            if check.returncode == 0:
                self.python = status.python
            else:  # the layer must only add packages; if it broke one, run without it
                notes.append("the layered Python cannot import the host's stack, not used: "
                             + (check.stderr.strip().splitlines() or ["?"])[-1])
        self.record("wheels", "OK" if status.ok else "ERROR", time.monotonic() - start,
                    result={"python": self.python, "ready": status.ready,
                            "notes": notes})


@dataclass
class LayerStatus:
    ok: bool
    python: str | None
    ready: list[str]  # the packages importable through the layer (carried or the host's)


def host_site_dirs() -> list[str]:
    return [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))
            and Path(p).is_dir()]


BENCH_PACKAGES = (("trl", "datasets"), ("bitsandbytes",))
LAYER_VENV = Path(tempfile.gettempdir()) / "draslice-bench-venv"


def layer_wheels(wheel_dirs: list[str], say: Callable[[str], None], timeout_s: float,
                 groups: tuple[tuple[str, ...], ...] = BENCH_PACKAGES,
                 venv: Path = LAYER_VENV) -> tuple[LayerStatus, list[str]]:
    """A venv whose ``.pth`` puts this interpreter's site-packages behind its own, so pip's
    resolver sees what the host has (torch, transformers, peft, ...) and installs only what is
    missing from the carried wheels (``--no-index``: nothing is downloaded)."""
    notes: list[str] = []
    dirs = [d for d in wheel_dirs if Path(d).is_dir()]
    if not dirs:
        return LayerStatus(False, None, []), [f"no wheel folder among {wheel_dirs}"]
    deadline = time.monotonic() + max(timeout_s, 10)
    try:
        # Without its own pip (ensurepip would also bring an old setuptools on <= 3.11 that
        # shadows the host's): the host's pip installs into it with --python.
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                           check=True, capture_output=True, text=True, timeout=60)
        py = str(venv / "bin" / "python")
        purelib = subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True, timeout=30).stdout.strip()
        # addsitedir, not bare paths: the host's own .pth files (editable installs, path
        # hooks) must work in the layer too.
        (Path(purelib) / "zz-host-site.pth").write_text("".join(
            f"import site; site.addsitedir({d!r})\n" for d in host_site_dirs()))
    except (OSError, subprocess.SubprocessError) as err:
        return LayerStatus(False, None, []), [f"could not make the layered venv: {err}"]
    links = [arg for d in dirs for arg in ("--find-links", d)]
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "--no-index",
           "--disable-pip-version-check", "--no-input"]
    ready: list[str] = []
    # One pip call per top-level package: a bitsandbytes wheel that does not fit must not
    # keep trl out.
    for group in map(list, groups):
        if not any(_wheels(dirs, name) for name in group):
            notes.append(f"{'/'.join(group)}: no wheel carried")
            continue
        ok, tail = _pip(pip + links + group, deadline, say)
        if not ok:
            # The resolver also checks what the host has (an old setuptools shadowing a newer
            # one can fail it); fall back to the carried wheels of distributions missing here.
            missing = _missing_wheels(py, dirs)
            notes.append(f"{'/'.join(group)}: resolver failed ({tail}); installing the "
                         f"missing wheels without it: {[w.name for w in missing]}")
            # Nothing missing: every carried distribution is here already.
            ok = not missing or _pip(pip + ["--no-deps"] + [str(w) for w in missing],
                                     deadline, say)[0]
        if ok:
            ready += group
    return LayerStatus(bool(ready), py, ready), notes


def _pip(cmd: list[str], deadline: float, say: Callable[[str], None]) -> tuple[bool, str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=max(deadline - time.monotonic(), 5))
    except subprocess.TimeoutExpired:
        return False, "pip timed out"
    tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-2:])
    say(f"pip {' '.join(cmd[cmd.index('install'):])[:200]}: exit {done.returncode}: {tail}")
    return done.returncode == 0, tail


def _dist_name(wheel: Path) -> str:
    return wheel.name.split("-", 1)[0].replace("_", "-").lower()


def _wheels(dirs: list[str], name: str | None = None) -> list[Path]:
    found = sorted(p for d in dirs for p in Path(d).glob("*.whl"))
    return [w for w in found if name is None or _dist_name(w) == name.lower()]


def _missing_wheels(py: str, dirs: list[str]) -> list[Path]:
    """The carried wheels whose distribution the layered interpreter does not have at all."""
    wheels = _wheels(dirs)
    code = ("import sys, importlib.metadata as m\n"
            "for n in sys.argv[1:]:\n"
            "    try: m.version(n)\n"
            "    except m.PackageNotFoundError: print(n)\n")
    done = subprocess.run([py, "-c", code, *(_dist_name(w) for w in wheels)],
                          capture_output=True, text=True, timeout=60)
    missing = set(done.stdout.split())
    return [w for w in wheels if _dist_name(w) in missing and _dist_name(w) != "draslice"]


# ----------------------------------------------------------------------------------------
# The results table, in docs/benchmarks.md's shape, from whatever finished.


def _f(x, spec: str = ".2f") -> str:
    return "" if x is None else format(x, spec)


def _verdict(passed: bool | None) -> str:
    return {True: "PASS", False: "FAIL"}.get(passed, "not judged")


def results_markdown(summary: dict) -> str:
    steps_ = summary["steps"]
    label = " (CPU --smoke: plumbing only, not benchmark figures)" if summary["smoke"] else ""
    lines = [f"# gpu_all results{label}", "",
             f"started {summary['started_utc']}, {summary.get('elapsed_s', 0):.0f} s", ""]
    env = (steps_.get("env") or {}).get("result") or {}
    if env:
        gpu, pk = env.get("gpu", {}), env.get("packages", {})
        lines += [f"GPU: {gpu.get('name', 'none')} ({gpu.get('nvidia_smi')}), "
                  f"torch {pk.get('torch')} (CUDA {gpu.get('torch_cuda')}), transformers "
                  f"{pk.get('transformers')}, peft {pk.get('peft')}, trl {pk.get('trl')}, "
                  f"bitsandbytes {pk.get('bitsandbytes')}, accelerate {pk.get('accelerate')}",
                  ""]
    peak = ((steps_.get("matmul") or {}).get("result") or {}).get("peak_matmul") or {}
    if peak:
        lines += [f"Matmul peak (checked, {peak.get('dtype')} {peak.get('size')}^3): "
                  f"{_f(peak.get('tflops'), '.4g')} TFLOP/s", ""]
    lines += ["| config | trainer | tokens/s | peak reserved GiB | MFU (LoRA FLOPs) | "
              "MFU (6N) |", "|---|---|---|---|---|---|"]
    targets: list[str] = []
    for key in ("compare_seed", "compare_gpt2_124m"):
        res = (steps_.get(key) or {}).get("result") or {}
        for name, comp in (res.get("comparisons") or {}).items():
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
    lines += ["", *targets, "", "| fit case | profile (cap) | status | peak reserved GiB | "
              "device peak GiB | tokens/s |", "|---|---|---|---|---|---|"]
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
            lines.append(f"| {key} | | {step['status']} {step.get('why', '')} | | | |")
    lines += ["", "Steps: " + ", ".join(f"{k} {v['status']} {v['seconds']:.0f}s"
                                        for k, v in steps_.items()), ""]
    return "\n".join(lines)


def check_draslice_importable() -> str | None:
    if importlib.util.find_spec("draslice") is None:
        return ("draslice is not importable: install its wheel (pip install --no-deps --target "
                "DIR dist/draslice-*.whl) and set PYTHONPATH=DIR")
    try:
        if importlib.util.find_spec("draslice.trainer") is None:
            return "draslice.trainer is missing: PYTHONPATH must name an installed draslice"
    except ModuleNotFoundError as err:
        return f"draslice is broken here: {err}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Run every issue-6 GPU benchmark (env facts, matmul peak, trainer "
        "comparison on two configs, slice fit for 1.5B and 7B) within a time budget; write "
        "OUT/summary.json, OUT/results.md and OUT/gpu_all.log as it goes.",
    )
    parser.add_argument("--out", required=True, help="results folder (e.g. $OUT)")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, tiny shapes, a few steps: the same code paths")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="wall-clock seconds for everything (default 470: a 600 s call "
                        "with room for start-up and copying results back)")
    parser.add_argument("--wheels", action="append", default=[],
                        help="folder of carried wheels (repeatable): trl, datasets and "
                        "bitsandbytes missing here are installed from them into a venv "
                        "layered over this Python; nothing is downloaded")
    parser.add_argument("--only", action="append", default=[], metavar="STEP",
                        choices=[s.name for s in steps(smoke=False)],
                        help="run only this step (repeatable): %(choices)s")
    args = parser.parse_args()

    problem = check_draslice_importable()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    kill_children_on_term()
    driver = Driver(Path(args.out), args.budget_s, args.smoke)
    driver.say(f"budget {args.budget_s:.0f} s, smoke={args.smoke}, python {sys.executable}")
    if args.wheels:
        driver.layer_wheels(args.wheels)
    peak_tflops: float | None = None
    for step in steps(args.smoke):
        if args.only and step.name not in args.only:
            continue
        extra: tuple[str, ...] = ()
        if step.name.startswith("compare") and peak_tflops:
            extra = ("--peak-tflops", f"{peak_tflops:.3f}")
        result = driver.run_step(step, extra)
        if step.name == "matmul" and result:
            peak_tflops = (result.get("peak_matmul") or {}).get("tflops")
    driver.say(f"done in {time.monotonic() - driver.start:.0f} s; results in {args.out}")
    print((Path(args.out) / "results.md").read_text())


if __name__ == "__main__":
    main()
