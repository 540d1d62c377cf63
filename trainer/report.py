"""What the KFP UI shows for a run: an HTML report and a Markdown summary.

The HTML embeds two matplotlib figures as PNG data URIs (the KFP UI renders HTML artifacts in
a sandboxed iframe, so nothing may be fetched from elsewhere): the loss curve, and the peak
memory against the slice's memory and budget.
"""

from __future__ import annotations

import base64
import html
import io

import matplotlib

matplotlib.use("Agg")  # no display in a task pod
import matplotlib.pyplot as plt  # noqa: E402

from draslice.trainer.validate import Verdict  # noqa: E402


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def loss_figure(losses: list[float]) -> str:
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(range(1, len(losses) + 1), losses, marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("Loss")
    ax.grid(alpha=0.3)
    return _png(fig)


def memory_figure(peak_gib: float, slice_gib: float, budget_gib: float, label: str) -> str:
    fig, ax = plt.subplots(figsize=(6, 1.8))
    ax.barh([0], [slice_gib], color="#dddddd", label=f"{label} {slice_gib:.2f} GiB")
    ax.barh([0], [peak_gib], color="#1f77b4" if peak_gib <= budget_gib else "#d62728",
            height=0.5, label=f"peak {peak_gib:.2f} GiB")
    ax.axvline(budget_gib, color="black", linestyle="--", label=f"budget {budget_gib:.2f} GiB")
    ax.set_yticks([])
    ax.set_xlabel("GiB")
    ax.set_title("Peak memory against the slice")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, fontsize=8, frameon=False)
    return _png(fig)


def _table(rows: dict) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in rows.items()
    )
    return f"<table>{cells}</table>"


def memory_label(device: dict) -> str:
    if device.get("device") == "cpu":
        return "host memory"
    if device.get("slice_cap_gib"):
        return "emulated slice"
    return "MIG slice" if device.get("is_mig") else "device"


def render_html(verdict: Verdict, losses: list[float], device: dict, claim: dict) -> str:
    f = verdict.figures
    status = "PASS" if verdict.passed else "FAIL"
    status_class = "ok" if verdict.passed else "bad"
    checks = "".join(
        f"<li class='{'ok' if c.passed else 'bad'}'><b>{html.escape(c.name)}</b>: "
        f"{html.escape(c.detail)}</li>"
        for c in verdict.checks
    )
    mem = memory_figure(f["peak_mem_gib"], f["slice_total_mem_gib"], f["memory_budget_gib"],
                        memory_label(device))
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
<h2>Loss</h2><img alt="loss curve" src="{loss_figure(losses)}">
<h2>Memory</h2><img alt="peak memory against slice memory" src="{mem}">
<h2>Device</h2>{_table({k: v for k, v in device.items() if k != "nvidia_smi"})}
<pre>{html.escape(device.get("nvidia_smi") or "nvidia-smi: not present")}</pre>
<h2>Claim</h2>{_table(claim)}
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
        f"| {memory_label(device)} | {f['slice_total_mem_gib']:.2f} GiB |",
        f"| peak memory | {f['peak_mem_gib']:.2f} GiB |",
        f"| loss | {f['initial_loss']:.3f} → {f['final_loss']:.3f} ({f['loss_drop']:.1%}) |",
        *(f"| {k} | {v} |" for k, v in claim.items()),
        "",
    ]
    return "\n".join(lines)
