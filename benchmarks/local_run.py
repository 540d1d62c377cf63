"""How long `draslice run` takes after set-up: the main job, end to end, as a user runs it.

Target (issue 3): <= 90 s on 2 CPU cores. Runs the real command in a subprocess (fresh
interpreter each time, as a user would) and prints the wall time of each repeat, plus the
median, and the time spent per pipeline task as kfp.local logged it.

    python benchmarks/local_run.py [--repeats 3] [-- extra draslice run args]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime


def task_seconds(log: str) -> dict[str, float]:
    """Per-task durations from kfp.local's 'Executing task' / 'finished' timestamps."""
    stamp = r"(\d\d:\d\d:\d\d\.\d+) - \w+ - "
    starts = {m[1]: m[0] for m in re.findall(stamp + r"Executing task \S*'(\w+)'", log)}
    ends = {m[1]: m[0] for m in re.findall(stamp + r"Task \S*'(\w+)'\S* finished", log)}
    parse = lambda s: datetime.strptime(s, "%H:%M:%S.%f")  # noqa: E731
    return {t: (parse(ends[t]) - parse(starts[t])).total_seconds() for t in starts if t in ends}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("extra", nargs="*", help="extra arguments for draslice run")
    args = parser.parse_args()
    draslice = shutil.which("draslice") or os.path.join(os.path.dirname(sys.executable),
                                                        "draslice")
    print(f"cores: {os.cpu_count()}  python: {sys.version.split()[0]}")
    walls = []
    with tempfile.TemporaryDirectory() as runs:
        for i in range(args.repeats):
            start = time.perf_counter()
            done = subprocess.run([draslice, "run", "--runs-dir", runs, *args.extra],
                                  capture_output=True, text=True)
            wall = time.perf_counter() - start
            walls.append(wall)
            verdict = "PASS" if "verdict: PASS" in done.stdout else "FAIL"
            tasks = ", ".join(f"{t} {s:.1f}s" for t, s in task_seconds(done.stdout + done.stderr)
                              .items())
            print(f"repeat {i + 1}: {wall:.1f} s  exit {done.returncode}  {verdict}  [{tasks}]")
            if done.returncode:
                print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
                sys.exit(1)
    print(f"draslice run: median {statistics.median(walls):.1f} s over {len(walls)} "
          f"(target <= 90 s on 2 cores)")


if __name__ == "__main__":
    main()
