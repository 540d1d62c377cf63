"""Pipelines, the claim binding, and the compiled variants users upload."""
