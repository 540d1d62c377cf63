"""Fixes for two kfp.local (2.17.3) flaws that ``draslice run`` would hit; local runs only.

1. ``kfp.local`` evaluates a ``dsl.If`` condition on a NamedTuple output
   (``pipelinechannel--preflight-decision``) as if it were a pipeline input, fails to find it,
   and silently skips the whole branch. Output names are Python identifiers, so the text after
   the last ``-`` is the output key and the rest is the task name: look that up first, then
   fall back to kfp's own resolution. Compiled pipelines are not affected.
2. Its subprocess runner starts a task as a plain child (``sh``, which forks the task's
   python): a runner killed with SIGKILL leaves the task running. Each task starts under
   :mod:`~draslice.local.task_guard` instead, which dies with the runner and takes the
   task's processes with it.
"""

from __future__ import annotations

from typing import Any

from kfp.local import subprocess_task_handler as _sth
from kfp.local.orchestrator import enhanced_dag_orchestrator as _edo

from draslice.local import task_guard

_original = _edo.ConditionEvaluator._resolve_pipeline_channel
_run_local_subprocess = _sth.run_local_subprocess


def _resolve(channel_ref: str, io_store: Any) -> Any:
    ref = channel_ref.removeprefix("pipelinechannel--")
    task, sep, key = ref.rpartition("-")
    if sep and task and key != "Output":
        try:
            return io_store.get_task_output(task, key)
        except (KeyError, ValueError):
            pass
    return _original(channel_ref, io_store)


def _guarded(full_command: list[str], env_vars: dict[str, str] | None = None) -> int:
    """kfp.local's own runner (it streams the task's output), on the guarded command."""
    return _run_local_subprocess(task_guard.command(full_command), env_vars)


def install() -> None:
    """Idempotent: patch the condition evaluator (kfp calls the method on the class, so the
    plain function is what it gets back) and the subprocess runner (looked up in its module
    at each call) once per process."""
    if _edo.ConditionEvaluator._resolve_pipeline_channel is not _resolve:
        _edo.ConditionEvaluator._resolve_pipeline_channel = staticmethod(_resolve)
    _sth.run_local_subprocess = _guarded
