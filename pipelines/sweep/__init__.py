"""The sweep pipeline (pipeline.py) and ``draslice run --sweep`` (local.py). The plan of its
runs and their comparison, which its tasks run in their pods, are ``draslice.sweep``.

Nothing is imported here: importing the pipeline needs kfp.
"""
