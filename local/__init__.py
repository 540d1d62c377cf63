"""Pipelines run on this machine with ``kfp.local`` (``draslice run``, ``draslice run --sweep``),
as the KFP SDK's own ``kfp.local`` is apart from its DSL.

- ``run.py``: one run of a pipeline in a run folder (``draslice run``: the demo pipeline), and
  the kfp.local session every local run shares;
- ``run_console.py``: what the console shows while kfp.local runs, and the full log it keeps;
- ``kfp_fixes.py``: a fix for a kfp.local bug local runs would hit;
- ``sweep.py``: ``draslice run --sweep FILE``, the sweep pipeline locally.

Above ``pipelines`` (it runs them), below ``cli``. Nothing is imported here: kfp.local loads
only when a run starts.
"""
