from draslice.components.gate.component import gate

__all__ = ["gate"]
