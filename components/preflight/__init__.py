from draslice.components.preflight.component import preflight

__all__ = ["preflight"]
