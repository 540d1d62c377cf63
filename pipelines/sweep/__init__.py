"""The sweep pipeline (pipeline.py) and what its components run in their pods: the plan of its
runs (plan.py) and their comparison (compare.py).

Nothing is imported here: the components import plan and compare inside a task pod, where
kfp.dsl is the runtime subset and the pipeline module cannot be loaded.
"""
