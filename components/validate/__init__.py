from draslice.components.validate.component import validate

__all__ = ["validate"]
