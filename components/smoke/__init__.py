from draslice.components.smoke.component import smoke

__all__ = ["smoke"]
