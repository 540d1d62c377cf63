"""Compare: the runs of a sweep side by side, and the best adapter as a Model."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Artifact, Input, Markdown, Model, Output

from draslice.components.image import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def compare(
    configs: list,
    adapters: Input[list[Model]],
    train_logs: Input[list[Artifact]],
    passed: list[bool],
    verdicts: list[str],
    best_adapter: Output[Model],
    report: Output[HTML],
    summary: Output[Markdown],
) -> NamedTuple("CompareOutputs", best=str, verdict=str, passed=bool):
    """Writes a table and a plot of each run's eval loss and tokens/s, and copies the best
    run's adapter to ``best_adapter``. Never fails on a sweep where no run passed (the report
    must still reach the UI): the pipeline's gate does that.

    Runs on the CPU without a claim: it reads files.

    Args:
        configs: The planned runs (the sweep's plan step), in iteration order.
        adapters: Each run's adapter, collected in iteration order.
        train_logs: Each run's per-step JSON-lines metrics, in iteration order.
        passed: Each run's verdict (validate), in iteration order.
        verdicts: Each run's verdict text, in iteration order.
        best_adapter: The best run's adapter folder (adapter, run file, merged/ if any).
        report: HTML: the table and the figure.
        summary: Markdown: the table and each run's verdict.

    Returns:
        best: Name of the best run.
        verdict: One line: which run is best and why, or that none passed.
        passed: Whether the best run passed its verdict.
    """
    import shutil
    from collections import namedtuple

    from draslice.sweep import compare as cmp

    runs = cmp.read_runs(configs, [a.path for a in adapters], [t.path for t in train_logs],
                         passed, verdicts)
    best, ok = cmp.best_run(runs)
    shutil.copytree(best.adapter_dir, best_adapter.path, dirs_exist_ok=True)
    best_adapter.metadata.update({"framework": "peft", "sweep_run": best.name,
                                  **{k: best.knobs[k] for k in cmp.varied_knobs(runs)}})
    with open(report.path, "w") as f:
        f.write(cmp.render_html(runs, best, ok))
    text = cmp.render_markdown(runs, best, ok)
    with open(summary.path, "w") as f:
        f.write(text)
    print(text)
    line = cmp.headline(runs, best, ok)
    return namedtuple("CompareOutputs", ["best", "verdict", "passed"])(best.name, line, ok)
