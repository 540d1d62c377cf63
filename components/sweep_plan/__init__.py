from draslice.components.sweep_plan.component import sweep_plan

__all__ = ["sweep_plan"]
