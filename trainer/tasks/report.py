"""What the KFP UI shows for a run: an HTML report and a Markdown summary.

The HTML embeds matplotlib figures as PNG data URIs (the KFP UI renders HTML artifacts in
a sandboxed iframe, so nothing may be fetched from elsewhere; the same file opens from disk as
``report.html`` of a ``draslice run``): the training and eval loss over steps, tokens/s over
steps, and the peak memory against the slice's memory and budget; then the smoke's TFLOP/s,
the device and the claim. One builder for both the KFP UI and the local run.
"""

from __future__ import annotations

import base64
import html
import io

import matplotlib

matplotlib.use("Agg")  # no display in a task pod
import matplotlib.pyplot as plt  # noqa: E402

from draslice.trainer.measure import speed_of  # noqa: E402
from draslice.trainer.tasks.validate import Verdict, memory_compared  # noqa: E402


def figure_png(fig) -> str:
    """The figure as a PNG data URI (what the KFP UI shows inline), the figure closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def loss_figure(records: list[dict]) -> str:
    """Training loss per step, and the eval loss at the steps that measured it."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], marker="o",
            markersize=3, label="training loss")
    evals = [r for r in records if r.get("eval_loss") is not None]
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], marker="s",
                markersize=4, label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Loss")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return figure_png(fig)


def throughput_figure(records: list[dict], steady_from: int | None = None) -> str:
    """Tokens/s per step, each step's tokens over its own measured seconds; the warm-up steps
    (before ``steady_from``) shaded."""
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.plot([r["step"] for r in records], [r["tokens_per_s"] for r in records], marker="o",
            markersize=3, color="#2ca02c")
    if steady_from is not None and records and steady_from > records[0]["step"]:
        ax.axvspan(records[0]["step"] - 0.5, steady_from - 0.5, color="#999999", alpha=0.2,
                   label="warm-up")
        ax.legend(fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput")
    ax.grid(alpha=0.3)
    return figure_png(fig)


def memory_figure(peak_gib: float, slice_gib: float, budget_gib: float, label: str) -> str:
    fig, ax = plt.subplots(figsize=(6, 1.8))
    ax.barh([0], [slice_gib], color="#dddddd", label=f"{label} {slice_gib:.2f} GiB")
    ax.barh([0], [peak_gib], color="#1f77b4" if peak_gib <= budget_gib else "#d62728",
            height=0.5, label=f"peak {peak_gib:.2f} GiB")
    ax.axvline(budget_gib, color="black", linestyle="--", label=f"budget {budget_gib:.2f} GiB")
    ax.set_yticks([])
    ax.set_xlabel("GiB")
    ax.set_title(f"Peak memory against the {label}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, fontsize=8, frameon=False)
    return figure_png(fig)


def _table(rows: dict) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in rows.items()
    )
    return f"<table>{cells}</table>"


def speed_rows(found: dict | None) -> dict:
    """The run's speed (``measure.speed_of``) as the report's table: the steady rate, the
    warm-up and the whole wall time, each on its own row."""
    if found is None:
        return {"steady tokens/s": "not recorded by this fine-tune (an older draslice)"}
    steady = found["steady_from_step"]
    return {
        "steady tokens/s": (f"{found['steady_tokens_per_s']:,.0f} from step {steady}"
                            if steady is not None else
                            f"{found['steady_tokens_per_s']:,.0f} over every step (no step "
                            "after the warm-up)"),
        "warm-up": f"{found['warmup_seconds']:.1f} s (compilation, graph capture, first calls)",
        "wall time": f"{found['wall_seconds']:.1f} s (load, warm-up, steps, evaluation, "
                     "checkpoints)",
    }


def render_html(verdict: Verdict, records: list[dict], device: dict, claim: dict,
                smoke: dict | None = None) -> str:
    """The report: ``records`` are the fine-tune's per-step metrics, ``smoke`` the smoke
    task's figures (``tflops``) when it ran, ``claim`` the template and mode."""
    f = verdict.figures
    status = "PASS" if verdict.passed else "FAIL"
    status_class = "ok" if verdict.passed else "bad"
    checks = "".join(
        f"<li class='{'ok' if c.passed else 'bad'}'><b>{html.escape(c.name)}</b>: "
        f"{html.escape(c.detail)}</li>"
        for c in verdict.checks
    )
    label, _ = memory_compared(device, claim.get("template", ""))
    mem = memory_figure(f["peak_mem_gib"], f["slice_total_mem_gib"], f["memory_budget_gib"],
                        label)
    run_speed = speed_of(records)
    throughput = (f'<img alt="tokens per second over steps" '
                  f'src="{throughput_figure(records, (run_speed or {}).get("steady_from_step"))}">'
                  if all("tokens_per_s" in r for r in records) else
                  "<p>not recorded by this fine-tune</p>")
    throughput = _table(speed_rows(run_speed)) + throughput
    smoke_rows = ({"matmul TFLOP/s": f"{smoke['tflops']:.2f}"} if smoke and smoke.get("tflops")
                  else {"matmul TFLOP/s": "not measured (the smoke task did not report it)"})
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>draslice run report</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
.ok {{ color: #1a7f37; }} .bad {{ color: #cf222e; }}
table {{ border-collapse: collapse; }} th, td {{ border: 1px solid #ccc; padding: 2px 8px; }}
th {{ text-align: left; background: #f6f8fa; }}
</style></head><body>
<h1>draslice: LoRA SFT on a GPU slice —
<span class="{status_class}">{status}</span></h1>
<ul>{checks}</ul>
<h2>Loss</h2><img alt="training and eval loss over steps" src="{loss_figure(records)}">
<h2>Tokens/s</h2>{throughput}
<h2>Memory</h2><img alt="peak memory against slice memory" src="{mem}">
<h2>Smoke</h2>{_table(smoke_rows)}
<h2>Claim</h2>{_table(claim)}
<h2>Device</h2>{_table({k: v for k, v in device.items() if k != "nvidia_smi"})}
<pre>{html.escape(device.get("nvidia_smi") or "nvidia-smi: not present")}</pre>
</body></html>
"""


def render_markdown(verdict: Verdict, device: dict, claim: dict) -> str:
    f = verdict.figures
    lines = [
        f"# draslice verdict: {'PASS' if verdict.passed else 'FAIL'}",
        "",
        *(f"- {'✅' if c.passed else '❌'} **{c.name}**: {c.detail}" for c in verdict.checks),
        "",
        "| fact | value |",
        "| --- | --- |",
        f"| device | {device.get('name')} |",
        f"| {memory_compared(device, claim.get('template', ''))[0]} | "
        f"{f['slice_total_mem_gib']:.2f} GiB |",
        f"| peak memory | {f['peak_mem_gib']:.2f} GiB |",
        f"| loss | {f['initial_loss']:.3f} → {f['final_loss']:.3f} ({f['loss_drop']:.1%}) |",
        *(f"| {k} | {v} |" for k, v in claim.items()),
        "",
    ]
    return "\n".join(lines)
