"""The last step of a sweep: one table and one figure over its runs, and which run is best.

Inputs come in iteration order (``dsl.Collected``: kfp.local and the KFP driver both collect a
``ParallelFor``'s outputs by iteration index), beside the planned runs in the same order. Each
adapter's run file records the config it trained with, so a list out of step with the plan is
caught here, not reported under the wrong name.

The best run is the one with the lowest eval loss among those whose verdict passed (the lowest
final training loss when some run had no eval split); when none passed, the lowest among all,
and ``passed`` is false so the pipeline's gate fails the run after the report is published.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path

from draslice.errors import DrasliceError
from draslice.sweep.plan import NAME, typed

# What the table shows of each run's result (run file), with its heading and format.
FIGURES = (("eval_loss", "eval loss", "{:.4f}"), ("final_loss", "train loss", "{:.4f}"),
           ("loss_drop", "loss drop", "{:.1%}"), ("tokens_per_s", "tokens/s", "{:,.0f}"),
           ("peak_mem_gib", "peak GiB", "{:.2f}"))
# Knobs that identify a run in its run file (the fine-tune may rewrite paths under the mount).
IDENTITY = ("learning_rate", "lora_r", "lora_alpha", "seed", "steps", "batch_size")


@dataclass
class Run:
    name: str
    knobs: dict
    result: dict
    passed: bool
    verdict: str
    adapter_dir: Path
    eval_curve: list[tuple[int, float]]
    loss_curve: list[tuple[int, float]]

    def figure(self, key: str) -> float | None:
        value = self.result.get(key)
        return None if value is None else float(value)


def read_runs(planned: list[dict], adapter_dirs: list[str], train_logs: list[str],
              passed: list[bool], verdicts: list[str]) -> list[Run]:
    """The runs, each checked against the plan it came from."""
    from draslice.trainer.outputs import read_record

    counts = {len(planned), len(adapter_dirs), len(train_logs), len(passed), len(verdicts)}
    if len(counts) != 1:
        raise DrasliceError(f"sweep outputs do not line up: {len(planned)} planned runs, "
                            f"{len(adapter_dirs)} adapters, {len(train_logs)} train logs, "
                            f"{len(passed)} verdicts")
    runs = []
    for plan, adapter, log, ok, verdict in zip(planned, adapter_dirs, train_logs, passed,
                                               verdicts, strict=True):
        record, problem = read_record(Path(adapter))
        if record is None:
            raise DrasliceError(f"run {plan[NAME]}: {problem}")
        trained = {k: record["config"].get(k) for k in IDENTITY}
        expected = {k: plan[k] for k in IDENTITY}
        if trained != expected:
            raise DrasliceError(f"run {plan[NAME]}: its adapter was trained with {trained}, the "
                                f"plan says {expected}: collected outputs out of order")
        loss, evals = _curves(Path(log))
        runs.append(Run(plan[NAME], {k: typed(k, v) for k, v in plan.items() if k != NAME},
                        record["result"], bool(ok), verdict, Path(adapter), evals, loss))
    return runs


def _curves(path: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, training loss) and (step, eval loss) from a run's JSON-lines metrics."""
    loss, evals = [], []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            loss.append((record["step"], record["loss"]))
            if record.get("eval_loss") is not None:
                evals.append((record["step"], record["eval_loss"]))
    return loss, evals


def ranking_key(runs: list[Run]) -> str:
    """``eval_loss`` when every run measured one, else ``final_loss``."""
    return "eval_loss" if all(r.figure("eval_loss") is not None for r in runs) else "final_loss"


def best_run(runs: list[Run]) -> tuple[Run, bool]:
    """(the best run, whether it passed): lowest ranking figure, passed runs first."""
    key = ranking_key(runs)
    pool = [r for r in runs if r.passed] or runs

    def score(run: Run) -> float:
        value = run.figure(key)
        return value if value is not None and math.isfinite(value) else math.inf

    best = min(pool, key=score)
    return best, best.passed


def varied_knobs(runs: list[Run]) -> list[str]:
    """The knobs whose values differ between runs, in declaration order (trainer/config.py;
    a run's mapping comes back from KFP with its keys sorted): the table's columns."""
    from draslice.trainer.config import KNOBS

    first = runs[0].knobs
    order = {k: i for i, k in enumerate(KNOBS)}
    return sorted((k for k in first if any(r.knobs[k] != first[k] for r in runs[1:])),
                  key=lambda k: (order.get(k, len(order)), k))


def _cell(run: Run, key: str, fmt: str) -> str:
    value = run.figure(key)
    return "—" if value is None else fmt.format(value)


def table_rows(runs: list[Run], best: Run) -> tuple[list[str], list[list[str]]]:
    knobs = varied_knobs(runs)
    header = ["run", *knobs, *(h for _, h, _ in FIGURES), "verdict"]
    rows = [[("★ " if r is best else "") + r.name, *(str(r.knobs[k]) for k in knobs),
             *(_cell(r, key, fmt) for key, _, fmt in FIGURES),
             "PASS" if r.passed else "FAIL"] for r in runs]
    return header, rows


def headline(runs: list[Run], best: Run, passed: bool) -> str:
    key = ranking_key(runs).replace("_", " ")
    if passed:
        return (f"best of {len(runs)} runs: {best.name} (lowest {key} among the runs that "
                f"passed: {_cell(best, ranking_key(runs), '{:.4f}')})")
    return (f"no run of {len(runs)} passed its verdict; lowest {key}: {best.name} "
            f"({_cell(best, ranking_key(runs), '{:.4f}')})")


def render_markdown(runs: list[Run], best: Run, passed: bool) -> str:
    header, rows = table_rows(runs, best)
    lines = [f"# draslice sweep: {headline(runs, best, passed)}", "",
             "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", "Verdicts:", ""]
    lines += [f"- {r.name}: " + "; ".join(line.strip(" -") for line in r.verdict.splitlines())
              for r in runs]
    return "\n".join(lines) + "\n"


def figure(runs: list[Run], best: Run) -> str:
    """Eval loss (or training loss) over steps per run, and each run's tokens/s: a PNG URI."""
    from draslice.trainer.tasks.report import figure_png, plt

    use_eval = ranking_key(runs) == "eval_loss"
    fig, (curves, speed) = plt.subplots(1, 2, figsize=(11, 3.6))
    for run in runs:
        points = run.eval_curve if use_eval else run.loss_curve
        curves.plot([s for s, _ in points], [v for _, v in points], marker="o", markersize=3,
                    linewidth=2.5 if run is best else 1.2, label=run.name)
    curves.set_xlabel("step")
    curves.set_ylabel("eval loss" if use_eval else "training loss")
    curves.set_title("Eval loss" if use_eval else "Training loss (no eval split)")
    curves.grid(alpha=0.3)
    curves.legend(fontsize=8)
    names = [r.name for r in runs]
    speed.bar(names, [r.figure("tokens_per_s") or 0.0 for r in runs],
              color=["#2ca02c" if r is best else "#1f77b4" for r in runs])
    speed.set_ylabel("tokens/s")
    speed.set_title("Training throughput")
    speed.tick_params(axis="x", labelrotation=30)
    return figure_png(fig)


def render_html(runs: list[Run], best: Run, passed: bool) -> str:
    header, rows = table_rows(runs, best)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return (
        "<html><head><meta charset='utf-8'><style>body{font-family:sans-serif}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}</style></head><body>"
        f"<h2>draslice sweep</h2><p>{html.escape(headline(runs, best, passed))}</p>"
        f"<table><tr>{head}</tr>{body}</table>"
        f"<p><img alt='eval loss and tokens/s per run' src='{figure(runs, best)}'></p>"
        "</body></html>\n"
    )
