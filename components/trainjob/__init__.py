from draslice.components.trainjob.component import trainjob

__all__ = ["trainjob"]
