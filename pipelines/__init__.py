"""Pipelines (one folder each: ``<name>/pipeline.py``), the steps they share, the claim
binding, and the compiled variants users upload."""
