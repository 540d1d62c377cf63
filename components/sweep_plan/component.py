"""Sweep plan: check a sweep's runs and complete each from a preset, before any GPU task."""

from kfp import dsl

from draslice.components.image import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def sweep_plan(configs: list, preset: str) -> list:
    """Checks every run's knob values against their declared ranges and returns the runs,
    each with every knob (the preset's value where the run sets none) and a unique name.

    A run parameter typed into the KFP UI reaches no check before this task: it fails here,
    naming the run and the knob, before a slice is claimed.

    Args:
        configs: The runs: a list of mappings of knob names to values, each with an
            optional ``name``.
        preset: The values each run starts from: ``finetune`` (a model and data on the
            volume) or ``demo`` (the built-in model and data).

    Returns:
        The completed runs, in order.
    """
    from draslice.sweep.plan import plan_runs

    runs = plan_runs(configs, preset)
    for run, given in zip(runs, configs, strict=True):
        print(f"{run['name']}: {given}")
    return runs
