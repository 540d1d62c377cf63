"""What a sweep runs and how its runs compare: pure Python over the knobs (trainer/config.py),
no kfp.

Below both of its users: the sweep pipeline's tasks (components/sweep_plan and
components/compare run it in their pods, where kfp.dsl is the runtime subset and no pipeline
module can be loaded) and ``draslice run --sweep``, which checks a sweep file before kfp.local
starts. The sweep pipeline itself is pipelines/sweep/pipeline.py.
"""
