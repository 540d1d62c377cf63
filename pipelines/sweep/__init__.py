"""The sweep pipeline (pipeline.py). The plan of its runs and their comparison, which its tasks
run in their pods, are ``draslice.sweep``; ``draslice run --sweep`` is ``draslice.local.sweep``.

Nothing is imported here: importing the pipeline needs kfp.
"""
