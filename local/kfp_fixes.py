"""A fix for one kfp.local (2.17.3) bug that ``draslice run`` would hit; local runs only.

``kfp.local`` evaluates a ``dsl.If`` condition on a NamedTuple output
(``pipelinechannel--preflight-decision``) as if it were a pipeline input, fails to find it,
and silently skips the whole branch. Output names are Python identifiers, so the text after
the last ``-`` is the output key and the rest is the task name: look that up first, then
fall back to kfp's own resolution. Compiled pipelines are not affected.
"""

from __future__ import annotations

from typing import Any

from kfp.local.orchestrator import enhanced_dag_orchestrator as _edo

_original = _edo.ConditionEvaluator._resolve_pipeline_channel


def _resolve(channel_ref: str, io_store: Any) -> Any:
    ref = channel_ref.removeprefix("pipelinechannel--")
    task, sep, key = ref.rpartition("-")
    if sep and task and key != "Output":
        try:
            return io_store.get_task_output(task, key)
        except (KeyError, ValueError):
            pass
    return _original(channel_ref, io_store)


def install() -> None:
    """Idempotent: patch the condition evaluator once per process (kfp calls the method on
    the class, so the plain function is what it gets back)."""
    if _edo.ConditionEvaluator._resolve_pipeline_channel is not _resolve:
        _edo.ConditionEvaluator._resolve_pipeline_channel = staticmethod(_resolve)
