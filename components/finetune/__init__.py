from draslice.components.finetune.component import finetune

__all__ = ["finetune"]
