from draslice.components.sft.component import sft

__all__ = ["sft"]
