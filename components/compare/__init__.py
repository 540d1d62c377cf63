from draslice.components.compare.component import compare

__all__ = ["compare"]
