"""How fast the command line answers when no work is asked for: every ``--help`` and one bad
input per command.

Target (issue 14): each under 0.5 s of CPU, in a fresh process (``python -m draslice``, the
interpreter's own start included). A user who mistypes an option should hear so at once, not
after torch, kfp or the Kubernetes client have loaded. Each case runs as a child process in an
empty folder; its CPU time is the children's ``getrusage`` delta (user + system), so the
figure holds on a loaded machine where wall time does not (the load average is printed).

Every case must also end as expected: ``--help`` with 0, a bad input with 2 (a case that
crashed early would otherwise look fast). Exits 1 when a case misses its exit code or the
target, 0 otherwise.

    python benchmarks/startup.py [--repeats 3] [--target-s 0.5] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

TARGET_S = 0.5

# One bad input per top-level command, rejected before any work: the option's own check (or
# click's), with --json where the command has it (the JSON error object is then part of the
# path measured). Every command must have one; main() refuses to run otherwise.
BAD_INPUT: dict[str, tuple[str, ...]] = {
    "advise": ("advise", "--peak-gib", "nan", "--json"),
    "compile": ("compile", "--template", "Bad_Name"),
    "manifests": ("manifests", "kueue", "--mig-slices", "-3"),
    "preflight": ("preflight", "--profile", "10gb", "--json"),
    "run": ("run", "--lora-r", "0"),
    "schedule": ("schedule", "create", "--every", "bogus"),
    "smoke": ("smoke", "--device", "tpu", "--json"),
    "submit": ("submit", "--pipeline-id", "X"),
    "train": ("train", "--output-dir", "out", "--lora-r", "0", "--json"),
    "upload": ("upload", "--all", "--name", "x"),
}

# Bad files, which need the file system rather than the option's own check: a model folder
# that does not exist, and a data file with a broken line next to a good model folder (a tiny
# one, written by draslice.tests.scratch as the tests write it). ``{dir}`` is the cases' folder.
BAD_FILES: tuple[tuple[str, ...], ...] = (
    ("train", "--output-dir", "out", "--model-dir", "{dir}/no-such-model", "--data",
     "{dir}/bad.jsonl"),
    ("train", "--output-dir", "out", "--model-dir", "{dir}/tiny-gpt2", "--data",
     "{dir}/bad.jsonl"),
    ("advise", "--model-dir", "{dir}/tiny-gpt2", "--data", "{dir}/bad.jsonl", "--json"),
)


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    exit_code: int  # what the command must end with

    @property
    def label(self) -> str:
        return "draslice " + " ".join(self.args)

    @property
    def needs_files(self) -> bool:
        return any("{dir}" in a for a in self.args)

    def argv(self, folder: str) -> list[str]:
        """The arguments with ``{dir}`` replaced by the folder :func:`write_files` filled."""
        return [a.replace("{dir}", folder) for a in self.args]


def command_paths() -> list[tuple[str, ...]]:
    """Every command and subcommand, as the CLI lists them (loads the command modules here,
    in this process, never in the measured children)."""
    import click

    from draslice.cli import main

    def walk(group: click.Group, prefix: tuple[str, ...]):
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            yield (*prefix, name)
            if isinstance(cmd, click.Group):
                yield from walk(cmd, (*prefix, name))

    return list(walk(main, ()))


def cases() -> list[Case]:
    """``--help`` of the root and of every (sub)command, then the bad inputs."""
    paths = command_paths()
    missing = sorted({p[0] for p in paths} - set(BAD_INPUT))
    if missing:
        raise SystemExit(f"no bad-input case for: {', '.join(missing)} (add one to BAD_INPUT)")
    return ([Case((*p, "--help"), 0) for p in [(), *paths]]
            + [Case(args, 2) for args in BAD_INPUT.values()]
            + [Case(args, 2) for args in BAD_FILES])


def write_files(folder: str) -> None:
    """What BAD_FILES names: a tiny model folder and a JSONL whose second line is cut short."""
    from draslice.tests.scratch import save_preset

    save_preset("tiny-gpt2", f"{folder}/tiny-gpt2")
    with open(f"{folder}/bad.jsonl", "w", encoding="utf-8") as out:
        out.write('{"prompt": "a b", "completion": " c"}\n{"prompt": "d e", "comp\n')


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(case: Case, cwd: str) -> tuple[float, float, int, str]:
    """One fresh ``python -m draslice`` run: (CPU s, wall s, exit code, last stderr line)."""
    cpu, wall = children_cpu_s(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "draslice", *case.argv(cwd)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    cpu, wall = children_cpu_s() - cpu, time.perf_counter() - wall
    lines = done.stderr.strip().splitlines()
    return cpu, wall, done.returncode, lines[-1] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="Runs per case; the best CPU time counts (the least disturbed).")
    parser.add_argument("--target-s", type=float, default=TARGET_S)
    parser.add_argument("--only", default="", help="Run only cases whose command has this.")
    args = parser.parse_args()

    selected = [c for c in cases() if args.only in c.label]
    width = max(len(c.label) for c in selected)
    print(f"startup: CPU seconds per fresh `python -m draslice` (best of {args.repeats}); "
          f"target {args.target_s:.2f} s; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"{'case':<{width}}  {'exit':>4}  {'CPU s':>6}  {'ratio':>5}  {'wall s':>6}")
    failures = []
    with tempfile.TemporaryDirectory(prefix="draslice-startup-") as cwd:
        if any(c.needs_files for c in selected):
            write_files(cwd)
        for case in selected:
            runs = [measure(case, cwd) for _ in range(args.repeats)]
            cpu, wall, code, last = min(runs)
            ratio = cpu / args.target_s
            verdict = ""
            if any(r[2] != case.exit_code for r in runs):
                verdict = f"  exit {code}, expected {case.exit_code}: {last}"
            elif cpu > args.target_s:
                verdict = "  over target"
            if verdict:
                failures.append(case.label)
            print(f"{case.label:<{width}}  {code:>4}  {cpu:6.3f}  {ratio:5.2f}  {wall:6.2f}"
                  f"{verdict}")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if failures:
        print(f"{len(failures)} of {len(selected)} cases missed: {', '.join(failures)}")
        return 1
    print(f"all {len(selected)} cases under {args.target_s:.2f} s of CPU with the expected exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
